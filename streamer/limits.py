"""Per-client limits of the streamer's HTTP server: body size, read time, and request rates.

A viewer token is the unit of trust on the HTTP side (one per session link), so rates are counted per
(endpoint kind, session, token): a page that floods commands or WHEP offers is refused with 429 while
other viewers and the session itself carry on. The scheduler keeps its own per-session command limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

COMMANDS = "commands"
OFFERS = "offers"
_MAX_BUCKETS = 4096  # above this, full (idle) buckets are dropped: memory stays bounded under churn


@dataclass(frozen=True)
class HttpLimits:
    """The HTTP server's limits (flags --max-body-bytes, --body-timeout-s, --commands-per-s, --offers-per-s,
    --idle-timeout-s)."""

    max_body_bytes: int = 64 * 1024  # an SDP offer is a few KiB; a command body far less
    body_timeout_s: float = 10.0  # to send a request body, so a trickling client cannot hold a handler
    commands_per_s: float = 40.0  # per session and token, bursts as many: twice what the page sends at most
    offers_per_s: float = 2.0  # well-formed WHEP offers per session and token: each starts a WebRTC peer
    # A connection without a whole request header this long after it opened, or after its last answer,
    # is closed: headers sent a byte at a time (slowloris) or idle keep-alives do not hold sockets.
    idle_timeout_s: float = 15.0

    def rate(self, kind: str) -> float:
        return self.commands_per_s if kind == COMMANDS else self.offers_per_s

    def flag(self, kind: str) -> str:
        return "--commands-per-s" if kind == COMMANDS else "--offers-per-s"


class RateLimiter:
    """Token buckets keyed by (kind, session, token): `rate` per second, holding at most max(1, rate)."""

    def __init__(self, limits: HttpLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._buckets: dict[tuple[str, str, str], tuple[float, float]] = {}  # key -> (tokens, at)

    def allow(self, kind: str, session_id: str, token: str) -> bool:
        rate = self.limits.rate(kind)
        capacity = max(1.0, rate)
        now = self._clock()
        key = (kind, session_id, token)
        tokens, at = self._buckets.get(key, (capacity, now))
        tokens = min(capacity, tokens + (now - at) * rate)
        allowed = tokens >= 1.0
        self._buckets[key] = (tokens - 1.0 if allowed else tokens, now)
        if len(self._buckets) > _MAX_BUCKETS:
            self._prune(now)
        return allowed

    def _prune(self, now: float) -> None:
        for key, (tokens, at) in list(self._buckets.items()):
            rate = self.limits.rate(key[0])
            if tokens + (now - at) * rate >= max(1.0, rate):
                del self._buckets[key]
