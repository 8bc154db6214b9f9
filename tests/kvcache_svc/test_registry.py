"""Registry and block store logic in-process, on both store backends (no gRPC)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable

import pytest

from inferix.spec.blocks import CommittedBlock
from inferix.spec.capacity import Resolution, StreamCapacity
from inferix.store import Store, open_store
from kvcache_svc.blocks import BlockStore
from kvcache_svc.errors import AlreadyCommittedError, InvalidRequestError, NoCapacityError, PreconditionError
from kvcache_svc.registry import WORKERS_PREFIX, KVReport, Registry, WorkerRecord

R64, R128 = Resolution(64, 64), Resolution(128, 128)


def streams(resolution: Resolution, count: int, block_ms: float = 180.0) -> StreamCapacity:
    return StreamCapacity(resolution, count, block_ms, budget_ms=187.5, measured_up_to=8)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def run(store_url: str, body: Callable[[Store, Store], Awaitable[None]]) -> None:
    """Run `body` with two independent clients of the same store (two kvcache_svc replicas)."""

    async def main() -> None:
        first = open_store(store_url)
        second = first if store_url == "memory://" else open_store(store_url)
        try:
            await body(first, second)
        finally:
            await first.close()
            if second is not first:
                await second.close()

    asyncio.run(main())


def test_concurrent_admissions_from_two_replicas_never_overcommit(store_url: str) -> None:
    async def body(a: Store, b: Store) -> None:
        clock = Clock()
        replicas = [Registry(a, 10.0, clock), Registry(b, 10.0, clock)]
        await replicas[0].register("w1", "h:1", "m", KVReport(total_pages=20))
        await replicas[1].register("w2", "h:2", "m", KVReport(total_pages=20))

        async def admit(i: int) -> str:
            try:
                return (await replicas[i % 2].admit(f"s{i}", "m", 3)).worker_id
            except NoCapacityError:
                return "refused"

        outcomes = await asyncio.gather(*(admit(i) for i in range(30)))
        assert sorted(outcomes).count("refused") == 18  # 6 sessions of 3 pages fit in 20 pages, twice
        for record in await replicas[0].workers():
            assert record.reserved_pages == 18 <= record.total_pages

    run(store_url, body)


def test_liveness_follows_the_heartbeat_timeout(store_url: str) -> None:
    async def body(store: Store, _: Store) -> None:
        clock = Clock()
        registry = Registry(store, 10.0, clock)
        await registry.register("w1", "h:1", "m", KVReport(total_pages=8))
        await registry.register("w2", "h:2", "m", KVReport(total_pages=8))
        clock.now += 6
        await registry.heartbeat("w1", 1, KVReport(total_pages=8, used_pages=1), ["s1"])
        clock.now += 6
        alive = {r.worker_id: registry.alive(r) for r in await registry.workers()}
        assert alive == {"w1": True, "w2": False}
        assert (await registry.admit("s1", "m", 7)).worker_id == "w1"
        with pytest.raises(NoCapacityError, match="w2: unavailable"):
            await registry.admit("s2", "m", 2)

    run(store_url, body)


def test_conflicting_commits_of_one_block_have_one_winner(store_url: str) -> None:
    async def body(a: Store, b: Store) -> None:
        shape = (1, 2, 3, 4)
        candidates = [CommittedBlock(0, 0, shape, os.urandom(4 * 24)) for _ in range(6)]
        stores = [BlockStore(a), BlockStore(b)]

        async def commit(i: int) -> bool:
            try:
                return await stores[i % 2].commit("s1", candidates[i])
            except AlreadyCommittedError:
                return False

        results = await asyncio.gather(*(commit(i) for i in range(len(candidates))))
        assert results.count(True) == 1
        stored = await stores[0].get("s1")
        assert stored == [candidates[results.index(True)]]
        assert len(await a.list_prefix("kvcache/blocks/s1/")) == 2  # the index and the winner only

    run(store_url, body)


def test_a_departed_worker_is_never_chosen_until_it_registers_again(store_url: str) -> None:
    async def body(a: Store, b: Store) -> None:
        clock = Clock()
        registry = Registry(a, 10.0, clock)
        await registry.register("w1", "h:1", "m", KVReport(total_pages=20))
        await registry.register("w2", "h:2", "m", KVReport(total_pages=10))
        assert (await registry.admit("s1", "m", 3)).worker_id == "w1"  # the most free pages
        departed = await Registry(b, 10.0, clock).deregister("w1")  # another replica sees it too
        assert departed.departed and not registry.alive(departed)
        assert (await registry.admit("s2", "m", 3)).worker_id == "w2"
        await registry.heartbeat("w1", 1, KVReport(total_pages=20), [])  # a late report does not revive it
        assert (await registry.admit("s3", "m", 3)).worker_id == "w2"
        back = await registry.register("w1", "h:9", "m", KVReport(total_pages=20))  # restarted
        assert registry.alive(back) and back.reservations == {"s1": 3}
        assert (await registry.admit("s4", "m", 3)).worker_id == "w1"

    run(store_url, body)


def test_live_workers_of_a_model_serve_it_with_the_same_model_settings(store_url: str) -> None:
    async def body(a: Store, b: Store) -> None:
        clock = Clock()
        registry, replica = Registry(a, 10.0, clock), Registry(b, 10.0, clock)
        small = '{"preset":"toyworld","video":{"height":96,"width":128}}'
        first = await registry.register("w1", "h:1", "toyworld", KVReport(total_pages=20), model_settings=small)
        assert first.model_settings == small
        await replica.register("w2", "h:2", "toyworld", KVReport(total_pages=20), model_settings=small)
        await replica.register("w3", "h:3", "other", KVReport(total_pages=20))  # another model: any settings
        with pytest.raises(PreconditionError, match=r"'w4' serves model 'toyworld' with another model.yaml than live"):
            await replica.register("w4", "h:4", "toyworld", KVReport(total_pages=20))
        assert {r.worker_id: r.model_settings for r in await registry.workers()} == {
            "w1": small,
            "w2": small,
            "w3": "",
        }
        # Once the others have drained or died, the model may be served otherwise (a rolling change).
        await registry.deregister("w1")
        clock.now += 11
        await registry.register("w4", "h:4", "toyworld", KVReport(total_pages=20))
        # A restarted worker keeps its sessions' reservations only with the settings they were made with.
        assert (await registry.admit("s1", "toyworld", 3)).worker_id == "w4"
        with pytest.raises(PreconditionError, match="holds reservations"):
            await registry.register("w4", "h:4", "toyworld", KVReport(total_pages=20), model_settings=small)

    run(store_url, body)


def test_a_worker_reported_unreachable_takes_no_session_until_its_next_heartbeat(store_url: str) -> None:
    async def body(a: Store, b: Store) -> None:
        clock = Clock()
        registry = Registry(a, 10.0, clock)
        await registry.register("w1", "h:1", "m", KVReport(total_pages=20))
        await registry.register("w2", "h:2", "m", KVReport(total_pages=10))
        clock.now += 1
        suspect = await registry.report_failure("w1")
        assert suspect.suspect and not registry.alive(suspect)
        assert (await registry.admit("s1", "m", 3)).worker_id == "w2"
        await registry.release("s1")
        await registry.report_failure("w2")
        with pytest.raises(NoCapacityError, match="w1: unavailable; w2: unavailable"):
            await registry.admit("s2", "m", 3)
        clock.now += 1
        fresh = await registry.heartbeat("w1", 1, KVReport(total_pages=20), [])
        assert not fresh.suspect and registry.alive(fresh)
        assert (await registry.admit("s2", "m", 3)).worker_id == "w1"

    run(store_url, body)


def test_capacity_is_stored_from_register_and_replaced_by_heartbeats(store_url: str) -> None:
    async def body(a: Store, b: Store) -> None:
        clock = Clock()
        registry, other = Registry(a, 10.0, clock), Registry(b, 10.0, clock)
        await registry.register("w1", "h:1", "m", KVReport(total_pages=32), [streams(R64, 4)])
        [record] = await other.workers()  # stored, so another replica sees it
        assert record.capacity == [streams(R64, 4)]
        await registry.heartbeat("w1", 1, KVReport(total_pages=32), [])  # an empty report: unchanged
        assert (await other.workers())[0].capacity == [streams(R64, 4)]
        assert (await registry.admit("s1", "m", 1, resolution=R64)).stream_costs == {"s1": 0.25}
        await registry.heartbeat("w1", 2, KVReport(total_pages=32), ["s1"], [streams(R64, 2), streams(R128, 1)])
        [record] = await other.workers()
        assert record.capacity == [streams(R64, 2), streams(R128, 1)]
        assert record.stream_costs == {"s1": 0.25}  # admitted sessions keep the share they were admitted with
        assert (await registry.admit("s2", "m", 1, resolution=R64)).stream_load == 0.75
        # A restarted worker re-registers: its measurement is replaced, its sessions' shares are kept.
        back = await registry.register("w1", "h:9", "m", KVReport(total_pages=32))
        assert back.capacity == [] and back.stream_costs == {"s1": 0.25, "s2": 0.5}
        for bad, fragment in [
            ([streams(R64, 1), streams(R64, 2)], "reported twice"),
            ([streams(Resolution(64, 0), 1)], "width and height"),
            ([StreamCapacity(R64, 1, block_ms=float("nan"))], "block_ms must be a finite number"),
        ]:
            with pytest.raises(InvalidRequestError, match=fragment):
                await registry.heartbeat("w1", 3, KVReport(total_pages=32), [], bad)

        # A record written before real-time capacity existed decodes with none measured and no shares.
        old = {k: v for k, v in json.loads(back.encode()).items() if k not in ("capacity", "stream_costs")}
        await a.put(WORKERS_PREFIX + "w0", json.dumps(old | {"worker_id": "w0"}).encode())
        record = next(r for r in await other.workers() if r.worker_id == "w0")
        assert record.capacity == [] and record.stream_costs == {} and record.stream_load == 0.0
        assert WorkerRecord.decode(record.encode()) == record

    run(store_url, body)


def test_sessions_take_their_share_of_real_time_streams(store_url: str) -> None:
    async def body(store: Store, _: Store) -> None:
        registry = Registry(store, 10.0, Clock())
        await registry.register("w1", "h:1", "m", KVReport(total_pages=100), [streams(R64, 4), streams(R128, 2)])
        for i in range(4):
            assert (await registry.admit(f"s{i}", "m", 2, resolution=R64)).worker_id == "w1"
        assert (await registry.admit("s0", "m", 2, resolution=R64)).stream_load == 1.0  # re-admission: same share
        with pytest.raises(NoCapacityError) as info:
            await registry.admit("s4", "m", 2, resolution=R64)
        assert info.value.reason == "realtime"
        assert "w1: 4 of 4 real-time streams at 64x64 in use (block 180 ms at 4 streams, budget 188 ms), " in str(
            info.value
        )
        assert "92 free of 100 pages" in str(info.value)
        assert (await registry.admit("s5", "m", 2)).worker_id == "w1"  # no resolution: pages only

        await registry.release("s0")  # frees its quarter
        [record] = await registry.workers()
        assert "s0" not in record.stream_costs and record.stream_load == 0.75
        with pytest.raises(NoCapacityError, match="1.5 of 2 real-time streams at 128x128 in use"):
            await registry.admit("big", "m", 2, resolution=R128)  # a 128x128 stream needs half the worker
        await registry.release("s1")
        placed = await registry.admit("big", "m", 2, resolution=R128)  # two 64x64 quarters + one 128x128 half
        assert placed.stream_costs == {"s2": 0.25, "s3": 0.25, "big": 0.5} and placed.stream_load == 1.0
        with pytest.raises(NoCapacityError, match="4 of 4 real-time streams at 64x64 in use"):
            await registry.admit("s6", "m", 2, resolution=R64)

    run(store_url, body)


def test_a_worker_that_cannot_hold_one_real_time_stream_takes_one_session(store_url: str) -> None:
    async def body(store: Store, _: Store) -> None:
        registry = Registry(store, 10.0, Clock())
        await registry.register("w1", "h:1", "m", KVReport(total_pages=100), [streams(R128, 0, block_ms=250.0)])
        assert (await registry.admit("s1", "m", 2, resolution=R128)).stream_costs == {"s1": 1.0}
        with pytest.raises(NoCapacityError) as info:
            await registry.admit("s2", "m", 2, resolution=R128)
        assert (
            "w1: not one real-time stream at 128x128 (block 250 ms at 1 stream, budget 188 ms), so a session there "
            "takes the whole worker, 100% of it in use" in str(info.value)
        )
        await registry.release("s1")
        assert (await registry.admit("s2", "m", 2, resolution=R128)).stream_load == 1.0

    run(store_url, body)


def test_unmeasured_resolutions_are_estimated_by_pixels(store_url: str) -> None:
    async def body(store: Store, _: Store) -> None:
        registry = Registry(store, 10.0, Clock())
        await registry.register("w1", "h:1", "m", KVReport(total_pages=100), [streams(R64, 4)])
        await registry.register("w2", "h:2", "m", KVReport(total_pages=100))  # not measured: pages only
        # 128x128 has 4x the pixels of 64x64 (4 streams): a whole worker. The unmeasured w2 counts as unloaded.
        assert (await registry.admit("a", "m", 1, resolution=R128)).worker_id == "w2"
        placed = await registry.admit("b", "m", 1, resolution=R128, exclude=["w2"])
        assert placed.worker_id == "w1" and placed.stream_costs == {"b": 1.0}
        with pytest.raises(NoCapacityError) as info:
            await registry.admit("c", "m", 1, resolution=Resolution(64, 32), exclude=["w2"])
        assert (
            "w1: 100% of its real-time streams in use, a stream at 64x32 (not measured) taking an estimated 12%, "
            "scaled by pixels from 4 real-time streams at 64x64" in str(info.value)
        )
        assert "w2: excluded" in str(info.value)
        await registry.release("b")
        assert (await registry.admit("c", "m", 1, resolution=Resolution(64, 32), exclude=["w2"])).stream_costs == {
            "c": 0.125
        }
        for i in range(20):  # w2 has measured nothing: it admits by pages alone
            assert (await registry.admit(f"d{i}", "m", 1, resolution=R128, exclude=["w1"])).worker_id == "w2"

    run(store_url, body)


def test_pages_are_still_enforced_with_real_time_room_to_spare(store_url: str) -> None:
    async def body(store: Store, _: Store) -> None:
        registry = Registry(store, 10.0, Clock())
        await registry.register("w1", "h:1", "m", KVReport(total_pages=10), [streams(R64, 8)])
        await registry.admit("s1", "m", 4, resolution=R64)
        await registry.admit("s2", "m", 4, resolution=R64)
        with pytest.raises(NoCapacityError) as info:
            await registry.admit("s3", "m", 4, resolution=R64)
        assert info.value.reason == "pages"
        message = str(info.value)
        assert "w1: 2 of 8 real-time streams at 64x64 in use" in message and "2 free of 10 pages" in message
        assert message.endswith("ask for fewer pages (a smaller window), or add workers")

    run(store_url, body)


def test_concurrent_admissions_from_two_replicas_never_overcommit_streams(store_url: str) -> None:
    async def body(a: Store, b: Store) -> None:
        clock = Clock()
        replicas = [Registry(a, 10.0, clock), Registry(b, 10.0, clock)]
        await replicas[0].register("w1", "h:1", "m", KVReport(total_pages=1000), [streams(R64, 3)])
        await replicas[1].register("w2", "h:2", "m", KVReport(total_pages=1000), [streams(R64, 5)])

        async def admit(i: int) -> str:
            try:
                return (await replicas[i % 2].admit(f"s{i}", "m", 1, resolution=R64)).worker_id
            except NoCapacityError:
                return "refused"

        outcomes = await asyncio.gather(*(admit(i) for i in range(20)))
        assert sorted(outcomes) == ["refused"] * 12 + ["w1"] * 3 + ["w2"] * 5
        for record in await replicas[0].workers():
            assert record.stream_load == pytest.approx(1.0)

    run(store_url, body)
