"""Calls to a service that may be restarting: retried while it is away."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

log = logging.getLogger("inferix.worker")
AWAY_RETRY_S = 60.0  # how long frames and commits wait for a restarting streamer / kvcache_svc
AWAY = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


T = TypeVar("T")


async def while_away(what: str, attempt: Callable[[], Awaitable[T]]) -> T:
    """Run `attempt` until it succeeds, retrying with backoff for `AWAY_RETRY_S` while the other
    service is away (UNAVAILABLE, DEADLINE_EXCEEDED: restarting; CANCELLED: its server stopped with
    our call still in flight, as grpc.aio does when a drain's grace ends); other errors are raised at
    once. (A call this task cancels raises CancelledError, not a CANCELLED status.)"""
    deadline = time.monotonic() + AWAY_RETRY_S
    delay = 0.2
    while True:
        try:
            return await attempt()
        except grpc.aio.AioRpcError as exc:
            away = exc.code() in AWAY
            if not away or time.monotonic() > deadline:
                raise
            log.warning("%s %s; retrying", what, exc.code().name)
            await asyncio.sleep(delay)
            delay = min(2 * delay, 1.0)  # a restarted service is noticed within a second
