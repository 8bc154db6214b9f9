"""Test media: a frame pattern that compresses well, frame requests, and ffprobe / PyAV readers."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np

from inferix.api.v1 import streamer_pb2


def pattern(index: int, width: int, height: int) -> np.ndarray:
    """A smooth colour field that drifts with the frame index: easy for H.264, distinct per frame."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    phase = index / 24
    red = 128 + 90 * np.sin(2 * np.pi * (x / width + phase))
    green = 128 + 90 * np.cos(2 * np.pi * (y / height - phase))
    blue = 128 + 60 * np.sin(2 * np.pi * ((x + y) / (width + height) + 2 * phase))
    return np.stack([red, green, blue], axis=-1).round().astype(np.uint8)


@dataclass(frozen=True)
class Video:
    """What a session looks like; `blocks` are the frame counts of its blocks, as a worker would push them."""

    session_id: str
    width: int
    height: int
    fps: float
    blocks: tuple[int, ...]

    @property
    def frames(self) -> int:
        return sum(self.blocks)

    def block_range(self, block: int) -> range:
        start = sum(self.blocks[:block])
        return range(start, start + self.blocks[block])

    def block_of(self, index: int) -> int:
        """The block a frame belongs to (the last block for indices past the end)."""
        return next((b for b in range(len(self.blocks)) if index in self.block_range(b)), len(self.blocks) - 1)

    def frame(self, index: int, **overrides: object) -> streamer_pb2.VideoFrame:
        """The frame a worker would push; `overrides` replace fields to make it bad."""
        fields: dict[str, object] = {
            "session_id": self.session_id,
            "block_index": self.block_of(index),
            "frame_index": index,
            "width": self.width,
            "height": self.height,
            "format": streamer_pb2.PIXEL_FORMAT_RGB24,
            "data": pattern(index, self.width, self.height).tobytes(),
            "fps": self.fps,
        }
        fields.update(overrides)
        return streamer_pb2.VideoFrame(**fields)  # type: ignore[arg-type]

    def requests(self, indices: range | list[int]) -> Iterator[streamer_pb2.PushFramesRequest]:
        for index in indices:
            yield streamer_pb2.PushFramesRequest(frame=self.frame(index))

    def block(self, block: int) -> Iterator[streamer_pb2.PushFramesRequest]:
        return self.requests(self.block_range(block))


def ffprobe_path() -> str:
    path = shutil.which("ffprobe")
    if path is None:
        raise RuntimeError(
            "ffprobe is not installed; the streamer tests check recordings with the real tool. "
            "Install it with `apt-get install -y ffmpeg` (or `make system-deps`)."
        )
    return path


def ffprobe(path: Path) -> dict[str, str]:
    """The video stream of `path` as ffprobe sees it, frames counted by decoding."""
    out = subprocess.run(
        [
            ffprobe_path(),
            "-v",
            "error",
            "-select_streams",
            "v:0",
            "-count_frames",
            "-show_entries",
            "stream=codec_name,profile,width,height,pix_fmt,r_frame_rate,avg_frame_rate,nb_read_frames",
            "-of",
            "json",
            str(path),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    )
    streams = json.loads(out.stdout)["streams"]
    assert len(streams) == 1, out.stdout
    return {key: str(value) for key, value in streams[0].items()}


def decode(path: Path) -> list[np.ndarray]:
    """Every frame of the first video stream, as RGB24 arrays."""
    with av.open(str(path)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


def mean_abs_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())
