"""The mesh in one process, for the scheduler's placement and dispatch-failover tests (the fast tier).

Everything that decides is the real thing: the scheduler's `Dispatcher`, `Placement` and
`SessionTable`; kvcache_svc's `Registry` (admission, failure reports, reservations) and `BlockStore`
(commits) on a `MemoryStore`; and each worker's real engine on its `EngineHost` thread, opening,
restoring and making blocks as `workers.rpc` does. Only the transport is in-process: the scheduler
reaches kvcache_svc and the workers through its own `KVCache` and `WorkerClient` protocols
(`scheduler.hosting`), implemented here with direct calls where `scheduler.grpc_clients` uses gRPC.

A worker can be stopped between any two calls or in the middle of a block: `LocalWorker.die_at`
makes it go away as a SIGKILLed process does (the block in flight is lost, uncommitted, and every
later call is refused as UNAVAILABLE), `hang_at` as a SIGSTOPped one (the call never returns and
health probes fail). The real-process versions of these tests are in tests/mesh (test_recovery.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from engine.contract import Session, SessionRequest
from engine.registry import LoadOptions, Model, decoder_of, engine_for, load_model
from inferix.api.v1 import common_pb2
from inferix.spec.blocks import CommittedBlock
from inferix.spec.capacity import Resolution, StreamCapacity
from inferix.store import MemoryStore
from kvcache_svc.blocks import BlockStore
from kvcache_svc.errors import NoCapacityError, NotFoundError
from kvcache_svc.registry import KVReport, Registry
from scheduler.config import Presets, SchedulerConfig
from scheduler.dispatch import Dispatcher
from scheduler.hosting import CallFailed, NoRoom, OpenedSession, Placement, WorkerInfo, WorkerRef
from scheduler.sessions import SessionRecord
from scheduler.table import SessionTable
from scheduler.validation import validate_spec
from workers.blocks import block_event
from workers.config import WorkerConfig
from workers.engine_host import EngineHost

MODEL = "toyworld"
WORKER_PAGES = 64


class WorkerDown(Exception):
    """The in-process stand-in for a gRPC UNAVAILABLE: the worker's process is gone."""


class LocalKVCache:
    """`KVCache` over kvcache_svc's registry, called directly (what `KVCacheServicer` does, minus gRPC)."""

    def __init__(self, registry: Registry, blocks: BlockStore) -> None:
        self.registry = registry
        self.blocks = blocks

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
            record = await self.registry.admit(session_id, model, pages, exclude, Resolution.from_proto(resolution))
        except (NoCapacityError, NotFoundError) as exc:  # RESOURCE_EXHAUSTED / NOT_FOUND over gRPC
            return NoRoom(str(exc))
        return WorkerRef(record.worker_id, record.address)

    async def workers(self, timeout: float) -> list[WorkerInfo]:
        records = await self.registry.workers()
        return [WorkerInfo(r.address, r.model, self.registry.alive(r), r.suspect) for r in records]

    async def report_failure(self, worker_id: str, reason: str, timeout: float) -> None:
        await self.registry.report_failure(worker_id)

    async def release(self, session_id: str, timeout: float) -> None:
        try:
            await self.registry.release(session_id)
        except NotFoundError:  # it held no reservation
            return
        await self.blocks.expire(session_id, ttl_s=3600.0)

    async def set_activity(self, session_id: str, paused: bool, timeout: float) -> None:
        raise CallFailed("UNIMPLEMENTED", "pausing is not part of the in-process mesh")


@dataclass
class LocalWorker:
    """One worker: its engine on its own thread, its open sessions, and the blocks it made."""

    worker_id: str
    model: Model
    blocks: BlockStore
    host: EngineHost = field(init=False)
    sessions: dict[str, Session] = field(default_factory=dict)
    events: dict[str, list[common_pb2.BlockEvent]] = field(default_factory=dict)
    frames: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)  # (session, block) -> frames made here
    up: bool = True
    hung: bool = False
    # Block index -> what happens when it is asked for: "die" mid-block, or "hang" (never answers).
    faults: dict[int, str] = field(default_factory=dict)
    _gone: asyncio.Event = field(default_factory=asyncio.Event)
    _lanes: dict[str, asyncio.Lock] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.host = EngineHost(self.model, WorkerConfig(self.worker_id, kvcache_address="", kv_pages=WORKER_PAGES))

    @property
    def address(self) -> str:
        return f"in-process/{self.worker_id}"

    def die_at(self, block: int) -> None:
        self.faults[block] = "die"

    def hang_at(self, block: int) -> None:
        self.faults[block] = "hang"

    def kill(self) -> None:
        """Gone as a SIGKILLed process: its sessions and KV pages with it, calls in flight fail."""
        self.up = False
        self.sessions.clear()
        self._gone.set()

    def check_up(self) -> None:
        if not self.up:
            raise WorkerDown(f"worker {self.worker_id} is gone")

    async def open(self, session_id: str, spec: common_pb2.SessionSpec, announced: int) -> OpenedSession:
        self.check_up()
        if session_id not in self.sessions:
            request = SessionRequest(
                prompt=spec.prompts[0].text if spec.prompts else None,
                width=spec.resolution.width,
                height=spec.resolution.height,
                seed=spec.seed,
                num_blocks=spec.num_blocks or None,
                session_id=session_id,
            )
            video = await self.host.call(self.host.engine.open_session, request)
            committed = await self.blocks.get(session_id) or []
            self.events[session_id] = await self._restore(video, committed)
            self.sessions[session_id] = video
        video = self.sessions[session_id]
        events = [e for e in self.events[session_id] if e.block_index >= announced]
        return OpenedSession(video.next_block_index, events, decoder_of(self.model))

    async def _restore(self, video: Session, committed: Sequence[CommittedBlock]) -> list[common_pb2.BlockEvent]:
        """Replay the committed blocks, as `WorkerService._restore` does (here without snapshots)."""
        if not committed:
            return []
        counts = await self.host.call(functools.partial(video.restore, committed, from_start=True))
        events, first_frame = [], 0
        for block, count in zip(committed, counts, strict=True):
            events.append(block_event(self.worker_id, block.block_index, first_frame, count, block.prompt, None))
            first_frame += count
        return events

    async def run(self, session_id: str, block_index: int, prompt: str, recache: bool) -> common_pb2.BlockEvent:
        """Make the block once the session's earlier blocks are made: the scheduler sends the next
        block ahead, and it waits here (`workers.blocks.BlockLanes` queues it the same way)."""
        self.check_up()
        async with self._lanes.setdefault(session_id, asyncio.Lock()):  # FIFO: blocks in the order sent
            return await self._run(session_id, block_index, prompt, recache)

    async def _run(self, session_id: str, block_index: int, prompt: str, recache: bool) -> common_pb2.BlockEvent:
        self.check_up()
        video = self.sessions.get(session_id)
        if video is None:
            raise RuntimeError(f"session {session_id!r} is not open on worker {self.worker_id}")
        if video.next_block_index != block_index:
            raise RuntimeError(f"block {block_index} asked, the session's next is {video.next_block_index}")
        fault = self.faults.pop(block_index, None)
        if fault == "hang":
            self.hung = True
            await asyncio.Event().wait()  # a stopped process: the call never returns
        if prompt and prompt != video.prompt_text:
            await self.host.call(video.set_prompt, prompt, recache)
        making = asyncio.ensure_future(self.host.call(video.next_block))
        if fault == "die":  # killed while the engine computes: the block is never committed nor answered
            self.kill()
        gone = asyncio.ensure_future(self._gone.wait())
        await asyncio.wait({making, gone}, return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if not making.done() or not self.up:
            raise WorkerDown(f"worker {self.worker_id} died during block {block_index}")
        block = making.result()
        await self.blocks.commit(session_id, block.committed())
        self.frames[(session_id, block.index)] = block.frames
        event = block_event(self.worker_id, block.index, block.first_frame, block.frames.shape[0], block.prompt, None)
        self.events[session_id].append(event)
        return event


class LocalWorkers:
    """`WorkerClient` over `LocalWorker`s by address."""

    def __init__(self, workers: Sequence[LocalWorker]) -> None:
        self.by_address = {w.address: w for w in workers}

    def unreachable(self, exc: Exception) -> str | None:
        return "UNAVAILABLE" if isinstance(exc, WorkerDown) else None

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
        return await self.by_address[address].open(session_id, spec, announced_blocks)

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
        return await self.by_address[address].run(session_id, block_index, prompt, recache)

    async def close_session(self, address: str, session_id: str, timeout: float, finish_stream: bool = True) -> None:
        worker = self.by_address[address]
        if not worker.up:
            raise CallFailed("UNAVAILABLE", f"worker {worker.worker_id} is gone")
        video = worker.sessions.pop(session_id, None)
        if video is not None:
            await worker.host.call(video.close)

    async def prefetch(self, address: str, session_id: str, timeout: float) -> None:
        worker = self.by_address[address]
        await worker.host.call(worker.sessions[session_id].prefetch)

    async def session_ids(self, address: str, timeout: float) -> list[str]:
        worker = self.by_address[address]
        if not worker.up:
            raise CallFailed("UNAVAILABLE", f"worker {worker.worker_id} is gone")
        return list(worker.sessions)


# Probing every 50 ms, 2 misses: a hung worker is found in about 0.2 s. Retrying admission every 50 ms.
FAST = SchedulerConfig(
    kvcache_address="in-process",
    streamer_address="in-process",
    block_deadline_s=5.0,
    admission_retry_s=0.05,
    probe_interval_s=0.05,
    probe_timeout_s=0.05,
    probe_misses=2,
)


@functools.cache
def toyworld() -> Model:
    return load_model(MODEL, LoadOptions())


class InProcessMesh:
    """A scheduler, kvcache_svc's registry and block store, and workers, in this event loop."""

    def __init__(self, worker_ids: Sequence[str], config: SchedulerConfig = FAST) -> None:
        store = MemoryStore()
        self.registry = Registry(store, heartbeat_timeout_s=60.0)
        self.blocks = BlockStore(store)
        self.workers = {w: LocalWorker(w, toyworld(), self.blocks) for w in worker_ids}
        self.presets = Presets(config.default_lookahead)
        self.placement = Placement(
            config, LocalKVCache(self.registry, self.blocks), LocalWorkers(list(self.workers.values()))
        )
        self.table = SessionTable(MemoryStore())
        self.dispatcher = Dispatcher(config, self.table, self.placement, self.presets)
        self.config = config

    async def register(self) -> None:
        """Each worker registers as `workers.rpc` does: its pool and its real-time capacity at 64x64."""
        capacity = [StreamCapacity(Resolution(64, 64), streams=4, block_ms=50.0, budget_ms=187.5, measured_up_to=4)]
        for worker in self.workers.values():
            await self.registry.register(worker.worker_id, worker.address, MODEL, KVReport(WORKER_PAGES), capacity)

    async def create(self, num_blocks: int, seed: int = 7, prompt: str = "a red ball rolls") -> SessionRecord:
        """CreateSession as `SchedulerServicer` does it: validate, place, persist, dispatch."""
        spec = common_pb2.SessionSpec(
            model=MODEL, num_blocks=num_blocks, seed=seed, prompts=[common_pb2.PromptChange(at_block=0, text=prompt)]
        )
        valid = validate_spec(spec, {MODEL: self.presets.get(MODEL)}, self.config.default_lookahead)
        record = SessionRecord(uuid.uuid4().hex, "tester", valid, common_pb2.PlaybackUrls())
        if not await self.placement.place(record):
            raise AssertionError(f"not placed: {record.no_room}")
        self.table.records[record.session_id] = record
        await self.table.persist(record)
        self.dispatcher.start(record)
        return record

    async def finished(self, record: SessionRecord, timeout_s: float = 60.0) -> SessionRecord:
        """Wait until the session has ended."""
        async with asyncio.timeout(timeout_s):
            while not record.terminal:
                await record.wait(0.05)
        return record

    def frames(self, record: SessionRecord) -> np.ndarray:
        """The session's frames block by block, each from the worker whose answer announced it."""
        made = []
        for event in announced(record):
            made.append(self.workers[event.worker_id].frames[(record.session_id, event.block_index)])
        return np.concatenate(made)


def announced(record: SessionRecord) -> list[common_pb2.BlockEvent]:
    """The blocks announced to the session's clients, in order."""
    return [e.block for e in record.events if e.WhichOneof("event") == "block"]


def solo_frames(record: SessionRecord) -> np.ndarray:
    """The same session made alone in one engine, as `inferix generate` makes it."""
    spec = record.spec
    request = SessionRequest(
        prompt=spec.prompts[0].text, width=spec.resolution.width, height=spec.resolution.height,
        seed=spec.seed, num_blocks=spec.num_blocks,
    )  # fmt: skip
    with engine_for(toyworld(), WORKER_PAGES).open_session(request) as video:
        return np.concatenate([block.frames for block in video])


def with_config(**changes: object) -> SchedulerConfig:
    return dataclasses.replace(FAST, **changes)  # type: ignore[arg-type]
