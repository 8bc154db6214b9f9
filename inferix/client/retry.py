"""Riding out a server that restarts: one retry clock for every SDK call, stream and download.

A scheduler or streamer that restarts (a crash restarted by `inferix serve`, a rolling update)
refuses connections for a few seconds. Every SDK call retries then, with a doubling delay, for at
most `ReconnectPolicy.reconnect_s` without progress, and says once per outage that it is waiting
(`on_wait`: the CLI prints to stderr, the SDK logs a warning by default).

What is retried, and why it cannot duplicate anything:
  - reads (GetSession, ListSessions, downloads, watching events) and CancelSession are idempotent:
    any UNAVAILABLE / dropped connection is retried;
  - CreateSession has no idempotency key in the API, so it is retried only when the call certainly
    never reached a server: gRPC says "failed to connect" (refused, unresolvable) — no connection, no
    request sent. A connection lost mid-call ("Socket closed") may have created the session: that
    error is raised, never retried. (The channel's own gRPC retry policy leaves CreateSession out
    for the same reason, see `inferix.client.channel`.)
A misconfiguration (`TlsError`) or any answer from the server is not a restart and is raised at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import grpc

from inferix.client.recordings import RecordingError
from inferix.client.tls import TlsError

log = logging.getLogger("inferix.client")

T = TypeVar("T")

DEFAULT_RETRY_S = 30.0  # how long a call waits for a restarting server (the CLI's --retry-s)
# gRPC's words for a call that never left the client: no connection could be made to send it on.
_NOT_CONNECTED = ("failed to connect", "dns resolution failed")


@dataclass
class ReconnectPolicy:
    """How long to keep retrying a server that is away, without any progress (0 = never retry)."""

    reconnect_s: float = 120.0
    initial_delay_s: float = 0.2
    max_delay_s: float = 2.0


def _code(error: BaseException) -> grpc.StatusCode | None:
    code = getattr(error, "code", None)  # a sync error is a grpc.Call, an asyncio one an AioRpcError
    return code() if callable(code) else None


def never_sent(error: BaseException) -> bool:
    """True when the gRPC call certainly did not reach a server (no connection was made)."""
    if _code(error) != grpc.StatusCode.UNAVAILABLE:
        return False
    details = getattr(error, "details", None)
    text = (details() if callable(details) else "") or ""
    return any(words in text.lower() for words in _NOT_CONNECTED)


def server_away(error: BaseException, idempotent: bool, codes: frozenset[grpc.StatusCode]) -> bool:
    """Whether `error` looks like a restarting server that is worth waiting for."""
    if isinstance(error, TlsError):
        return False  # a misconfiguration: retrying cannot help
    if isinstance(error, RecordingError):
        return error.server_away
    if not isinstance(error, grpc.RpcError):
        return False
    return never_sent(error) or (idempotent and _code(error) in codes)


@dataclass
class Waiting:
    """The retry clock of one call or stream: bounded time without progress, doubling delays, and one
    notice per outage naming `what` is awaited."""

    what: str
    policy: ReconnectPolicy = field(default_factory=ReconnectPolicy)
    on_wait: Callable[[str], None] | None = None
    _failing_since: float | None = None
    _delay: float = 0.0

    def progress(self) -> None:
        """The server answered: the next failure starts a new outage (and a new notice)."""
        self._failing_since = None

    def retry_after(self, error: BaseException) -> float | None:
        """Seconds to wait before trying again after `error` (already judged a restart), or None to give up."""
        if self.policy.reconnect_s <= 0:
            return None
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
            self._delay = self.policy.initial_delay_s
            notice = (
                f"{self.what} is not answering ({_reason(error)}); retrying for up to {self.policy.reconnect_s:g} s"
            )
            (self.on_wait or log.warning)(notice)
            return self._delay
        if now - self._failing_since > self.policy.reconnect_s:
            return None
        self._delay = min(2 * self._delay, self.policy.max_delay_s)
        return self._delay


def _reason(error: BaseException) -> str:
    code = _code(error)
    return code.name if code is not None else str(error)


UNAVAILABLE = frozenset({grpc.StatusCode.UNAVAILABLE})


def retry_call(
    call: Callable[[], T], waiting: Waiting, *, idempotent: bool, codes: frozenset[grpc.StatusCode] = UNAVAILABLE
) -> T:
    """`call()`, again after a delay while the server is away (the module doc says what is retried)."""
    while True:
        try:
            result = call()
        except Exception as exc:
            delay = waiting.retry_after(exc) if server_away(exc, idempotent, codes) else None
            if delay is None:
                raise
            time.sleep(delay)
        else:
            waiting.progress()
            return result


async def retry_call_async(
    call: Callable[[], Awaitable[T]],
    waiting: Waiting,
    *,
    idempotent: bool,
    codes: frozenset[grpc.StatusCode] = UNAVAILABLE,
) -> T:
    """`retry_call` for coroutines."""
    while True:
        try:
            result = await call()
        except Exception as exc:
            delay = waiting.retry_after(exc) if server_away(exc, idempotent, codes) else None
            if delay is None:
                raise
            await asyncio.sleep(delay)
        else:
            waiting.progress()
            return result
