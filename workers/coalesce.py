"""Calls to one service made while another is in flight, sent together as one batched call (group commit).

A batched forward finishes the blocks of all its sessions at once, so their frame pushes and commits
are made together. As one unary call each, they cost the event loop a call apiece, and the engine
thread waits for the GIL the loop holds meanwhile (bench/RESULTS.md, issue 38). Here a call goes at
once when none is in flight, so a lone session pays nothing more; the calls made while it is in flight
wait for its answer and then go together in one call. Each caller still gets its own item's outcome,
a result or the error its unary call would have raised (`inferix.item_status`), so retries stay per
item. A service of a release before the batched call (UNIMPLEMENTED) gets unary calls from then on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import grpc

from workers import metrics

log = logging.getLogger("inferix.worker")
Item = TypeVar("Item")
Result = TypeVar("Result")
MAX_ITEMS = 64  # per batched call; a worker's batch is smaller


class Coalescer(Generic[Item, Result]):
    """`call(item)`: sent at once when no call is in flight, else with the other items waiting, as soon
    as the call in flight is answered, in calls of at most `max_bytes` (by `size`) and `MAX_ITEMS`
    items (`call`: the batched call's name, for the metric). An item whose caller stops waiting may
    still go (the calls coalesced here are idempotent)."""

    def __init__(
        self,
        service: str,
        call: str,
        batched: Callable[[list[Item]], Awaitable[list[Result | grpc.aio.AioRpcError]]],
        single: Callable[[Item], Awaitable[Result]],
        size: Callable[[Item], int],
        max_bytes: int,
    ) -> None:
        self.service = service
        self.unbatched = False  # the service has no batched call: one unary call per item
        self._items = metrics.COALESCED_ITEMS.labels(call)
        self._batched = batched
        self._single = single
        self._size = size
        self._max_bytes = max_bytes
        self._pending: list[tuple[Item, asyncio.Future[Result]]] = []
        self._in_flight = False
        self._draining: set[asyncio.Task[None]] = set()

    async def call(self, item: Item) -> Result:
        if self.unbatched:
            return await self._single(item)
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._in_flight:
            return await future
        self._in_flight = True
        try:
            await self._send_pending()  # this item alone, from this caller's task: no task or turn more
        finally:
            self._then_the_waiting()
        return await future

    def _then_the_waiting(self) -> None:
        """After a call: the items that came meanwhile go now, in a task (their callers wait on futures)."""
        if not self._pending:
            self._in_flight = False
            return
        task = asyncio.get_running_loop().create_task(self._drain())
        self._draining.add(task)
        task.add_done_callback(self._draining.discard)

    async def _drain(self) -> None:
        try:
            while self._pending:
                await self._send_pending()
        finally:
            self._in_flight = False
            for _, future in self._pending:  # cancelled (the worker stops): nobody sends them now
                future.cancel()
            self._pending.clear()

    async def _send_pending(self) -> None:
        """The items waiting, in batched calls of at most `max_bytes` and `MAX_ITEMS` items, together."""
        pending, self._pending = self._pending, []
        chunks: list[list[tuple[Item, asyncio.Future[Result]]]] = [[]]
        size = 0
        for item, future in pending:
            item_size = self._size(item)
            if chunks[-1] and (size + item_size > self._max_bytes or len(chunks[-1]) == MAX_ITEMS):
                chunks.append([])
                size = 0
            chunks[-1].append((item, future))
            size += item_size
        if len(chunks) == 1:  # as a rule: no task more for it
            await self._call(chunks[0])
        else:
            await asyncio.gather(*(self._call(chunk) for chunk in chunks))

    async def _call(self, chunk: list[tuple[Item, asyncio.Future[Result]]]) -> None:
        items = [item for item, _ in chunk]
        outcomes: list[Result | BaseException]
        try:
            if self.unbatched:
                outcomes = await asyncio.gather(*(self._single(item) for item in items), return_exceptions=True)
            else:
                self._items.observe(len(items))
                outcomes = await self._call_batched(items)
        except asyncio.CancelledError:  # the caller or the worker stops
            for _, future in chunk:
                future.cancel()
            raise
        for (_, future), outcome in zip(chunk, outcomes, strict=True):
            if future.done():  # its caller stopped waiting
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    async def _call_batched(self, items: list[Item]) -> list[Result | BaseException]:
        try:
            outcomes: list[Result | BaseException] = list(await self._batched(items))
            if len(outcomes) != len(items):
                raise RuntimeError(f"{self.service} answered {len(outcomes)} items of a batch of {len(items)}")
            return outcomes
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                return [exc] * len(items)
            if not self.unbatched:
                log.info("%s has no batched call (an earlier release): one call per item", self.service)
            self.unbatched = True
            return await asyncio.gather(*(self._single(item) for item in items), return_exceptions=True)
        except Exception as exc:  # noqa: BLE001 - every caller of the batch gets it
            return [exc] * len(items)
