"""Writing H.264 MP4 files from RGB frames (PyAV / libx264)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from types import TracebackType

import av
import numpy as np


class Mp4Writer:
    """Encode uint8 RGB frames [T, H, W, 3] into an H.264 MP4 at a constant frame rate."""

    def __init__(self, path: str | Path, width: int, height: int, fps: int, crf: int = 18) -> None:
        if width % 2 or height % 2:
            raise ValueError(f"H.264 (yuv420p) needs even frame sizes, got {width}x{height}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.width, self.height = width, height
        self._container = av.open(str(self.path), mode="w")
        stream = self._container.add_stream("libx264", rate=Fraction(fps, 1))
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": str(crf), "preset": "veryfast"}
        self._stream = stream
        self.frames = 0

    def write(self, frames: np.ndarray) -> None:
        if frames.ndim != 4 or frames.shape[1:] != (self.height, self.width, 3) or frames.dtype != np.uint8:
            raise ValueError(
                f"frames must be uint8 [T, {self.height}, {self.width}, 3], got {frames.dtype} {list(frames.shape)}"
            )
        for rgb in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            self._container.mux(self._stream.encode(frame))
            self.frames += 1

    def close(self) -> None:
        if self._container is not None:
            self._container.mux(self._stream.encode(None))
            self._container.close()
            self._container = None  # type: ignore[assignment]

    def __enter__(self) -> Mp4Writer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
