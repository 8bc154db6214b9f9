"""The Scheduler servicer: validates, admits, places, dispatches blocks, applies commands.

Placement and admission go through kvcache_svc (which knows every worker's KV capacity).
Each running session has one dispatch task that runs its blocks in order on its worker, at most
`lookahead` blocks ahead of real-time playback, applying prompt changes / pause / stop at block
boundaries. A worker that fails mid-session is replaced: the session is re-admitted elsewhere
and the new worker rebuilds the KV cache from the committed blocks (recovery by recompute).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any

import grpc

from inferix.api.v1 import (
    common_pb2,
    kvcache_pb2,
    kvcache_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from inferix.server import Registration, channel
from inferix.store import Store, StoreUnavailableError
from inferix.telemetry import tracer
from scheduler import metrics
from scheduler.auth import ApiKeys, Unauthenticated
from scheduler.playback import Playback
from scheduler.sessions import STATE_NAMES, PendingPrompt, SessionRecord
from scheduler.validation import InvalidRequest, check_prompt_text, validate_spec
from workers.engine.presets import ModelPreset, load_preset

log = logging.getLogger("inferix.scheduler")
SERVICE_NAME = scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}


@dataclass(frozen=True)
class SchedulerConfig:
    kvcache_address: str
    streamer_address: str
    # Address clients use to download recordings (may differ from the internal one).
    streamer_public_address: str = ""
    default_lookahead: int = 2
    block_deadline_s: float = 600.0
    internal_deadline_s: float = 30.0
    max_recoveries: int = 3
    admission_retry_s: float = 1.0
    # Playback URLs (WebRTC page, RTMP) and the session announcement to the streamer.
    playback: Playback = field(default_factory=Playback)


class SchedulerService(scheduler_pb2_grpc.SchedulerServiceServicer):
    def __init__(self, config: SchedulerConfig, store: Store, api_keys: ApiKeys) -> None:
        self.config = config
        self.store = store
        self.api_keys = api_keys
        self.sessions: dict[str, SessionRecord] = {}
        self.kvcache = kvcache_pb2_grpc.KVCacheServiceStub(channel(config.kvcache_address))
        self._workers: dict[str, worker_pb2_grpc.WorkerServiceStub] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._presets: dict[str, ModelPreset] = {}
        self._side_tasks: set[asyncio.Future[None]] = set()

    # ---- helpers ------------------------------------------------------------------------------
    async def _principal(self, context: Any) -> str:
        try:
            return self.api_keys.principal(context.invocation_metadata())
        except Unauthenticated as exc:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
            raise

    async def _session(self, session_id: str, principal: str, context: Any) -> SessionRecord:
        record = self.sessions.get(session_id)
        if record is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"session_id: no session {session_id[:64]!r}")
        assert record is not None
        if record.owner != principal:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "session_id: this session belongs to another key")
        return record

    async def _served_models(self) -> dict[str, ModelPreset]:
        reply = await self.kvcache.ListWorkers(
            kvcache_pb2.ListWorkersRequest(), timeout=self.config.internal_deadline_s
        )
        models = {w.model for w in reply.workers if w.alive}
        for name in models - set(self._presets):
            self._presets[name] = load_preset(name)
        return {name: self._presets[name] for name in models}

    def _worker(self, address: str) -> worker_pb2_grpc.WorkerServiceStub:
        if address not in self._workers:
            self._workers[address] = worker_pb2_grpc.WorkerServiceStub(channel(address))
        return self._workers[address]

    async def _persist(self, record: SessionRecord) -> None:
        """Write the session's record; while the store is away the next write carries the latest state."""
        self._update_gauges()
        try:
            await self.store.put(f"scheduler/sessions/{record.session_id}", record.to_json())
        except StoreUnavailableError as exc:
            log.warning("session %s: store unavailable, record not persisted yet (%s)", record.session_id, exc)

    def _update_gauges(self) -> None:
        counts = dict.fromkeys(STATE_NAMES.values(), 0)
        for record in self.sessions.values():
            counts[STATE_NAMES[record.state]] += 1
        for name, count in counts.items():
            metrics.SESSIONS.labels(state=name).set(count)

    # ---- RPCs ---------------------------------------------------------------------------------
    async def CreateSession(
        self, request: scheduler_pb2.CreateSessionRequest, context: Any
    ) -> scheduler_pb2.CreateSessionResponse:
        principal = await self._principal(context)
        try:
            valid = validate_spec(
                request.spec, await self._served_models(), self.config.default_lookahead, self.config.playback.outputs
            )
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise
        except grpc.aio.AioRpcError as exc:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"placement service unavailable ({exc.code().name}); retry"
            )
            raise
        session_id = uuid.uuid4().hex
        streamer = self.config.streamer_public_address or self.config.streamer_address
        record = SessionRecord(
            session_id,
            principal,
            valid,
            self.config.playback.open(session_id, streamer, valid.spec),
        )
        with tracer("inferix.scheduler").start_as_current_span("scheduler.create_session") as span:
            span.set_attribute("session.id", session_id)
            admitted = await self._admit(record, exclude=[])
            if not admitted and not valid.spec.wait_for_capacity:
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"no worker has room for {valid.shape.pages} KV pages now; retry in a few seconds "
                    "or set spec.wait_for_capacity to queue",
                )
            self.sessions[session_id] = record
            if admitted:
                try:
                    await self._open_on_worker(record)
                except grpc.aio.AioRpcError as exc:
                    del self.sessions[session_id]
                    await self._release(record)
                    await context.abort(exc.code(), exc.details() or "worker refused the session")
            await self._persist(record)
        self._tasks[session_id] = asyncio.create_task(self._run(record), name=f"session-{session_id}")
        return scheduler_pb2.CreateSessionResponse(session=record.to_proto())

    async def GetSession(
        self, request: scheduler_pb2.GetSessionRequest, context: Any
    ) -> scheduler_pb2.GetSessionResponse:
        record = await self._session(request.session_id, await self._principal(context), context)
        return scheduler_pb2.GetSessionResponse(session=record.to_proto())

    async def ListSessions(
        self, request: scheduler_pb2.ListSessionsRequest, context: Any
    ) -> scheduler_pb2.ListSessionsResponse:
        principal = await self._principal(context)
        for state in request.states:
            if state not in STATE_NAMES:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"states: unknown state value {state}")
        states = set(request.states)
        sessions = [
            r.to_proto()
            for r in sorted(self.sessions.values(), key=lambda r: r.created_at)
            if r.owner == principal and (not states or r.state in states)
        ]
        return scheduler_pb2.ListSessionsResponse(sessions=sessions)

    async def CancelSession(
        self, request: scheduler_pb2.CancelSessionRequest, context: Any
    ) -> scheduler_pb2.CancelSessionResponse:
        record = await self._session(request.session_id, await self._principal(context), context)
        if not record.terminal:
            record.cancel_requested = True
            record.wake()
            task = self._tasks.get(record.session_id)
            if task is not None:
                await asyncio.shield(task)
        return scheduler_pb2.CancelSessionResponse(session=record.to_proto())

    async def Interact(
        self, request_iterator: AsyncIterator[scheduler_pb2.InteractRequest], context: Any
    ) -> AsyncIterator[scheduler_pb2.InteractResponse]:
        principal = await self._principal(context)
        try:
            first = await anext(aiter(request_iterator))
        except StopAsyncIteration:
            return
        if first.WhichOneof("command") != "attach":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "command: the first message must be `attach`")
        record = await self._session(first.attach.session_id, principal, context)
        queue = record.subscribe(first.attach.from_block)
        reader = asyncio.create_task(self._read_commands(record, request_iterator))
        try:
            while True:
                event = await queue.get()
                if event is None:
                    return
                yield event
        finally:
            record.unsubscribe(queue)
            reader.cancel()

    async def _read_commands(
        self, record: SessionRecord, requests: AsyncIterator[scheduler_pb2.InteractRequest]
    ) -> None:
        async for request in requests:
            record.publish(self._apply_command(record, request), keep=False)

    def _apply_command(
        self, record: SessionRecord, request: scheduler_pb2.InteractRequest
    ) -> scheduler_pb2.InteractResponse:
        kind = request.WhichOneof("command")

        def error(code: grpc.StatusCode, message: str) -> scheduler_pb2.InteractResponse:
            return scheduler_pb2.InteractResponse(error=scheduler_pb2.ErrorEvent(code=code.value[0], message=message))

        if record.terminal:
            return error(grpc.StatusCode.FAILED_PRECONDITION, f"{kind}: the session has ended")
        if kind == "set_prompt":
            try:
                text = check_prompt_text(request.set_prompt.text, "set_prompt.text")
            except InvalidRequest as exc:
                return error(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            if not record.prompt_bucket.take():
                return error(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    "set_prompt: too many prompt changes (limit 4 per second, bursts of 8); retry shortly",
                )
            record.pending_prompt = PendingPrompt(text, request.set_prompt.recache)
        elif kind == "action":
            return error(grpc.StatusCode.UNIMPLEMENTED, "action: this model takes no actions")
        elif kind == "pause":
            if record.paused_since is None:
                record.paused_since = time.monotonic()
                self._background(self._set_activity(record, paused=True))
            record.set_state(common_pb2.SESSION_STATE_PAUSED, "paused by the client")
        elif kind == "resume":
            if record.paused_since is not None:
                record.paused_total_s += time.monotonic() - record.paused_since
                record.paused_since = None
                self._background(self._set_activity(record, paused=False))
            if record.state == common_pb2.SESSION_STATE_PAUSED:
                record.set_state(common_pb2.SESSION_STATE_RUNNING, "resumed by the client")
        elif kind == "stop":
            record.stop_requested = True
        else:
            return error(grpc.StatusCode.INVALID_ARGUMENT, f"command: unexpected {kind or 'empty'} command")
        record.wake()
        return scheduler_pb2.InteractResponse(
            accepted=scheduler_pb2.CommandAccepted(applies_at_block=record.boundary, command=kind)
        )

    def _background(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    async def _set_activity(self, record: SessionRecord, paused: bool) -> None:
        """Tell kvcache_svc (a paused session's pages go to host memory); on resume, prefetch them back."""
        try:
            await self.kvcache.SetSessionActivity(
                kvcache_pb2.SetSessionActivityRequest(session_id=record.session_id, paused=paused),
                timeout=self.config.internal_deadline_s,
            )
            if not paused and record.worker_address:
                await self._worker(record.worker_address).PrefetchSession(
                    worker_pb2.PrefetchSessionRequest(session_id=record.session_id),
                    timeout=self.config.internal_deadline_s,
                )
        except grpc.aio.AioRpcError as exc:  # an optimisation: the next block restores pages anyway
            log.warning("activity update of %s failed: %s", record.session_id, exc.details())

    # ---- placement ----------------------------------------------------------------------------
    async def _admit(self, record: SessionRecord, exclude: list[str]) -> bool:
        try:
            reply = await self.kvcache.Admit(
                kvcache_pb2.AdmitRequest(
                    session_id=record.session_id,
                    model=record.spec.model,
                    pages=record.valid.shape.pages,
                    exclude_workers=exclude,
                ),
                timeout=self.config.internal_deadline_s,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.NOT_FOUND):
                return False
            if exc.code() in RETRYABLE and record.session_id in self.sessions:
                log.warning("admission of %s: kvcache_svc unreachable (%s); retrying", record.session_id, exc.code())
                return False  # a running or queued session waits for kvcache_svc to come back
            raise
        record.worker_id = reply.worker.worker_id
        record.worker_address = reply.worker.address
        return True

    async def _open_on_worker(self, record: SessionRecord) -> None:
        reply = await self._worker(record.worker_address).OpenSession(
            worker_pb2.OpenSessionRequest(
                session_id=record.session_id, spec=record.spec, streamer_address=self.config.streamer_address
            ),
            timeout=self.config.block_deadline_s,
        )
        record.next_block = reply.next_block

    async def _release(self, record: SessionRecord) -> None:
        try:
            await self.kvcache.Release(
                kvcache_pb2.ReleaseRequest(session_id=record.session_id), timeout=self.config.internal_deadline_s
            )
        except grpc.aio.AioRpcError as exc:
            log.warning("release of %s failed: %s", record.session_id, exc.details())

    # ---- the dispatch loop --------------------------------------------------------------------
    async def _run(self, record: SessionRecord) -> None:
        state: int = common_pb2.SESSION_STATE_FAILED
        reason = "internal error"
        try:
            while not record.worker_address:  # queued: wait for capacity
                if record.cancel_requested:
                    state, reason = common_pb2.SESSION_STATE_CANCELLED, "cancelled while queued"
                    return
                if await self._admit(record, exclude=[]):
                    await self._open_on_worker(record)
                else:
                    await record.wait(self.config.admission_retry_s)
            record.set_state(common_pb2.SESSION_STATE_RUNNING, f"running on {record.worker_id}")
            await self._persist(record)
            state, reason = await self._dispatch_blocks(record)
        except Exception as exc:  # a session failure must never take the scheduler down
            log.exception("session %s failed", record.session_id)
            record.error = f"{type(exc).__name__}: {exc}"
            record.publish(
                scheduler_pb2.InteractResponse(
                    error=scheduler_pb2.ErrorEvent(code=grpc.StatusCode.INTERNAL.value[0], message=record.error)
                )
            )
            state, reason = common_pb2.SESSION_STATE_FAILED, record.error
        finally:
            # Outputs are finalized (MP4 written) before anyone is told the session ended.
            await self._finish(record)
            record.set_state(state, reason)
            await self._persist(record)

    async def _dispatch_blocks(self, record: SessionRecord) -> tuple[int, str]:
        """Run blocks until the session ends; returns its final state and the reason."""
        spec = record.spec
        schedule = {c.at_block: c for c in spec.prompts}
        preset = self._presets[spec.model]
        fps = float(preset.video.fps)
        frames_per_block = record.valid.shape.video_frames_per_block
        recoveries = 0
        while True:
            if record.cancel_requested:
                return common_pb2.SESSION_STATE_CANCELLED, "cancelled by the client"
            if record.stop_requested or (record.valid.num_blocks and record.next_block >= record.valid.num_blocks):
                return common_pb2.SESSION_STATE_COMPLETED, "stopped" if record.stop_requested else "done"
            if record.paused_since is not None:
                await record.wait(None)
                continue
            ahead = record.next_block * frames_per_block - record.playback_frame(fps)
            if record.first_block_at is not None and ahead > record.valid.lookahead * frames_per_block:
                await record.wait((ahead - record.valid.lookahead * frames_per_block) / fps)
                continue
            block = record.next_block
            recache = False
            if block in schedule:
                record.current_prompt, recache = schedule[block].text, schedule[block].recache
            if record.pending_prompt is not None:
                record.current_prompt, recache = record.pending_prompt.text, record.pending_prompt.recache
                record.pending_prompt = None
            try:
                await self._run_block(record, block, recache)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in RETRYABLE or recoveries >= self.config.max_recoveries:
                    raise
                recoveries += 1
                await self._recover(record, exc)

    async def _run_block(self, record: SessionRecord, block: int, recache: bool) -> None:
        record.in_flight = block
        started = time.perf_counter()
        try:
            with tracer("inferix.scheduler").start_as_current_span(
                "scheduler.block", attributes={"session.id": record.session_id, "block.index": block}
            ):
                call_started = time.perf_counter()
                reply = await self._worker(record.worker_address).RunBlock(
                    worker_pb2.RunBlockRequest(
                        session_id=record.session_id, block_index=block, prompt=record.current_prompt, recache=recache
                    ),
                    timeout=self.config.block_deadline_s,
                )
                call_s = time.perf_counter() - call_started
        finally:
            record.in_flight = None
        event = reply.block
        elapsed = time.perf_counter() - started
        event.timings.dispatch_to_done_ms = elapsed * 1e3
        record.next_block = block + 1
        if record.first_block_at is None:
            record.first_block_at = time.monotonic()
            metrics.TIME_TO_FIRST_BLOCK.observe(time.time() - record.created_at)
        metrics.BLOCKS.inc()
        metrics.BLOCK_LATENCY.observe(elapsed)
        record.publish(scheduler_pb2.InteractResponse(block=event))
        await self._persist(record)
        metrics.DISPATCH_OVERHEAD.observe(time.perf_counter() - started - call_s)

    async def _recover(self, record: SessionRecord, failure: grpc.aio.AioRpcError) -> None:
        failed = record.worker_id
        log.warning("worker %s failed on session %s (%s); re-placing", failed, record.session_id, failure.code())
        record.publish(
            scheduler_pb2.InteractResponse(
                state=scheduler_pb2.StateChange(state=record.state, reason=f"worker {failed} failed; recovering")  # type: ignore[arg-type]
            )
        )
        await self._release(record)
        deadline = time.monotonic() + self.config.block_deadline_s
        while not await self._admit(record, exclude=[failed]):
            if time.monotonic() > deadline or record.cancel_requested:
                raise RuntimeError(f"no worker could take over session {record.session_id} after {failed} failed")
            await record.wait(self.config.admission_retry_s)
        await self._open_on_worker(record)
        metrics.RECOVERIES.inc()
        log.info("session %s continues on %s from block %d", record.session_id, record.worker_id, record.next_block)

    async def _finish(self, record: SessionRecord) -> None:
        if record.worker_address:
            try:
                await self._worker(record.worker_address).CloseSession(
                    worker_pb2.CloseSessionRequest(session_id=record.session_id, finish_stream=True),
                    timeout=self.config.internal_deadline_s,
                )
            except grpc.aio.AioRpcError as exc:
                log.warning("closing %s on %s failed: %s", record.session_id, record.worker_id, exc.details())
            await self._release(record)
        self._tasks.pop(record.session_id, None)

    async def drain(self) -> None:
        """On SIGTERM: stop every session at its next block boundary (committed blocks are kept)."""
        for record in self.sessions.values():
            record.stop_requested = True
            record.wake()
        if self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)


def add_to_server(server: grpc.aio.Server, service: SchedulerService) -> Registration:
    scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(service, server)
    return Registration([SERVICE_NAME], drain=service.drain)
