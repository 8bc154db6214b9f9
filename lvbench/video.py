"""Decoding videos into RGB frames for the metrics (PyAV, which the product already uses)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np


class VideoReadError(ValueError):
    """A video file is missing, unreadable, or has no frames."""


@dataclass(frozen=True)
class DecodedVideo:
    """All frames of one video as uint8 RGB [T, H, W, 3] (a minute at 832x480 is about 1.2 GB)."""

    path: Path
    frames: np.ndarray
    fps: float

    @property
    def num_frames(self) -> int:
        return int(self.frames.shape[0])


def read_video(path: str | Path) -> DecodedVideo:
    path = Path(path)
    if not path.is_file():
        raise VideoReadError(f"{path}: no such file")
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise VideoReadError(f"{path}: no video stream")
            stream = container.streams.video[0]
            fps = float(stream.average_rate) if stream.average_rate else 0.0
            frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]
    except av.FFmpegError as exc:
        raise VideoReadError(f"{path}: cannot decode: {exc}") from exc
    if not frames:
        raise VideoReadError(f"{path}: the video has no frames")
    return DecodedVideo(path, np.stack(frames), fps)
