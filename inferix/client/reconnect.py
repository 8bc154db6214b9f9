"""Event streams that survive a scheduler restart: reconnect and continue after the last block seen.

A scheduler that restarts (a rolling update, a crash) closes every `Interact` stream. The SDK's
`events()` then re-attaches with `from_block` = the block after the last one it delivered, so the
caller sees every block exactly once; a state change the new scheduler repeats is not delivered
twice. Only transport failures are retried, for at most `reconnect_s` without any progress.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import grpc

from inferix.client.tls import TlsError
from inferix.client.types import BlockDone, Event, StateChanged

# What a scheduler going away looks like to a stream (refused connection, reset, or cancelled at shutdown).
RECONNECTABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})


@dataclass
class ReconnectPolicy:
    """How long `events()` keeps re-attaching without receiving anything (0 = never re-attach)."""

    reconnect_s: float = 120.0
    initial_delay_s: float = 0.2
    max_delay_s: float = 2.0


@dataclass
class EventCursor:
    """Where a watcher is in a session's events, and whether to try again after a failure."""

    next_block: int
    policy: ReconnectPolicy = field(default_factory=ReconnectPolicy)
    _last_state: tuple[str, str] | None = None
    _failing_since: float | None = None
    _delay: float = 0.0

    def admit(self, event: Event) -> bool:
        """True when `event` is new to the caller (and records it); a progress resets the retry clock."""
        self._failing_since = None
        if isinstance(event, BlockDone):
            if event.block_index < self.next_block:
                return False
            self.next_block = event.block_index + 1
        elif isinstance(event, StateChanged):
            key = (event.state, event.reason)
            if key == self._last_state:
                return False
            self._last_state = key
        return True

    def retry_after(self, error: grpc.RpcError) -> float | None:
        """Seconds to wait before re-attaching after `error`, or None to give up (re-raise it)."""
        if isinstance(error, TlsError):
            return None  # a misconfiguration, not a restart: retrying cannot help
        code = error.code() if hasattr(error, "code") else None
        if code not in RECONNECTABLE or self.policy.reconnect_s <= 0:
            return None
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
            self._delay = self.policy.initial_delay_s
        elif now - self._failing_since > self.policy.reconnect_s:
            return None
        else:
            self._delay = min(2 * self._delay, self.policy.max_delay_s)
        return self._delay
