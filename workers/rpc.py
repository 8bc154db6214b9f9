"""The Worker service's RPCs: one loaded model, many sessions, their blocks batched together.

The scheduler drives it with `OpenSession` / `RunBlock` / `CloseSession`. A block runs through the
worker's pipeline (`workers.blocks`): queued per session, computed batched with every other
session's block on the engine thread (`workers.batch_pump`), its frames straight to the session's
streamer (`workers.publish`), its clean latents committed to kvcache_svc (`workers.kvcache_link`),
then answered. The event loop only moves bytes and answers: health checks, heartbeats and the other
sessions' outputs go on while the engine computes (`workers.engine_host`). Every finished block's
latency feeds the worker's real-time capacity (`workers.capacity`), which a start-up probe measures
first (`workers.capacity_probe`) and every heartbeat reports to kvcache_svc, whose admission keeps
each worker within it.

On rank 0 of a worker pod (`driver` given, see `workers/pod.py`) the engine calls become pod
commands that every rank executes; the text encoder and the VAE decode stay on rank 0.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

import grpc
import torch

from engine.batching import BlockBatcher
from engine.contract import Session, SessionRequest
from engine.kv.errors import KVCapacityError
from engine.parallel.pod_driver import PodDriver
from engine.registry import Model, decoder_of
from inferix.api.v1 import common_pb2, kvcache_pb2, worker_pb2, worker_pb2_grpc
from inferix.errors import UserError
from inferix.profiling import Profiler
from inferix.server import Registration
from inferix.spec.served import any_session_shape
from inferix.telemetry import BLOCK_INDEX_ATTR, SESSION_ID_ATTR, tracer
from workers import metrics
from workers.batch_pump import BatchPump
from workers.blocks import BlockLanes, BlockOutOfOrder, SessionClosed, WorkerDraining, WorkerSession, block_event
from workers.capacity import CapacityMeter, RecentSpeed
from workers.capacity_probe import CapacityProbe
from workers.config import WorkerConfig
from workers.engine_host import EngineHost
from workers.kvcache_link import KVCacheLink, WorkerReport
from workers.publish import FramePublisher
from workers.snapshots import Snapshots

log = logging.getLogger("inferix.worker")
SERVICE_NAME = worker_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name


class WorkerService(worker_pb2_grpc.WorkerServiceServicer):
    """The worker's RPCs over one loaded model; with `driver`, rank 0 of a sequence-parallel pod."""

    def __init__(self, model: Model, config: WorkerConfig, driver: PodDriver | None = None) -> None:
        self.model = model
        self.decoder = decoder_of(model)  # what a session hosted here is decoded with (SessionSpec.decoder)
        self.config = config
        self.host = EngineHost(model, config, driver)
        self.engine = self.host.engine
        self.pool = self.host.pool
        self.sessions: dict[str, WorkerSession] = {}
        self.kvcache = KVCacheLink(config.kvcache_address, config.worker_id)
        self.publisher = FramePublisher(self.host, self.kvcache)
        self.profiler = Profiler(
            enabled=config.profile_dir is not None, fps=model.fps, label=f"worker {config.worker_id}"
        )
        self.capacity = CapacityMeter(model.fps, config.realtime_streams)
        self.pump = BatchPump(self.host, self.capacity, config.max_batch_tokens or None)
        self.lanes = BlockLanes(
            self.host, self.pump, self.publisher, self.kvcache, config.worker_id, model.fps, self.profiler
        )
        self.probe = CapacityProbe(self.host, self.pump, self.capacity, model)
        supported = self.engine.capabilities.snapshots and driver is None
        self.snapshots = Snapshots(
            self.host,
            self.kvcache,
            config.worker_id,
            config.snapshot_every,
            supported,
            self.publisher.durable_frames,
            config.snapshot_piece_bytes,
        )
        self.lanes.after_commit.append(self.snapshots.after_commit)
        self._draining = False
        self.hand_over = True  # a drain waits for the schedulers to move its sessions (not on SIGINT)
        self._closed = asyncio.Event()  # a session was closed (a drain waits for its sessions to move)

    @property
    def draining(self) -> bool:
        """Set on SIGTERM: new sessions and blocks go to other workers (blocks queued here too)."""
        return self._draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self._draining = value
        if value:
            for session in self.sessions.values():
                self.lanes.refuse_queued(session, f"worker {self.config.worker_id} is draining")

    @property
    def batcher(self) -> BlockBatcher:
        return self.pump.batcher

    @property
    def speed(self) -> RecentSpeed:
        return self.lanes.speed

    # ---- RPCs ---------------------------------------------------------------------------------
    async def _refuse_while_draining(self, context: Any) -> None:
        if self.draining:  # UNAVAILABLE: the scheduler re-places the session at once
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"worker {self.config.worker_id} is draining")

    async def OpenSession(self, request: worker_pb2.OpenSessionRequest, context: Any) -> worker_pb2.OpenSessionResponse:
        await self._refuse_while_draining(context)
        spec = request.spec
        if spec.decoder and spec.decoder != self.decoder:  # its frames would differ from those made so far
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"worker {self.config.worker_id} decodes with {self.decoder}, session {request.session_id} "
                f"with {spec.decoder}",
            )
        if request.session_id in self.sessions:  # e.g. a restarted scheduler: wait for the blocks in flight
            open_session = self.sessions[request.session_id]
            await open_session.settled.wait()
            return self._opened(open_session, request.announced_blocks)
        try:
            any_session_shape(self.model.preset, spec.resolution.width, spec.resolution.height, spec.num_blocks or None)
            async with self.host.lock:
                if request.session_id in self.sessions:  # opened by a concurrent call meanwhile
                    return self._opened(self.sessions[request.session_id], request.announced_blocks)
                start = SessionRequest(
                    prompt=spec.prompts[0].text if spec.prompts else None,
                    image=spec.image or None,
                    width=spec.resolution.width,
                    height=spec.resolution.height,
                    seed=spec.seed,
                    num_blocks=spec.num_blocks or None,
                    session_id=request.session_id,
                )
                video = await self.host.in_thread(self.engine.open_session, start)
        except UserError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except KVCapacityError as exc:  # e.g. a window longer than this worker's whole pool
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        try:
            events = await self._restore(video, request.session_id, request.announced_blocks)
        except BaseException as exc:
            # Nothing half-open stays behind (the pool's page table included): the next OpenSession starts over.
            await self.host.call(video.close)
            if isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                # The blocks it would replay were dropped (its snapshot is not usable here): another worker.
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"worker {self.config.worker_id} cannot restore session {request.session_id!r}: {exc.details()}",
                )
            if isinstance(exc, grpc.aio.AioRpcError):  # kvcache_svc or its store away: the scheduler tries again
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE, f"session {request.session_id!r} not restored: {exc.details()}"
                )
            raise
        streamer = self.publisher.streamer(request.streamer_address)
        session = WorkerSession(request.session_id, video, streamer, self.model.fps)
        session.events.extend(events)
        self.sessions[request.session_id] = session
        metrics.SESSIONS.set(len(self.sessions))
        return self._opened(session, request.announced_blocks)

    def _opened(self, session: WorkerSession, announced_blocks: int) -> worker_pb2.OpenSessionResponse:
        """The session's next block, and the blocks made here that the scheduler has not announced."""
        return worker_pb2.OpenSessionResponse(
            next_block=session.video.next_block_index,
            blocks=[e for e in session.events if e.block_index >= announced_blocks],
            decoder=self.decoder,
        )

    async def _restore(self, video: Session, session_id: str, announced_blocks: int) -> list[common_pb2.BlockEvent]:
        """Continue `video` from the session's committed blocks; the events of the blocks restored.

        The history is replayed one stream message (a few MiB) at a time, so a worker restores a
        session of any length without holding all its latents."""
        events: list[common_pb2.BlockEvent] = []
        began = time.perf_counter()
        start = await self.snapshots.restore(video, session_id, announced_blocks)  # a snapshot: replay only after it
        events += start.events
        first_frame = start.next_frame
        world = video.schema is not None
        async for group in self.kvcache.committed_groups(session_id, from_block=start.next_block):
            from_start = not start.next_block and not events
            frames = await self.host.call(functools.partial(video.restore, group, from_start=from_start))
            for block, count in zip(group, frames, strict=True):
                held = common_pb2.HeldAction(keys=block.action_keys, mouse=block.action_mouse) if world else None
                events.append(
                    block_event(self.config.worker_id, block.block_index, first_frame, count, block.prompt, held)
                )
                first_frame += count
        if events or start.next_block:
            log.info("session %s restored from %d committed blocks after block %d in %.2fs", session_id,
                     len(events) - len(start.events), start.next_block, time.perf_counter() - began)  # fmt: skip
        return events

    async def RunBlock(self, request: worker_pb2.RunBlockRequest, context: Any) -> worker_pb2.RunBlockResponse:
        await self._refuse_while_draining(context)
        session = self.sessions.get(request.session_id)
        if session is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"session {request.session_id!r} is not open on this worker")
        assert session is not None
        with tracer("inferix.worker").start_as_current_span(
            "worker.block", attributes={SESSION_ID_ATTR: request.session_id, BLOCK_INDEX_ATTR: request.block_index}
        ):
            try:
                ticket = self.lanes.accept(session, request)
                # Shielded: a block whose caller went away (its scheduler died) is still published,
                # committed and recorded, so that nothing the engine made is lost and the next scheduler
                # learns of it; unless it had not started yet.
                try:
                    event = await asyncio.shield(ticket.reply)
                except asyncio.CancelledError:
                    self.lanes.withdraw(session, ticket)
                    raise
            except BlockOutOfOrder as exc:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            except SessionClosed as exc:
                await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
            except WorkerDraining as exc:  # UNAVAILABLE: the scheduler re-places the session at once
                await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            except KVCapacityError as exc:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        return worker_pb2.RunBlockResponse(block=event)

    async def probe_capacity(self) -> None:
        """Measure block latency at the native resolution with 1, 2, 4, ... sessions batched (see
        `workers.capacity_probe`), before serving."""
        await self.probe.run(self.config.capacity_probe_streams, pinned=bool(self.config.realtime_streams))
        self.report_capacity_metrics()

    def capacity_report(self) -> list[kvcache_pb2.StreamCapacity]:
        return [c.to_proto() for c in self.capacity.capacities()]

    def report_capacity_metrics(self) -> None:
        for c in self.capacity.capacities():
            metrics.REALTIME_STREAMS.labels(resolution=str(c.resolution)).set(c.streams)

    async def PrefetchSession(
        self, request: worker_pb2.PrefetchSessionRequest, context: Any
    ) -> worker_pb2.PrefetchSessionResponse:
        session = self.sessions.get(request.session_id)
        if session is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"session {request.session_id!r} is not open on this worker")
        assert session is not None
        await self.host.call(session.video.prefetch)
        return worker_pb2.PrefetchSessionResponse()

    async def offload(self, session_ids: list[str]) -> None:
        """Move these sessions' KV pages to host memory (kvcache_svc's decision)."""
        for session_id in session_ids:
            session = self.sessions.get(session_id)
            if session is None or session.busy:  # gone, or with a block in flight right now
                continue
            try:
                await self.host.call(session.video.offload)
            except KVCapacityError as exc:
                log.warning("cannot offload %s: %s", session_id, exc)
                continue
            metrics.OFFLOADS.inc()
            log.info("offloaded session %s to host memory (%d pages)", session_id, session.video.kv_usage().host_pages)

    def session_reports(self) -> list[kvcache_pb2.SessionKVReport]:
        reports = []
        for session_id, session in self.sessions.items():
            usage = session.video.kv_usage()
            reports.append(
                kvcache_pb2.SessionKVReport(
                    session_id=session_id,
                    device_pages=usage.device_pages,
                    host_pages=usage.host_pages,
                    last_block_unix=session.last_block_unix,
                )
            )
        return reports

    async def CloseSession(
        self, request: worker_pb2.CloseSessionRequest, context: Any
    ) -> worker_pb2.CloseSessionResponse:
        session = self.sessions.pop(request.session_id, None)
        self.snapshots.forget(request.session_id)
        if session is None:
            return worker_pb2.CloseSessionResponse()
        self.lanes.close(session)  # blocks not started fail; the one computing is published and committed
        await session.settled.wait()

        async def finish_then_close() -> None:
            try:  # the recording first: a streamer that restarted may need the video decoded again
                if request.finish_stream:
                    await self.publisher.finish(session.streamer, request.session_id, session.video, self.model.fps)
            finally:
                self.publisher.forget(request.session_id)
                await self.host.call(session.video.close)

        await asyncio.shield(finish_then_close())  # finished and closed even when the caller stops waiting
        metrics.SESSIONS.set(len(self.sessions))
        self._closed.set()
        return worker_pb2.CloseSessionResponse()

    async def GetStatus(self, request: worker_pb2.GetStatusRequest, context: Any) -> worker_pb2.GetStatusResponse:
        return worker_pb2.GetStatusResponse(
            worker_id=self.config.worker_id,
            model=self.model.name,
            kv=self.kv_usage(),
            session_ids=list(self.sessions),
        )

    # ---- heartbeats, profiler, drain ------------------------------------------------------------
    def kv_usage(self) -> common_pb2.KVUsage:
        usage = self.pool.usage()
        metrics.KV_PAGES_USED.set(usage.used_pages)
        return common_pb2.KVUsage(
            total_pages=usage.total_pages,
            used_pages=usage.used_pages,
            page_bytes=usage.page_bytes,
            host_pages_used=usage.host_pages_used,
            sessions=usage.sessions,
        )

    def report(self) -> WorkerReport:
        """What the next heartbeat tells kvcache_svc."""
        self.report_capacity_metrics()
        return WorkerReport(
            kv=self.kv_usage(),
            session_ids=list(self.sessions),
            session_reports=self.session_reports(),
            capacity=self.capacity_report(),
            realtime_factor=self.speed.realtime_factor,
        )

    async def register_and_heartbeat(self, address: str, stop: asyncio.Event) -> None:
        """Register with kvcache_svc, then report KV usage until `stop` (re-registering if forgotten)."""
        await self.kvcache.register_and_heartbeat(
            address,
            self.model.name,
            self.config.model_settings,
            describe_device(self.model.dit, self.host.threads),
            self.config.heartbeat_interval_s,
            self.report,
            self.offload,
            stop,
        )

    def start_profiler(self) -> None:
        if self.profiler.enabled:
            self.profiler.add_gauge("kv_pool", lambda: {"used_pages": float(self.pool.usage().used_pages)})
            self.profiler.start()

    async def deregister(self) -> None:
        """Leave placement before draining, so that no new session is admitted here meanwhile (nor once
        the process is gone: kvcache_svc need not wait for missed heartbeats)."""
        self.draining = True
        await self.kvcache.deregister()

    async def drain(self) -> None:
        """Wait for the blocks in flight (they get published and committed), then until the schedulers
        have moved every session elsewhere (each drops its session here: `CloseSession` without
        finishing the stream), so that none waits for a heartbeat timeout; bounded by the server's
        grace (`--grace`, the chart's worker.grace). Health is NOT_SERVING meanwhile."""
        await asyncio.gather(*self.lanes.tickets, return_exceptions=True)
        async with self.host.lock:  # complete now: no block is made here any more
            if self.profiler.enabled and self.config.profile_dir is not None:
                self.profiler.stop()
                self.profiler.write(self.config.profile_dir)
                log.info("profile written to %s", self.config.profile_dir)
        if self.sessions and not self.hand_over:
            log.info(
                "stopping with %d session(s) left here: they resume from their committed blocks", len(self.sessions)
            )
            return
        if self.sessions:
            log.info("draining: %d session(s) to move elsewhere", len(self.sessions))
        while self.sessions:
            self._closed.clear()
            await self._closed.wait()
        log.info("drained: blocks in flight committed, no session left")


def add_to_server(server: grpc.aio.Server, service: WorkerService) -> Registration:
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(service, server)
    return Registration([SERVICE_NAME], drain=service.drain)


def describe_device(dit: torch.nn.Module, threads: int) -> str:
    """What the worker computes on, for operators: the device (on a CPU, the engine thread's torch threads)
    and, for a pod, its ranks."""
    device = next(dit.parameters()).device
    what = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{threads} thread{'s' * (threads != 1)}"
    ranks = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    return f"{device.type}: {ranks} x {what}" if ranks > 1 else f"{device.type}: {what}"
