"""The dispatch loop and placement, driven through small in-memory doubles of kvcache_svc and the
workers (the `KVCache` and `WorkerClient` protocols): no gRPC, no processes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from inferix.api.v1 import common_pb2, scheduler_pb2
from inferix.store import MemoryStore, Store
from scheduler.config import Presets, SchedulerConfig
from scheduler.dispatch import Dispatcher
from scheduler.placement import CallFailed, OpenedSession, Placement, WorkerInfo, WorkerRef
from scheduler.sessions import STATE_NAMES, SessionRecord
from scheduler.table import NO_PERSISTENT_STORE, SESSIONS_PREFIX, SessionTable

CONFIG = SchedulerConfig(
    kvcache_address="kvcache.test:50053",
    streamer_address="streamer.test:50054",
    admission_retry_s=0.01,
    probe_interval_s=0.01,
    probe_timeout_s=0.01,
    probe_misses=3,
    block_deadline_s=5.0,
)
PRESETS = Presets(default_lookahead=2)


class Unreachable(Exception):
    """What a call to a worker that is gone raises (a transport failure)."""


@dataclass
class FakeWorker:
    """A worker process: the block events of the sessions it holds, and how it goes away."""

    worker_id: str
    down: bool = False  # calls fail: the process is gone
    hung: bool = False  # neither calls nor health probes answer: the process is stopped
    # What happens when it is asked for block `fail_at`: "crash" (before making it), "crash after
    # commit" (the block is committed but the answer is lost), "hang", or "error" (the engine fails).
    fail_at: int | None = None
    failure: str = "crash"
    sessions: dict[str, list[common_pb2.BlockEvent]] = field(default_factory=dict)
    blocks_made: list[int] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"{self.worker_id}.test:50052"


class FakeWorkers:
    """`WorkerClient` over `FakeWorker`s. As on the real workers, a block is committed (to `committed`,
    which outlives any worker) before the worker answers, and a worker new to a session restores the
    committed blocks when it opens it."""

    def __init__(self, *workers: FakeWorker) -> None:
        self.by_address = {worker.address: worker for worker in workers}
        self.committed: dict[str, list[common_pb2.BlockEvent]] = {}

    def unreachable(self, exc: Exception) -> str | None:
        return "UNAVAILABLE" if isinstance(exc, Unreachable) else None

    async def probe(self, address: str, timeout: float) -> bool:
        return not self.by_address[address].hung

    async def open_session(
        self,
        address: str,
        session_id: str,
        spec: common_pb2.SessionSpec,
        streamer_address: str,
        announced_blocks: int,
        timeout: float,
    ) -> OpenedSession:
        worker = await self._reach(address)
        events = worker.sessions.setdefault(session_id, list(self.committed.get(session_id, [])))
        return OpenedSession(len(events), [e for e in events if e.block_index >= announced_blocks])

    async def run_block(
        self, address: str, session_id: str, block_index: int, prompt: str, recache: bool, timeout: float
    ) -> common_pb2.BlockEvent:
        worker = await self._reach(address)
        failing = block_index == worker.fail_at
        if failing and worker.failure == "hang":
            worker.hung = True
            await self._reach(address)
        if failing and worker.failure == "error":
            raise RuntimeError(f"the engine failed on block {block_index}")
        if failing and worker.failure == "crash":
            worker.down = True
            await self._reach(address)
        event = common_pb2.BlockEvent(block_index=block_index, prompt=prompt, worker_id=worker.worker_id)
        worker.sessions[session_id].append(event)
        worker.blocks_made.append(block_index)
        self.committed.setdefault(session_id, []).append(event)
        if failing and worker.failure == "crash after commit":
            worker.down = True
            await self._reach(address)
        reply = common_pb2.BlockEvent()
        reply.CopyFrom(event)  # what a transport hands back: a copy
        return reply

    async def close_session(self, address: str, session_id: str, timeout: float) -> None:
        worker = self._live(address)
        worker.sessions.pop(session_id, None)
        worker.closed.append(session_id)

    async def prefetch(self, address: str, session_id: str, timeout: float) -> None:
        self._live(address)

    async def session_ids(self, address: str, timeout: float) -> list[str]:
        return list(self._live(address).sessions)

    async def _reach(self, address: str) -> FakeWorker:
        worker = self.by_address[address]
        if worker.hung:
            await asyncio.Event().wait()  # no answer, ever: the caller has to give up
        if worker.down:
            raise Unreachable(f"{address}: connection refused")
        return worker

    def _live(self, address: str) -> FakeWorker:
        worker = self.by_address[address]
        if worker.down or worker.hung:
            raise CallFailed("UNAVAILABLE", f"{address}: connection refused")
        return worker


class FakeKVCache:
    """`KVCache` that admits a session on the first registered worker that is neither excluded nor
    reported failed (KV room is not modelled)."""

    def __init__(self, *registered: FakeWorker) -> None:
        self.registered = registered
        self.reported: dict[str, str] = {}  # worker id -> reason
        self.reservations: dict[str, str] = {}  # session id -> worker id

    async def admit(
        self, session_id: str, model: str, pages: int, exclude: list[str], timeout: float
    ) -> WorkerRef | None:
        for worker in self.registered:
            if worker.worker_id not in exclude and worker.worker_id not in self.reported:
                self.reservations[session_id] = worker.worker_id
                return WorkerRef(worker.worker_id, worker.address)
        return None

    async def workers(self, timeout: float) -> list[WorkerInfo]:
        return [
            WorkerInfo(w.address, "tiny", alive=w.worker_id not in self.reported, suspect=w.worker_id in self.reported)
            for w in self.registered
        ]

    async def report_failure(self, worker_id: str, reason: str, timeout: float) -> None:
        self.reported[worker_id] = reason

    async def release(self, session_id: str, timeout: float) -> None:
        self.reservations.pop(session_id, None)

    async def set_activity(self, session_id: str, paused: bool, timeout: float) -> None:
        pass


class PersistentStore(MemoryStore):
    """A store that outlives the scheduler process, as Redis does."""

    persistent = True


class Mesh:
    """One scheduler's dispatch loop and placement, over fake workers and a fake kvcache_svc."""

    def __init__(self, workers: FakeWorkers, kvcache: FakeKVCache, store: Store) -> None:
        self.workers = workers
        self.kvcache = kvcache
        self.table = SessionTable(store)
        self.dispatcher = Dispatcher(CONFIG, self.table, Placement(CONFIG, kvcache, workers), PRESETS)

    @classmethod
    def of(cls, *workers: FakeWorker, store: Store | None = None) -> Mesh:
        return cls(FakeWorkers(*workers), FakeKVCache(*workers), store or MemoryStore())

    def restarted(self) -> Mesh:
        """A new scheduler process, with the same workers, kvcache_svc and store."""
        return Mesh(self.workers, self.kvcache, self.table.store)

    def start(self, record: SessionRecord) -> asyncio.Queue[scheduler_pb2.InteractResponse | None]:
        """Start a queued session (as CreateSession does); its events from the first on."""
        self.table.records[record.session_id] = record
        events = record.subscribe(0)
        self.dispatcher.start(record)
        return events

    async def run(self, record: SessionRecord) -> list[str]:
        """Run the session to its end; what an attached client saw."""
        events = self.start(record)
        seen = [describe(event) async for event in until_closed(events)]
        await self.dispatcher.drain()  # the session's task has finished (its record is written)
        return seen

    async def stored(self, session_id: str) -> SessionRecord:
        data = await self.table.store.get(f"{SESSIONS_PREFIX}{session_id}")
        assert data is not None
        return SessionRecord.from_json(data, PRESETS.revalidate)


def session(num_blocks: int, *prompts: tuple[int, str], lookahead: int = 64) -> SessionRecord:
    """A new session of the tiny model (a large lookahead: blocks run without waiting for playback)."""
    changes = [common_pb2.PromptChange(at_block=at, text=text) for at, text in prompts or [(0, "a red ball")]]
    spec = common_pb2.SessionSpec(model="tiny", num_blocks=num_blocks, lookahead=lookahead, prompts=changes)
    return SessionRecord("s1", "alice", PRESETS.revalidate(spec), common_pb2.PlaybackUrls())


async def until_closed(
    events: asyncio.Queue[scheduler_pb2.InteractResponse | None],
) -> AsyncIterator[scheduler_pb2.InteractResponse]:
    """The events until the stream ends (the session ended, or was handed over)."""
    while (event := await asyncio.wait_for(events.get(), 10)) is not None:
        yield event


def describe(event: scheduler_pb2.InteractResponse) -> str:
    kind = event.WhichOneof("event")
    if kind == "block":
        return f"block {event.block.block_index} on {event.block.worker_id}"
    if kind == "state":
        return f"{STATE_NAMES[event.state.state]}: {event.state.reason}"
    return f"error {event.error.code}: {event.error.message}"


def blocks(first: int, last: int, worker_id: str) -> list[str]:
    return [f"block {i} on {worker_id}" for i in range(first, last + 1)]


def test_blocks_run_in_order_with_their_prompts_and_each_is_announced_once() -> None:
    async def scenario() -> None:
        mesh = Mesh.of(a := FakeWorker("a"))
        seen = await mesh.run(session(5, (0, "a red ball"), (3, "a blue ball")))
        assert seen == ["running: running on a", *blocks(0, 4, "a"), "completed: done"]
        assert a.blocks_made == [0, 1, 2, 3, 4]
        assert [e.prompt for e in mesh.workers.committed["s1"]] == ["a red ball"] * 3 + ["a blue ball"] * 2
        # Ended: the worker finalized its outputs and the KV room is free.
        assert a.closed == ["s1"] and mesh.kvcache.reservations == {}
        stored = await mesh.stored("s1")
        assert stored.state == common_pb2.SESSION_STATE_COMPLETED and stored.next_block == 5

    asyncio.run(scenario())


def test_a_transport_failure_during_a_block_moves_the_session_and_continues_from_the_committed_block() -> None:
    async def scenario() -> None:
        mesh = Mesh.of(a := FakeWorker("a", fail_at=2), b := FakeWorker("b"))
        seen = await mesh.run(session(5))
        assert seen == [
            "running: running on a",
            *blocks(0, 1, "a"),
            "running: worker a failed; recovering",
            *blocks(2, 4, "b"),
            "completed: done",
        ]
        assert a.blocks_made == [0, 1] and b.blocks_made == [2, 3, 4]  # b restored 0 and 1, made the rest
        assert mesh.kvcache.reported == {"a": "UNAVAILABLE during a block"}
        stored = await mesh.stored("s1")
        assert (stored.worker_id, stored.next_block, stored.announced_blocks) == ("b", 5, 5)

    asyncio.run(scenario())


def test_a_block_committed_by_a_worker_that_died_before_answering_is_announced_once() -> None:
    async def scenario() -> None:
        mesh = Mesh.of(FakeWorker("a", fail_at=2, failure="crash after commit"), b := FakeWorker("b"))
        seen = await mesh.run(session(5))
        # Block 2 is not made again: b restores it and announces it when the session opens there.
        assert seen == [
            "running: running on a",
            *blocks(0, 1, "a"),
            "running: worker a failed; recovering",
            *blocks(2, 2, "a"),
            *blocks(3, 4, "b"),
            "completed: done",
        ]
        assert b.blocks_made == [3, 4]

    asyncio.run(scenario())


def test_a_worker_that_stops_answering_health_probes_is_replaced() -> None:
    async def scenario() -> None:
        mesh = Mesh.of(FakeWorker("a", fail_at=1, failure="hang"), FakeWorker("b"))
        seen = await mesh.run(session(3))
        assert seen == [
            "running: running on a",
            *blocks(0, 0, "a"),
            "running: worker a failed; recovering",
            *blocks(1, 2, "b"),
            "completed: done",
        ]
        assert mesh.kvcache.reported == {
            "a": f"the worker missed {CONFIG.probe_misses} health probes in a row during the call during a block"
        }

    asyncio.run(scenario())


def test_an_unreachable_worker_is_reported_and_skipped_when_the_session_opens() -> None:
    async def scenario() -> None:
        mesh = Mesh.of(a := FakeWorker("a", down=True), FakeWorker("b"))
        seen = await mesh.run(session(2))
        assert seen == ["running: running on b", *blocks(0, 1, "b"), "completed: done"]
        assert mesh.kvcache.reported == {"a": "OpenSession: UNAVAILABLE"}
        assert a.sessions == {}

    asyncio.run(scenario())


def test_an_engine_error_fails_the_session_without_moving_it() -> None:
    async def scenario() -> None:
        mesh = Mesh.of(FakeWorker("a", fail_at=1, failure="error"), b := FakeWorker("b"))
        seen = await mesh.run(session(3))
        error = "RuntimeError: the engine failed on block 1"
        assert seen == ["running: running on a", *blocks(0, 0, "a"), f"error 13: {error}", f"failed: {error}"]
        assert mesh.kvcache.reported == {} and b.sessions == {}
        assert (await mesh.stored("s1")).error == error

    asyncio.run(scenario())


def test_a_stop_request_ends_the_session_completed_at_the_next_block_boundary() -> None:
    async def scenario() -> None:
        mesh = Mesh.of(a := FakeWorker("a"))
        # Lookahead 1: after block 1 the loop waits for playback to catch up, and the stop arrives meanwhile.
        record = session(8, lookahead=1)
        seen = []
        async for event in until_closed(mesh.start(record)):
            seen.append(describe(event))
            if seen[-1] == "block 1 on a":  # what the Interact `stop` command does
                record.stop_requested = True
                record.wake()
        await mesh.dispatcher.drain()
        assert seen == ["running: running on a", *blocks(0, 1, "a"), "completed: stopped"]
        assert a.closed == ["s1"] and mesh.kvcache.reservations == {}
        assert (await mesh.stored("s1")).state == common_pb2.SESSION_STATE_COMPLETED

    asyncio.run(scenario())


def test_a_restarted_scheduler_resumes_the_session_and_its_client_sees_every_block_once() -> None:
    async def scenario() -> None:
        first = Mesh.of(a := FakeWorker("a"), store=PersistentStore())
        record = session(3, lookahead=1)  # after block 1 the loop waits for playback: the restart comes then
        seen = []
        async for event in until_closed(first.start(record)):
            seen.append(describe(event))
            if seen[-1] == "block 1 on a":
                await first.dispatcher.drain()  # SIGTERM: the session is handed over, not ended
        assert seen == ["running: running on a", *blocks(0, 1, "a")]
        assert (await first.stored("s1")).state == common_pb2.SESSION_STATE_RUNNING

        second = first.restarted()
        await second.dispatcher.resume()
        resumed = second.table.records["s1"]
        # The client re-attaches after the last block it saw; the worker's account of blocks 0 and 1
        # fills the new scheduler's history without announcing them again.
        seen = [describe(event) async for event in until_closed(resumed.subscribe(from_block=2))]
        assert seen == ["running: resumed by a restarted scheduler", *blocks(2, 2, "a"), "completed: done"]
        history = [describe(event) for event in resumed.events if event.WhichOneof("event") == "block"]
        assert history == blocks(0, 2, "a")
        assert a.blocks_made == [0, 1, 2]
        await second.dispatcher.drain()

    asyncio.run(scenario())


def test_sessions_that_workers_run_without_a_record_are_closed_and_answered_for_as_failed() -> None:
    async def scenario() -> None:
        mesh = Mesh.of(a := FakeWorker("a", sessions={"s9": []}))  # its scheduler died with an in-memory store
        await mesh.dispatcher.resume()
        assert mesh.table.loaded.is_set()
        assert mesh.table.lost == {"s9": NO_PERSISTENT_STORE}
        assert a.closed == ["s9"]

    asyncio.run(scenario())
