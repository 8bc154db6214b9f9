"""Event streams that survive a scheduler restart: reconnect and continue after the last block seen.

A scheduler that restarts (a rolling update, a crash) closes every `Interact` stream. The SDK's
`events()` then re-attaches with `from_block` = the block after the last one it delivered, so the
caller sees every block exactly once; a state change the new scheduler repeats is not delivered
twice. Only transport failures are retried, for at most `reconnect_s` without any progress, on the
retry clock every SDK call uses (`inferix.client.retry`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from inferix.client.retry import ReconnectPolicy, Waiting, server_away
from inferix.client.types import BlockDone, Event, StateChanged

# What a scheduler going away looks like to a stream (refused connection, reset, or cancelled at shutdown).
RECONNECTABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})

__all__ = ["RECONNECTABLE", "EventCursor", "ReconnectPolicy"]


@dataclass
class EventCursor:
    """Where a watcher is in a session's events, and whether to try again after a failure."""

    next_block: int
    waiting: Waiting = field(default_factory=lambda: Waiting("the scheduler"))
    _last_state: tuple[str, str] | None = None

    def admit(self, event: Event) -> bool:
        """True when `event` is new to the caller (and records it); a progress resets the retry clock."""
        self.waiting.progress()
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
        """Seconds to wait before re-attaching after `error`, or None to give up (re-raise it).
        Watching is read-only: any dropped stream is retried."""
        if not server_away(error, idempotent=True, codes=RECONNECTABLE):
            return None
        return self.waiting.retry_after(error)
