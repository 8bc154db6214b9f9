"""Writing H.264 MP4 files (PyAV): the one MP4 writer of Inferix.

`Mp4Writer` owns an MP4 file with one H.264 track, fed one of two ways:

- RGB frames, encoded by the writer itself (`write`): libx264, yuv420p, `crf`, preset veryfast, a
  constant frame rate. `inferix generate` (and the tests' sample videos).
- H.264 packets encoded elsewhere, muxed unchanged (`Mp4Writer.for_packets`, `write_packet`): the
  streamer's recording of a session, whose encoder also feeds the live outputs.

Optionally the file is written as `<name>.part` and renamed on close (`partial`), so a
complete-looking `.mp4` is always a finalized one, and the index is moved to the front on close
(`faststart`), so a browser can start playing a download before it has all of it.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from types import TracebackType
from typing import cast

import av
import numpy as np
from av.container import OutputContainer
from av.stream import Stream
from av.video.stream import VideoStream


class Mp4Writer:
    """An H.264 MP4 file being written, from uint8 RGB frames [T, H, W, 3] or from encoded packets.

    `Mp4Writer(path, width, height, fps, crf)` encodes frames given to `write` (its folder and
    encoder are made at once). `Mp4Writer.for_packets(...)` muxes the packets given to `write_packet`
    and opens its file with the first packet (a stream that never had one leaves no file). `close`
    (or leaving the `with` block) finalizes the file.
    """

    def __init__(
        self,
        path: str | Path,
        width: int,
        height: int,
        fps: int | Fraction,
        crf: int = 18,
        *,
        packets: bool = False,
        partial: bool = False,
        faststart: bool = False,
    ) -> None:
        if width % 2 or height % 2:
            raise ValueError(f"H.264 (yuv420p) needs even frame sizes, got {width}x{height}")
        self.path = Path(path)
        self.width, self.height = width, height
        self.rate = Fraction(fps)
        self._crf = None if packets else crf  # None: packets encoded elsewhere are muxed
        self._file = self.path.with_name(self.path.name + ".part") if partial else self.path
        self._options = {"movflags": "+faststart"} if faststart else {}
        self._container: OutputContainer | None = None
        self._stream: Stream | None = None
        self._closed = False
        self.frames = 0
        if not packets:
            self._open()

    @classmethod
    def for_packets(
        cls, path: str | Path, width: int, height: int, rate: Fraction, *, partial: bool = True, faststart: bool = True
    ) -> Mp4Writer:
        """A writer that muxes H.264 packets (Annex B, SPS/PPS in-band on keyframes) without re-encoding;
        packet timestamps are in ticks of 1 / `rate` (one tick per frame)."""
        return cls(path, width, height, rate, packets=True, partial=partial, faststart=faststart)

    def _open(self) -> tuple[OutputContainer, Stream]:
        self._file.parent.mkdir(parents=True, exist_ok=True)
        container = av.open(str(self._file), "w", format="mp4", options=self._options)
        stream: Stream
        if self._crf is not None:
            encoder = container.add_stream("libx264", rate=self.rate)
            encoder.width, encoder.height = self.width, self.height
            encoder.pix_fmt = "yuv420p"
            encoder.options = {"crf": str(self._crf), "preset": "veryfast"}
            stream = encoder
        else:
            # A stream without a codec context: PyAV takes the SPS/PPS (avcC) from the first keyframe.
            stream = container.add_mux_stream("h264", rate=self.rate, width=self.width, height=self.height)
            stream.time_base = 1 / self.rate
        self._container, self._stream = container, stream
        return container, stream

    def write(self, frames: np.ndarray) -> None:
        """Encode and mux uint8 RGB frames [T, H, W, 3]."""
        if self._crf is None:
            raise TypeError("this writer muxes encoded packets (Mp4Writer.for_packets): use write_packet")
        if frames.ndim != 4 or frames.shape[1:] != (self.height, self.width, 3) or frames.dtype != np.uint8:
            raise ValueError(
                f"frames must be uint8 [T, {self.height}, {self.width}, 3], got {frames.dtype} {list(frames.shape)}"
            )
        container, stream = self._opened()
        encoder = cast(VideoStream, stream)
        for rgb in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            container.mux(encoder.encode(frame))
            self.frames += 1

    def write_packet(self, data: bytes, pts: int, dts: int, duration: int, keyframe: bool) -> None:
        """Mux one encoded H.264 access unit as it is; timestamps in ticks of 1 / `rate`."""
        if self._crf is not None:
            raise TypeError("this writer encodes RGB frames: use write, or Mp4Writer.for_packets to mux packets")
        container, stream = self._opened()
        packet = av.Packet(data)
        packet.pts = pts
        packet.dts = dts
        packet.duration = duration
        packet.time_base = 1 / self.rate
        packet.is_keyframe = keyframe
        packet.stream = stream
        container.mux(packet)
        self.frames += 1

    def _opened(self) -> tuple[OutputContainer, Stream]:
        if self._closed:
            raise ValueError(f"{self.path} is closed")
        if self._container is None or self._stream is None:
            return self._open()
        return self._container, self._stream

    def close(self) -> None:
        """Flush the encoder (if any), finalize the file and, for a partial file, rename it into place.

        A packet writer that never got a packet writes nothing."""
        self._closed = True
        container, stream = self._container, self._stream
        if container is None or stream is None:
            return
        self._container = self._stream = None
        if self._crf is not None:
            container.mux(cast(VideoStream, stream).encode(None))
        container.close()
        if self._file != self.path:
            self._file.replace(self.path)

    def __enter__(self) -> Mp4Writer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
