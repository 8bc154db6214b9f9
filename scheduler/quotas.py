"""Per-key quotas: how many sessions a key may have open, how long each may be, how many blocks its
sessions may make per hour, and how many Interact streams it may hold and commands send on each.

Limits come with the keys (`scheduler.auth`: `sessions=8 blocks_per_session=20000
blocks_per_hour=100000` after a key's name; a `*` line sets the defaults of every key); 0 means
unlimited. A breach is refused with RESOURCE_EXHAUSTED naming the limit: at CreateSession for the
open-session and length limits, and for the hourly budget both at CreateSession and, for running
sessions, at each block (the session waits, nothing is lost, and its event stream says why).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields

HOUR_S = 3600.0


class QuotaExceeded(Exception):
    """A key's limit would be passed; the message names the limit and what to do."""


@dataclass(frozen=True)
class Quota:
    """One key's limits (0: unlimited)."""

    sessions: int = 16
    blocks_per_session: int = 0
    blocks_per_hour: int = 0
    # Interact streams of the key open at once, and commands per second on each (bursts of twice that).
    streams: int = 32
    commands_per_second: int = 50

    @classmethod
    def parse(cls, settings: list[str], base: Quota, where: str) -> Quota:
        """`name=N` settings over `base`; ValueError naming `where` and the setting when one is bad."""
        names = [f.name for f in fields(cls)]
        values = {name: getattr(base, name) for name in names}
        for setting in settings:
            name, _, number = setting.partition("=")
            if name not in names:
                raise ValueError(f"{where}: unknown quota {name!r} (quotas: {', '.join(names)})")
            if not number.isdigit():
                raise ValueError(f"{where}: {name} must be a whole number >= 0 (0: unlimited), got {number!r}")
            values[name] = int(number)
        return cls(**values)


# An open server (no keys): no session or block limits; streams and commands keep their defaults.
OPEN_SERVER = Quota(sessions=0)


@dataclass
class Quotas:
    """The quota of every principal and the blocks each made in the last hour."""

    limits: dict[str, Quota] = field(default_factory=dict)
    default: Quota = OPEN_SERVER
    clock: Callable[[], float] = time.monotonic
    _blocks: dict[str, deque[float]] = field(default_factory=dict)
    _streams: dict[str, int] = field(default_factory=dict)

    def of(self, principal: str) -> Quota:
        return self.limits.get(principal, self.default)

    def check_create(self, principal: str, open_sessions: int, num_blocks: int | None) -> None:
        """Whether `principal` may open one more session of `num_blocks` blocks (None: unbounded)."""
        quota = self.of(principal)
        if quota.sessions and open_sessions >= quota.sessions:
            raise QuotaExceeded(
                f"quota: key {principal!r} has {open_sessions} open sessions (limit sessions={quota.sessions}); "
                "end one (inferix session cancel ID) or ask the operator for a higher limit"
            )
        if quota.blocks_per_session and (num_blocks is None or num_blocks > quota.blocks_per_session):
            asked = "0 (unbounded)" if num_blocks is None else str(num_blocks)
            raise QuotaExceeded(
                f"quota: spec.num_blocks: {asked} is above the limit blocks_per_session={quota.blocks_per_session} "
                f"of key {principal!r}"
            )
        wait = self.wait_s(principal)
        if wait > 0:
            raise QuotaExceeded(self.hourly_message(principal, wait))

    def wait_s(self, principal: str) -> float:
        """Seconds until `principal` may make another block under its hourly budget (0: now)."""
        limit = self.of(principal).blocks_per_hour
        if not limit:
            return 0.0
        made = self._recent(principal)
        return 0.0 if len(made) < limit else max(0.0, made[0] + HOUR_S - self.clock())

    def hourly_message(self, principal: str, wait: float) -> str:
        limit = self.of(principal).blocks_per_hour
        return (
            f"quota: key {principal!r} made {limit} blocks in the last hour (limit blocks_per_hour={limit}); "
            f"the next block is allowed in {wait:.0f} s"
        )

    def charge_block(self, principal: str) -> None:
        """Count one block against `principal`'s hourly budget."""
        if self.of(principal).blocks_per_hour:
            self._recent(principal).append(self.clock())

    def refund_block(self, principal: str) -> None:
        """Take back the latest charge (its block was not made)."""
        made = self._blocks.get(principal)
        if made and self.of(principal).blocks_per_hour:
            made.pop()

    def open_stream(self, principal: str) -> None:
        """Count an Interact stream of `principal` (QuotaExceeded past its `streams`)."""
        limit = self.of(principal).streams
        if limit and self._streams.get(principal, 0) >= limit:
            raise QuotaExceeded(
                f"quota: key {principal!r} has {limit} Interact streams open (limit streams={limit}); "
                "close one (one stream per session is enough)"
            )
        self._streams[principal] = self._streams.get(principal, 0) + 1

    def close_stream(self, principal: str) -> None:
        self._streams[principal] = max(0, self._streams.get(principal, 0) - 1)

    def _recent(self, principal: str) -> deque[float]:
        made = self._blocks.setdefault(principal, deque())
        horizon = self.clock() - HOUR_S
        while made and made[0] <= horizon:
            made.popleft()
        return made
