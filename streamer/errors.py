"""Errors the streamer raises on purpose; the gRPC layer maps each class to one status code."""

from __future__ import annotations

from inferix.errors import InferixError


class StreamerError(InferixError):
    """Base class: the message says what was wrong and what to do about it."""


class FrameRejected(StreamerError):
    """A pushed frame is malformed or out of order; the session keeps every frame received so far."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field  # the VideoFrame field at fault; also the `reason` label of the rejected-frames metric


class StreamStartsMidway(StreamerError):
    """The first frame this process sees of a session is past where it can go on (the streamer
    restarted): frame 0, or the first frame after its recording journal's. The sender re-sends from
    there (`VideoFrame.backfill`; `GetStreamInfo.frames` says where)."""


class FramesMissing(StreamerError):
    """FinishStream names more frames than the streamer holds (it restarted and kept its durable ones):
    the sender re-sends from `GetStreamInfo.frames`, then finishes again."""


class SessionNotFound(StreamerError):
    """No frame was ever accepted for this session id."""


class SessionFinished(StreamerError):
    """A new frame arrived after FinishStream; re-sent (duplicate) frames are still accepted."""


class RecordingNotReady(StreamerError):
    """The MP4 is only complete once FinishStream returned."""


class EncoderFailed(StreamerError):
    """The session's encoder or recorder broke; the session cannot continue."""


class ShuttingDown(StreamerError):
    """The streamer drains (SIGTERM): its open sessions' recordings are being closed unfinished, so it
    takes no more frames or finishes; the sender tries again and the next streamer gets the video."""
