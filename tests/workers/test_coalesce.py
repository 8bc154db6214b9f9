"""The worker's coalesced calls: a call goes at once when none is in flight, the calls made meanwhile go
together in one batched call, and each caller gets its own item's outcome, as from a unary call."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from inferix.api.v1 import common_pb2
from inferix.item_status import item_error, item_status
from workers.coalesce import MAX_ITEMS, Coalescer


class Service:
    """A service's two calls for `Coalescer`: `batched` answers each item (an item "bad..." fails with
    INVALID_ARGUMENT, as a refused item of a batched call), `single` as the unary call; both record what they got."""

    def __init__(self, batched_error: grpc.StatusCode | None = None) -> None:
        self.batched_error = batched_error
        self.batches: list[list[str]] = []
        self.singles: list[str] = []

    def _status(self, item: str) -> common_pb2.ItemStatus:
        if item.startswith("bad"):
            return item_status(grpc.StatusCode.INVALID_ARGUMENT, f"{item} refused")
        return common_pb2.ItemStatus()

    async def batched(self, items: list[str]) -> list[int | grpc.aio.AioRpcError]:
        await asyncio.sleep(0)  # an answer comes in a later turn, as over the network
        if self.batched_error is not None:
            raise item_error(item_status(self.batched_error, "the whole call"), "Batched") or AssertionError
        self.batches.append(items)
        return [item_error(self._status(item), "Single") or len(item) for item in items]

    async def single(self, item: str) -> int:
        await asyncio.sleep(0)
        self.singles.append(item)
        error = item_error(self._status(item), "Single")
        if error is not None:
            raise error
        return len(item)

    def coalescer(self, max_bytes: int = 1000) -> Coalescer[str, int]:
        return Coalescer("the test service", "Batched", self.batched, self.single, len, max_bytes)


async def outcomes(coalescer: Coalescer[str, int], items: list[str]) -> list[int | grpc.StatusCode]:
    """Each item called from a task of its own, all in one turn of the event loop."""
    answers = await asyncio.gather(*(coalescer.call(item) for item in items), return_exceptions=True)
    return [a.code() if isinstance(a, grpc.aio.AioRpcError) else a for a in answers]  # type: ignore[misc]


def test_calls_made_while_one_is_in_flight_go_together_and_each_caller_gets_its_own_outcome() -> None:
    async def scenario() -> None:
        service = Service()
        coalescer = service.coalescer()
        assert await outcomes(coalescer, ["a", "bb", "bad", "dddd"]) == [1, 2, grpc.StatusCode.INVALID_ARGUMENT, 4]
        assert await outcomes(coalescer, ["eeeee"]) == [5]
        assert service.batches == [["a"], ["bb", "bad", "dddd"], ["eeeee"]]
        assert service.singles == []

    asyncio.run(scenario())


def test_a_batch_is_split_by_size_and_by_count() -> None:
    async def scenario() -> None:
        service = Service()
        items = ["v" * 40, "x" * 40, "y" * 40, "z" * 40, "w" * 10]
        assert await outcomes(service.coalescer(max_bytes=90), items) == [40, 40, 40, 40, 10]
        assert [len(batch) for batch in service.batches] == [1, 2, 2]
        service.batches.clear()
        many = [f"i{n}" for n in range(MAX_ITEMS + 4)]
        assert await outcomes(service.coalescer(), many) == [len(item) for item in many]
        assert [len(batch) for batch in service.batches] == [1, MAX_ITEMS, 3]

    asyncio.run(scenario())


def test_a_service_without_the_batched_call_gets_unary_calls_from_then_on(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        service = Service(batched_error=grpc.StatusCode.UNIMPLEMENTED)
        coalescer = service.coalescer()
        with caplog.at_level(logging.INFO, logger="inferix.worker"):
            assert await outcomes(coalescer, ["a", "bad", "ccc"]) == [1, grpc.StatusCode.INVALID_ARGUMENT, 3]
            assert coalescer.unbatched
            assert await outcomes(coalescer, ["dd"]) == [2]
        assert service.singles == ["a", "bad", "ccc", "dd"]
        assert [r.message for r in caplog.records].count(
            "the test service has no batched call (an earlier release): one call per item"
        ) == 1

    asyncio.run(scenario())


def test_a_failed_batched_call_fails_each_of_its_callers_with_its_status() -> None:
    async def scenario() -> None:
        service = Service(batched_error=grpc.StatusCode.UNAVAILABLE)
        coalescer = service.coalescer()
        assert await outcomes(coalescer, ["a", "bb", "ccc"]) == [grpc.StatusCode.UNAVAILABLE] * 3
        assert not coalescer.unbatched and service.singles == []
        service.batched_error = None  # back: the callers' retries go batched again
        assert await outcomes(coalescer, ["a", "bb", "ccc"]) == [1, 2, 3]
        assert service.batches == [["a"], ["bb", "ccc"]]

    asyncio.run(scenario())


def test_a_caller_that_stops_waiting_leaves_the_others_their_outcomes() -> None:
    async def scenario() -> None:
        service = Service()
        coalescer = service.coalescer()
        first = asyncio.ensure_future(coalescer.call("first"))  # goes at once
        waiting = asyncio.ensure_future(coalescer.call("waiting"))
        await asyncio.sleep(0)  # `first` is in flight, `waiting` waits for its answer
        waiting.cancel()
        assert await first == 5
        await asyncio.sleep(0.01)
        assert waiting.cancelled()
        assert service.batches == [["first"], ["waiting"]]  # idempotent calls: an item may go anyway

        service.batches.clear()
        first = asyncio.ensure_future(coalescer.call("first"))
        waiting = asyncio.ensure_future(coalescer.call("waiting"))
        await asyncio.sleep(0)
        first.cancel()  # the call in flight is cancelled: those waiting for it still go
        assert await waiting == 7
        assert first.cancelled()
        assert service.batches == [["waiting"]]

    asyncio.run(scenario())
