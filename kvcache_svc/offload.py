"""Which sessions' KV pages leave the GPU: the offload policy (pure, unit-tested).

Paused sessions go first: a paused session costs no device pages. Then, while the worker's
device pages are above the high watermark, the least recently used sessions (by the time of
their last block) are offloaded until usage would fall to the low watermark. The worker copies;
restoring happens on the session's next block (or earlier, when the scheduler prefetches it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Watermarks:
    """Fractions of a worker's device pages: offload above `high`, down to `low`."""

    high: float = 0.9
    low: float = 0.7

    def __post_init__(self) -> None:
        if not 0.0 < self.low <= self.high <= 1.0:
            raise ValueError(f"watermarks need 0 < low <= high <= 1, got low={self.low} high={self.high}")


@dataclass(frozen=True)
class SessionReport:
    session_id: str
    device_pages: int
    last_block_unix: float


def plan_offload(
    total_pages: int, used_pages: int, sessions: list[SessionReport], paused: set[str], marks: Watermarks
) -> list[str]:
    """Session ids to offload now, in order."""
    chosen = [s for s in sessions if s.session_id in paused and s.device_pages > 0]
    used = used_pages - sum(s.device_pages for s in chosen)
    if used > marks.high * total_pages:
        idle = sorted(
            (s for s in sessions if s.session_id not in paused and s.device_pages > 0),
            key=lambda s: (s.last_block_unix, s.session_id),
        )
        for session in idle:
            if used <= marks.low * total_pages:
                break
            chosen.append(session)
            used -= session.device_pages
    return [s.session_id for s in chosen]
