"""Placement and dispatch failover in one process: the scheduler's real `Placement` and `Dispatcher`
against kvcache_svc's real `Registry` (on the in-memory store), without gRPC.

The same paths run with real processes in tests/mesh (test_recovery.py kills workers of a running
mesh); here each step is driven and checked directly, in milliseconds: which worker admission picks,
what kvcache_svc records about a failed worker, where the reservations are, which blocks are
announced. `RegistryKVCache` is `GrpcKVCache` without the wire: the same calls and the same meaning
of kvcache_svc's refusals. The workers are the other side of the `WorkerClient` protocol: each keeps
the sessions opened on it, and the blocks made are committed where any successor finds them (what
kvcache_svc's block store does for real workers), so a worker new to a session restores it from there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from inferix.api.v1 import common_pb2
from inferix.spec.capacity import Resolution
from inferix.store import open_store
from kvcache_svc.errors import NoCapacityError, NotFoundError
from kvcache_svc.registry import KVReport, Registry, WorkerRecord
from scheduler.config import Presets, SchedulerConfig
from scheduler.dispatch import Dispatcher
from scheduler.placement import NoRoom, OpenedSession, Placement, WorkerInfo, WorkerRef
from scheduler.sessions import SessionRecord
from scheduler.table import SessionTable
from scheduler.validation import validate_spec

MODEL = "toyworld"
PRESETS = Presets(default_lookahead=2)
# Sessions run as fast as blocks come back (no real-time pacing), and a hung call is found in ~0.1 s.
CONFIG = SchedulerConfig(
    kvcache_address="in-process",
    streamer_address="in-process",
    block_deadline_s=5.0,
    internal_deadline_s=1.0,
    admission_retry_s=0.01,
    probe_interval_s=0.02,
    probe_timeout_s=0.02,
    probe_misses=2,
)


class Clock:
    """kvcache_svc's wall clock, moved by the test: liveness and suspicion follow it exactly."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class RegistryKVCache:
    """scheduler.placement.KVCache on kvcache_svc's Registry, as `GrpcKVCache` is over its gRPC API:
    no room and an unknown model (RESOURCE_EXHAUSTED, NOT_FOUND there) are `NoRoom` with kvcache_svc's
    reason; a release of a session holding nothing is no error."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.paused: set[str] = set()

    async def admit(
        self,
        session_id: str,
        model: str,
        pages: int,
        resolution: common_pb2.Resolution,
        exclude: list[str],
        timeout: float,
    ) -> WorkerRef | NoRoom:
        try:
            record = await self.registry.admit(
                session_id, model, pages, exclude, Resolution(resolution.width, resolution.height)
            )
        except (NoCapacityError, NotFoundError) as exc:
            return NoRoom(str(exc))
        return WorkerRef(record.worker_id, record.address)

    async def workers(self, timeout: float) -> list[WorkerInfo]:
        return [
            WorkerInfo(r.address, r.model, self.registry.alive(r), r.suspect) for r in await self.registry.workers()
        ]

    async def report_failure(self, worker_id: str, reason: str, timeout: float) -> None:
        await self.registry.report_failure(worker_id)

    async def release(self, session_id: str, timeout: float) -> None:
        if await self.registry.holds_reservation(session_id):
            await self.registry.release(session_id)

    async def set_activity(self, session_id: str, paused: bool, timeout: float) -> None:
        (self.paused.add if paused else self.paused.discard)(session_id)


@dataclass
class Worker:
    worker_id: str
    address: str
    up: bool = True  # False: its process is gone (connections refused)
    hung: bool = False  # accepts calls, never answers them nor its health checks (a stopped process)
    sessions: set[str] = field(default_factory=set)
    fail_at_block: int | None = None  # it dies when asked for this block
    hang_at_block: int | None = None  # it hangs when asked for this block


class Workers:
    """The workers' side of scheduler.placement.WorkerClient, in this process."""

    def __init__(self, *workers: Worker) -> None:
        self.by_address = {w.address: w for w in workers}
        self.committed: dict[str, list[common_pb2.BlockEvent]] = {}  # session id -> its blocks, in order
        self.calls: list[tuple[str, str]] = []  # (worker id, call) in order

    def _reach(self, address: str, call: str) -> Worker:
        worker = self.by_address[address]
        self.calls.append((worker.worker_id, call))
        if not worker.up:
            raise ConnectionRefusedError(f"{address}: connection refused")
        return worker

    def unreachable(self, exc: Exception) -> str | None:
        return "UNAVAILABLE" if isinstance(exc, ConnectionError) else None

    async def probe(self, address: str, timeout: float) -> bool:
        worker = self.by_address[address]
        return worker.up and not worker.hung

    async def draining(self, address: str, timeout: float) -> bool:
        return False

    async def open_session(
        self,
        address: str,
        session_id: str,
        spec: common_pb2.SessionSpec,
        streamer_address: str,
        announced_blocks: int,
        timeout: float,
    ) -> OpenedSession:
        worker = self._reach(address, "open")
        worker.sessions.add(session_id)
        blocks = self.committed.setdefault(session_id, [])  # a worker new to it restores these
        return OpenedSession(len(blocks), [b for b in blocks if b.block_index >= announced_blocks])

    async def run_block(
        self,
        address: str,
        session_id: str,
        block_index: int,
        prompt: str,
        recache: bool,
        action: common_pb2.HeldAction | None,
        timeout: float,
    ) -> common_pb2.BlockEvent:
        worker = self._reach(address, f"block {block_index}")
        if worker.fail_at_block == block_index:
            worker.up = False
            raise ConnectionResetError(f"{address}: connection reset")
        if worker.hang_at_block == block_index:
            worker.hung = True
        if worker.hung:
            await asyncio.Event().wait()  # until the scheduler gives up on the call and cancels it
        assert session_id in worker.sessions, f"{worker.worker_id} runs a block of {session_id} it never opened"
        blocks = self.committed[session_id]
        assert block_index == len(blocks), f"block {block_index} out of order after {len(blocks)}"
        event = common_pb2.BlockEvent(
            block_index=block_index, first_frame=3 * block_index, num_frames=3, worker_id=worker.worker_id
        )
        blocks.append(event)
        return event

    async def close_session(self, address: str, session_id: str, timeout: float, finish_stream: bool = True) -> None:
        worker = self.by_address[address]
        if worker.up and not worker.hung:
            worker.sessions.discard(session_id)

    async def prefetch(self, address: str, session_id: str, timeout: float) -> None:
        self._reach(address, "prefetch")

    async def session_ids(self, address: str, timeout: float) -> list[str]:
        return sorted(self._reach(address, "status").sessions)


@dataclass
class Cluster:
    clock: Clock
    registry: Registry
    workers: Workers
    placement: Placement

    async def register(self, worker: Worker, pages: int = 4096) -> None:
        await self.registry.register(worker.worker_id, worker.address, MODEL, KVReport(total_pages=pages))

    async def record(self, worker_id: str) -> WorkerRecord:
        return next(r for r in await self.registry.workers() if r.worker_id == worker_id)

    def session(self, session_id: str, num_blocks: int) -> SessionRecord:
        spec = common_pb2.SessionSpec(
            model=MODEL,
            num_blocks=num_blocks,
            lookahead=64,  # no waiting for real-time playback between blocks
            prompts=[common_pb2.PromptChange(at_block=0, text="a red ball")],
        )
        valid = validate_spec(spec, {MODEL: PRESETS.get(MODEL)}, PRESETS.default_lookahead)
        return SessionRecord(session_id, "alice", valid, common_pb2.PlaybackUrls())


def run(body: Callable[[Cluster], Awaitable[None]], *workers: Worker) -> Workers:
    async def main() -> None:
        store = open_store("memory://")
        clock = Clock()
        registry = Registry(store, heartbeat_timeout_s=60.0, clock=clock)
        cluster = Cluster(clock, registry, pool, Placement(CONFIG, RegistryKVCache(registry), pool))
        for worker in workers:
            await cluster.register(worker)
        try:
            await asyncio.wait_for(body(cluster), timeout=30)
        finally:
            await store.close()

    pool = Workers(*workers)
    asyncio.run(main())
    return pool


async def drive(cluster: Cluster, record: SessionRecord) -> list[tuple[int, str]]:
    """Run the session to its end through the real Dispatcher; its announced blocks as a client sees
    them: (block index, worker)."""
    store = open_store("memory://")
    table = SessionTable(store)
    table.records[record.session_id] = record
    dispatcher = Dispatcher(CONFIG, table, cluster.placement, PRESETS)
    events = record.subscribe(0)
    dispatcher.start(record)
    announced = []
    while (event := await events.get()) is not None:
        if event.WhichOneof("event") == "block":
            announced.append((event.block.block_index, event.block.worker_id))
    await dispatcher.drain()
    await store.close()
    return announced


def test_open_on_an_unreachable_worker_moves_on_and_kvcache_admits_nothing_more_there() -> None:
    async def body(cluster: Cluster) -> None:
        # w0 has the most free pages, so admission picks it first; its process is gone.
        await cluster.register(Worker("w0", "h:0"), pages=8192)
        record = cluster.session("s1", num_blocks=2)
        pages = record.valid.shape.pages
        assert await cluster.placement.place(record)
        assert (record.worker_id, record.worker_address) == ("w1", "h:1")
        assert cluster.workers.calls == [("w0", "open"), ("w1", "open")]
        gone, chosen = await cluster.record("w0"), await cluster.record("w1")
        assert gone.suspect and not cluster.registry.alive(gone)
        # Its room moved with it: nothing stays reserved on the worker that could not be reached.
        assert (gone.reservations, chosen.reservations) == ({}, {"s1": pages})
        # The next session is not sent to w0 until it heartbeats again.
        assert await cluster.placement.place(cluster.session("s2", num_blocks=2))
        assert cluster.workers.calls[-1] == ("w1", "open")
        cluster.clock.now += 1
        await cluster.registry.heartbeat("w0", 1, KVReport(total_pages=8192), [])
        cluster.workers.by_address["h:0"].up = True
        assert await cluster.placement.place(cluster.session("s3", num_blocks=2))
        assert cluster.workers.calls[-1] == ("w0", "open")

    run(body, Worker("w1", "h:1"), Worker("w0", "h:0", up=False))


def test_a_worker_lost_mid_session_hands_it_over_and_every_block_is_announced_once() -> None:
    async def body(cluster: Cluster) -> None:
        record = cluster.session("s1", num_blocks=5)
        announced = await drive(cluster, record)
        assert record.state == common_pb2.SESSION_STATE_COMPLETED, record.error
        # Blocks 0-1 made on w0; it died on block 2, which w1 made after restoring 0-1.
        assert announced == [(0, "w0"), (1, "w0"), (2, "w1"), (3, "w1"), (4, "w1")]
        assert cluster.workers.calls[-5:] == [("w0", "block 2"), ("w1", "open")] + [
            ("w1", f"block {i}") for i in (2, 3, 4)
        ]
        failed = await cluster.record("w0")
        assert failed.suspect and not cluster.registry.alive(failed)
        # The completed session holds no room anywhere.
        assert not await cluster.registry.holds_reservation("s1")

    run(body, Worker("w0", "h:0", fail_at_block=2), Worker("w1", "h:1"))


def test_a_hung_worker_is_found_by_its_health_probes_and_its_session_moves() -> None:
    async def body(cluster: Cluster) -> None:
        record = cluster.session("s1", num_blocks=3)
        announced = await drive(cluster, record)
        assert record.state == common_pb2.SESSION_STATE_COMPLETED, record.error
        # Block 1's call on w0 never returned; its missed probes moved the session, and w1 made it.
        assert announced == [(0, "w0"), (1, "w1"), (2, "w1")]
        assert (await cluster.record("w0")).suspect

    # Equal room: the session starts on w0 (the lowest id), which hangs on block 1 (a stopped process).
    run(body, Worker("w0", "h:0", hang_at_block=1), Worker("w1", "h:1"))


def test_the_only_worker_restarted_takes_its_session_back_once_it_heartbeats() -> None:
    async def body(cluster: Cluster) -> None:
        w0 = cluster.workers.by_address["h:0"]
        record = cluster.session("s1", num_blocks=4)

        async def restart_when_reported() -> None:
            # A StatefulSet pod: the same worker id comes back at the same address and heartbeats.
            while not (await cluster.record("w0")).suspect:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.05)  # meanwhile the session waits for room, it does not fail
            assert record.state == common_pb2.SESSION_STATE_RUNNING and not record.worker_id
            assert record.no_room and "w0" in record.no_room, record.no_room
            w0.up, w0.fail_at_block = True, None
            cluster.clock.now += 1
            await cluster.registry.heartbeat("w0", 1, KVReport(total_pages=4096), [])

        restarted = asyncio.create_task(restart_when_reported())
        announced = await drive(cluster, record)
        await restarted
        assert record.state == common_pb2.SESSION_STATE_COMPLETED, record.error
        assert announced == [(0, "w0"), (1, "w0"), (2, "w0"), (3, "w0")]
        assert ("w0", "block 2") in cluster.workers.calls[-4:]

    run(body, Worker("w0", "h:0", fail_at_block=2))


@pytest.mark.parametrize("model", [MODEL, "no-such-model"])
def test_without_room_the_session_waits_with_kvcache_svc_reason(model: str) -> None:
    async def body(cluster: Cluster) -> None:
        record = cluster.session("s1", num_blocks=2)
        record.valid.spec.model = model
        if model == MODEL:  # the only worker is full
            await cluster.register(Worker("w0", "h:0"), pages=record.valid.shape.pages - 1)
        assert not await cluster.placement.try_place(record)
        assert record.worker_id == "" and cluster.workers.calls == []
        expected = "w0" if model == MODEL else "no-such-model"
        assert expected in record.no_room, record.no_room

    run(body, Worker("w0", "h:0"))
