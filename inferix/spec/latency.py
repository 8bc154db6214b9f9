"""A session's latency mode: played (`interactive`) or watched (`smooth`).

The mode is part of the session's spec (`SessionSpec.latency`), so a session recovered on another
worker or resumed by a restarted scheduler keeps it. It changes when frames are made and released,
never which frames: a session's pixels are the same in either mode.

- `smooth` (the default): blocks are made up to the server's lookahead ahead of playback, the
  streamer plays them after its fixed jitter buffer, and a freeze stays in the live timeline.
- `interactive`: each block is dispatched one measured generation time before it is due on screen
  (the smallest lead that is still on time), the streamer's jitter buffer follows the measured
  arrival jitter and gives held time back once blocks are on time again, and the viewer page asks
  the browser for no playout delay of its own.
"""

from __future__ import annotations

from enum import StrEnum

from inferix.api.v1 import common_pb2
from inferix.errors import UserError


class LatencyMode(StrEnum):
    SMOOTH = "smooth"
    INTERACTIVE = "interactive"

    @classmethod
    def from_proto(cls, value: int) -> LatencyMode:
        """The mode of a `LatencyMode` enum value (unspecified is smooth)."""
        return cls.INTERACTIVE if value == common_pb2.LATENCY_MODE_INTERACTIVE else cls.SMOOTH

    @classmethod
    def parse(cls, name: str) -> LatencyMode:
        """The mode named `name` (`UserError` naming the choices otherwise)."""
        try:
            return cls(name.lower())
        except ValueError:
            raise UserError(f"latency must be one of {', '.join(m.value for m in cls)}, got {name!r}") from None

    def to_proto(self) -> common_pb2.LatencyMode:
        if self is LatencyMode.INTERACTIVE:
            return common_pb2.LATENCY_MODE_INTERACTIVE
        return common_pb2.LATENCY_MODE_SMOOTH


LATENCY_CHOICES = tuple(mode.value for mode in LatencyMode)
