"""The mesh in one process, for the placement and dispatch-failover tests of the fast tier.

Every part is ours and real: the scheduler's `Dispatcher`, `Placement` and `SessionTable` with its
gRPC adapters (`GrpcKVCache`, `GrpcWorkers`); kvcache_svc's `KVCacheServicer` (registry, block
store) on a `MemoryStore`; each worker's `WorkerService` over the toyworld engine, registering and
heartbeating; and the `StreamerService` that receives the frames. Only the network is simulated:
`tests/scheduler/inprocess_grpc.py` carries the calls between them without sockets, so a test can
kill a worker in the middle of a block (as SIGKILL does) or freeze it (as SIGSTOP does) and run in
seconds. The same paths with real processes are in tests/mesh (test_recovery.py and others).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

import scheduler.grpc_clients
import workers.kvcache_link
import workers.publish
from engine.contract import SessionRequest
from engine.registry import LoadOptions, Model, engine_for, load_model
from inferix.api.v1 import common_pb2, kvcache_pb2_grpc, streamer_pb2, streamer_pb2_grpc, worker_pb2_grpc
from inferix.frames_digest import FramesDigest
from inferix.store import MemoryStore
from kvcache_svc.service import KVCacheConfig, KVCacheServicer
from scheduler.config import Presets, SchedulerConfig
from scheduler.dispatch import Dispatcher
from scheduler.grpc_clients import GrpcKVCache, GrpcWorkers
from scheduler.hosting import Placement
from scheduler.sessions import SessionRecord
from scheduler.table import SessionTable
from scheduler.validation import validate_spec
from streamer.control import SchedulerControl
from streamer.encoder import resolve_encoder
from streamer.link import LinkHub
from streamer.service import StreamerConfig, StreamerService
from tests.scheduler.inprocess_grpc import Network, Server
from workers.config import WorkerConfig
from workers.rpc import WorkerService

MODEL = "toyworld"
KVCACHE, STREAMER, SCHEDULER = "kvcache", "streamer", "scheduler"
WORKER_PAGES = 64
# Modules that open channels to other services (`inferix.server.channel`): in process they get the network's.
CHANNEL_USERS = (scheduler.grpc_clients, workers.kvcache_link, workers.publish)

# Probing a busy worker every 50 ms, 2 misses: a frozen worker is found in about 0.2 s. Admission retried every 50 ms.
FAST = SchedulerConfig(
    kvcache_address=KVCACHE,
    streamer_address=STREAMER,
    block_deadline_s=5.0,
    admission_retry_s=0.05,
    probe_interval_s=0.05,
    probe_timeout_s=0.05,
    probe_misses=2,
)


def with_config(**changes: object) -> SchedulerConfig:
    return dataclasses.replace(FAST, **changes)  # type: ignore[arg-type]


@functools.cache
def toyworld() -> Model:
    return load_model(MODEL, LoadOptions(), served=True)


class LogLines(logging.Handler):
    """Log records as "logger: message" lines."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.name}: {record.getMessage()}")


class _Without(grpc.GenericRpcHandler):
    """A server's handlers less some methods (they answer UNIMPLEMENTED)."""

    def __init__(self, server: Server, methods: set[str]) -> None:
        self.server = server
        self.methods = methods

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        return None if method in self.methods else self.server.handler(method)


class InProcessMesh:
    """kvcache_svc, a streamer, workers and a scheduler in this event loop, on one simulated network."""

    def __init__(self, data_dir: Path, config: SchedulerConfig = FAST, **worker: object) -> None:
        """`worker`: `WorkerConfig` fields every worker is started with (e.g. snapshot_every)."""
        self.network = Network()
        self.config = config
        self.worker_options = worker
        self.logs = LogLines()
        self.kvcache = KVCacheServicer(MemoryStore(), KVCacheConfig(heartbeat_timeout_s=2.0))
        self.data_dir = data_dir
        self.streamer = self._new_streamer()
        self.workers: dict[str, WorkerService] = {}
        self._heartbeats: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        self.presets = Presets(config.default_lookahead)
        self.table = SessionTable(MemoryStore())

    def _new_streamer(self) -> StreamerService:
        config = StreamerConfig(data_dir=self.data_dir, codec=resolve_encoder("libx264"))
        return StreamerService(config, LinkHub(SchedulerControl()))

    def _serve_streamer(self, server: Server) -> None:
        streamer_pb2_grpc.add_StreamerServiceServicer_to_server(self.streamer, server)

    def restart_streamer(self, left_out: tuple[str, ...] = ()) -> None:
        """SIGKILL the streamer and start a new one on the same recordings folder; `left_out`: methods
        the new one does not serve (e.g. "PushBlock", as a streamer of an older release)."""
        self.network.kill(STREAMER)
        self.streamer = self._new_streamer()
        if not left_out:
            self.network.restart(STREAMER, self._serve_streamer)
            return
        full = Server()
        self._serve_streamer(full)
        missing = {f"/inferix.v1.StreamerService/{method}" for method in left_out}
        self.network.restart(STREAMER, lambda server: server.add_generic_rpc_handlers((_Without(full, missing),)))

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Our modules open channels on the simulated network while the mesh runs, and what the
        services log (INFO and up) is kept in `logs`."""
        saved = [getattr(module, "channel") for module in CHANNEL_USERS]  # noqa: B009
        for module in CHANNEL_USERS:
            setattr(module, "channel", self.network.channel)  # noqa: B010
        ours = logging.getLogger("inferix")
        level = ours.level
        ours.setLevel(logging.INFO)
        ours.addHandler(self.logs)
        try:
            yield
        finally:
            ours.removeHandler(self.logs)
            ours.setLevel(level)
            for module, channel in zip(CHANNEL_USERS, saved, strict=True):
                setattr(module, "channel", channel)  # noqa: B010

    async def start(self, worker_ids: list[str]) -> None:
        """Serve kvcache_svc and the streamer, start the workers and the scheduler's parts (within
        `installed`); return once every worker has registered."""
        self.network.serve(KVCACHE, lambda s: kvcache_pb2_grpc.add_KVCacheServiceServicer_to_server(self.kvcache, s))
        self.network.serve(STREAMER, self._serve_streamer)
        for worker_id in worker_ids:
            with self.network.process(worker_id):
                # No start-up probe: the capacity is learnt from the blocks served (admission by KV pages).
                options: dict[str, Any] = {"heartbeat_interval_s": 0.2, "capacity_probe_streams": 0}
                config = WorkerConfig(worker_id, KVCACHE, WORKER_PAGES, **(options | self.worker_options))
                service = WorkerService(toyworld(), config)
                self.network.serve(worker_id, functools.partial(_add_worker, service))
                self._heartbeats.append(asyncio.create_task(service.register_and_heartbeat(worker_id, self._stop)))
            self.workers[worker_id] = service
        with self.network.process(SCHEDULER):
            self.placement = Placement(self.config, GrpcKVCache(KVCACHE), GrpcWorkers())
        self.dispatcher = Dispatcher(self.config, self.table, self.placement, self.presets)
        async with asyncio.timeout(10):
            while len(await self.kvcache.registry.workers()) < len(worker_ids):
                await asyncio.sleep(0.01)

    async def close(self) -> None:
        self._stop.set()
        for task in self._heartbeats:
            task.cancel()
        await asyncio.gather(*self._heartbeats, return_exceptions=True)
        await self.streamer.drain()

    async def create(self, num_blocks: int, seed: int = 7, prompt: str = "a red ball rolls") -> SessionRecord:
        """CreateSession as `SchedulerServicer` does it: validate, place, persist, dispatch."""
        spec = common_pb2.SessionSpec(
            model=MODEL, num_blocks=num_blocks, seed=seed, prompts=[common_pb2.PromptChange(at_block=0, text=prompt)]
        )
        valid = validate_spec(spec, {MODEL: self.presets.get(MODEL)}, self.config.default_lookahead)
        record = SessionRecord(uuid.uuid4().hex, "tester", valid, common_pb2.PlaybackUrls())
        with self.network.process(SCHEDULER):
            if not await self.placement.place(record):
                raise AssertionError(f"not placed: {record.no_room}")
            self.table.records[record.session_id] = record
            await self.table.persist(record)
            self.dispatcher.start(record)
        return record

    async def during_block(self, worker_id: str, record: SessionRecord, block: int | None) -> None:
        """Return while `worker_id` computes the session's `block` (None: any block, i.e. its first)."""
        async with asyncio.timeout(30):
            while True:
                session = self.workers[worker_id].sessions.get(record.session_id)
                computing = None if session is None else session.computing
                if computing is not None and block in (None, computing.request.block_index):
                    return
                await asyncio.sleep(0.001)

    async def finished(self, record: SessionRecord, timeout_s: float = 60.0) -> SessionRecord:
        async with asyncio.timeout(timeout_s):
            while not record.terminal:
                await record.wait(0.05)
        return record

    async def stream_info(self, record: SessionRecord) -> streamer_pb2.GetStreamInfoResponse:
        """What the streamer received of the session (frame count, SHA-256 of the frames in order)."""
        stub = streamer_pb2_grpc.StreamerServiceStub(self.network.channel(STREAMER))
        info: streamer_pb2.GetStreamInfoResponse = await stub.GetStreamInfo(
            streamer_pb2.GetStreamInfoRequest(session_id=record.session_id), timeout=5
        )
        return info


def _add_worker(service: WorkerService, server: Server) -> None:
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(service, server)


def announced(record: SessionRecord) -> list[common_pb2.BlockEvent]:
    """The blocks announced to the session's clients, in order."""
    return [e.block for e in record.events if e.WhichOneof("event") == "block"]


@functools.cache
def solo(num_blocks: int, seed: int, prompt: str) -> tuple[int, str]:
    """Frames and their SHA-256 of the same session made alone in one engine, as `inferix generate` does."""
    spec = common_pb2.SessionSpec(
        model=MODEL, num_blocks=num_blocks, seed=seed, prompts=[common_pb2.PromptChange(at_block=0, text=prompt)]
    )
    valid = validate_spec(spec, {MODEL: Presets(2).get(MODEL)}, 2)
    request = SessionRequest(
        prompt=prompt, width=valid.spec.resolution.width, height=valid.spec.resolution.height,
        seed=seed, num_blocks=num_blocks,
    )  # fmt: skip
    digest, frames = FramesDigest(), 0
    with engine_for(toyworld(), WORKER_PAGES).open_session(request) as video:
        for block in video:
            digest.update_frames(block.frames)
            frames += block.frames.shape[0]
    return frames, digest.hexdigest()
