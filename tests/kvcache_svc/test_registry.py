"""Registry and block store logic in-process, on both store backends (no gRPC)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable

import pytest

from inferix.spec.blocks import CommittedBlock
from inferix.store import Store, open_store
from kvcache_svc.blocks import BlockStore
from kvcache_svc.errors import AlreadyCommittedError, NoCapacityError
from kvcache_svc.registry import KVReport, Registry


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
