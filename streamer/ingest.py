"""Validation of pushed frames: the first frame fixes a session's format, later frames must match and be in order.

Ordering is what makes re-sends safe. A worker that recovers a session re-sends frames the
streamer may already hold; a frame whose index is below the next expected one is therefore a
duplicate (skipped, counted), never an error. A frame past the next expected index means frames
were lost, which the streamer must not paper over, so it is rejected. Checking does not modify the
state (`check`), recording does (`commit`): a frame counts as received only once it is queued for
the encoder, so a push cancelled halfway never leaves a hole behind the session's counter.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import Enum

from inferix.api.v1 import streamer_pb2
from streamer.errors import FrameRejected, SessionFinished, StreamStartsMidway
from streamer.packets import StreamFormat

# Session ids name files on disk (`<id>.mp4`), so they are restricted to a portable file-name alphabet.
_SESSION_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")


class Admission(Enum):
    """What to do with a frame that passed validation."""

    NEW = "new"  # the next frame of the session: encode it
    DUPLICATE = "duplicate"  # already received (re-sent after a recovery): skip it


def _format_name(value: int) -> str:
    try:
        return f"{streamer_pb2.PixelFormat.Name(value)} ({value})"
    except ValueError:
        return f"unknown value {value}"


def valid_session_id(session_id: str) -> bool:
    """Whether `session_id` can name a session (file names, RTMP stream keys, URL path segments)."""
    return _SESSION_ID.fullmatch(session_id) is not None


def _check_session_id(session_id: str) -> None:
    if not valid_session_id(session_id):
        raise FrameRejected(
            "session_id",
            f"frame.session_id must be 1-128 characters of [A-Za-z0-9._-] not starting with '.', got {session_id!r}",
        )


def _check_pixel_format(frame: streamer_pb2.VideoFrame) -> None:
    if frame.format != streamer_pb2.PIXEL_FORMAT_RGB24:
        raise FrameRejected(
            "format",
            f"frame.format must be PIXEL_FORMAT_RGB24 ({streamer_pb2.PIXEL_FORMAT_RGB24}), "
            f"got {_format_name(frame.format)}",
        )


def _check_data(frame: streamer_pb2.VideoFrame, fmt: StreamFormat) -> None:
    if len(frame.data) != fmt.frame_bytes:
        raise FrameRejected(
            "data",
            f"frame.data must hold width*height*3 = {fmt.frame_bytes} bytes (RGB24 {fmt.width}x{fmt.height}), "
            f"got {len(frame.data)}",
        )


def first_frame_format(frame: streamer_pb2.VideoFrame) -> StreamFormat:
    """Validate the frame that opens a session and return the format it fixes for the session."""
    _check_session_id(frame.session_id)
    _check_pixel_format(frame)
    for name, value in (("width", frame.width), ("height", frame.height)):
        if value <= 0 or value % 2:
            # H.264 in 4:2:0 subsamples chroma by two in both directions.
            raise FrameRejected(name, f"frame.{name} must be a positive even number (H.264 4:2:0), got {value}")
    if not (math.isfinite(frame.fps) and frame.fps > 0):
        raise FrameRejected("fps", f"frame.fps must be a positive frame rate, got {frame.fps:g}")
    fmt = StreamFormat(frame.width, frame.height, frame.fps)
    _check_data(frame, fmt)
    if frame.frame_index != 0:
        raise StreamStartsMidway(
            f"session {frame.session_id!r} has no frames in this streamer (did it restart?): send its video "
            f"from frame 0, got frame {frame.frame_index}"
        )
    return fmt


@dataclass
class IngestState:
    """Where one session's frame sequence stands: its format, how many frames arrived, whether it ended."""

    session_id: str
    format: StreamFormat
    next_index: int = 0
    finished: bool = False

    def check(self, frame: streamer_pb2.VideoFrame) -> Admission:
        """Validate `frame` against the session without changing it; raises `FrameRejected`/`SessionFinished`."""
        fmt = self.format
        _check_pixel_format(frame)
        for name, value, expected in (("width", frame.width, fmt.width), ("height", frame.height, fmt.height)):
            if value != expected:
                raise FrameRejected(
                    name, f"frame.{name} must be {expected} (set by the session's first frame), got {value}"
                )
        _check_data(frame, fmt)
        if not math.isclose(frame.fps, fmt.fps, rel_tol=1e-9):
            raise FrameRejected(
                "fps", f"frame.fps must be {fmt.fps:g} (set by the session's first frame), got {frame.fps:g}"
            )
        if frame.frame_index < self.next_index:
            return Admission.DUPLICATE
        if self.finished:
            raise SessionFinished(
                f"session {self.session_id!r} is finished with {self.next_index} frames; "
                f"frame {frame.frame_index} cannot be added (use a new session id)"
            )
        if frame.frame_index > self.next_index:
            raise FrameRejected(
                "frame_index",
                f"frame.frame_index must be {self.next_index} (the next frame of session {self.session_id!r}; "
                f"frames 0..{self.next_index - 1} are received), got {frame.frame_index}",
            )
        return Admission.NEW

    def commit(self) -> None:
        """Record that the next frame was accepted (queued for encoding)."""
        self.next_index += 1
