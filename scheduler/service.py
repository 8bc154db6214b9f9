"""The Scheduler servicer: validates, admits, places, dispatches blocks, applies commands.

Placement and admission go through kvcache_svc (which knows every worker's KV capacity).
Each running session has one dispatch task that runs its blocks in order on its worker, at most
`lookahead` blocks ahead of real-time playback, applying prompt changes / pause / stop at block
boundaries. A worker that fails mid-session is replaced: the session is re-admitted elsewhere
and the new worker rebuilds the KV cache from the committed blocks (recovery by recompute).

Placement never settles on a worker it cannot reach: a transport failure of `OpenSession` (or a
worker that stops answering health probes during a call) excludes that worker, reports it to
kvcache_svc (no admission on it until it heartbeats again) and tries the next one.

With a persistent store (Redis) the scheduler itself may restart at any time: every session's
record is written after each block and each command, a SIGTERM hands the live sessions over at a
block boundary (it does not end them), and a new scheduler resumes every unfinished session from
its record; the worker (or, if it died too, a successor restoring the committed blocks) tells it
which blocks were made meanwhile, so clients see every block exactly once. With the in-memory
store nothing survives the process: its sessions end as failed, never as completed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

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
from scheduler.sessions import STATE_NAMES, CorruptRecord, PendingPrompt, SessionRecord
from scheduler.validation import ALL_OUTPUTS, InvalidRequest, ValidSpec, check_prompt_text, validate_spec
from workers.engine.presets import ModelPreset, load_preset

log = logging.getLogger("inferix.scheduler")
T = TypeVar("T")
SERVICE_NAME = scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
SESSIONS_PREFIX = "scheduler/sessions/"
NO_PERSISTENT_STORE = "scheduler restarted without a persistent store (run it with --redis-url to keep sessions)"


class WorkerUnresponsive(Exception):
    """A worker accepted a call but stopped answering health probes (e.g. a stopped process)."""


def worker_failed(exc: BaseException) -> bool:
    """The worker could not be reached or stopped answering: move its sessions elsewhere."""
    if isinstance(exc, WorkerUnresponsive):
        return True
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() in RETRYABLE


class PlacementUnavailable(Exception):
    """kvcache_svc (placement) cannot be reached."""


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
    # A worker busy with a call is probed (gRPC health) this often; this many missed probes in a row
    # (each with the timeout) mean it hangs, and its session moves.
    probe_interval_s: float = 2.0
    probe_timeout_s: float = 3.0
    probe_misses: int = 3
    # Playback URLs (WebRTC page, RTMP) and the session announcement to the streamer.
    playback: Playback = field(default_factory=Playback)


class SchedulerService(scheduler_pb2_grpc.SchedulerServiceServicer):
    def __init__(self, config: SchedulerConfig, store: Store, api_keys: ApiKeys) -> None:
        self.config = config
        self.store = store
        self.api_keys = api_keys
        self.sessions: dict[str, SessionRecord] = {}
        self.kvcache = kvcache_pb2_grpc.KVCacheServiceStub(channel(config.kvcache_address))
        self._workers: dict[str, tuple[worker_pb2_grpc.WorkerServiceStub, health_pb2_grpc.HealthStub]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._presets: dict[str, ModelPreset] = {}
        self._side_tasks: set[asyncio.Future[None]] = set()
        # Sessions found on workers that no record describes (a restart without a persistent store): id -> reason.
        self.lost: dict[str, str] = {}
        self.loaded = asyncio.Event()  # stored sessions are back in `sessions`
        self.stopping = False

    # ---- helpers ------------------------------------------------------------------------------
    async def _principal(self, context: Any) -> str:
        try:
            return self.api_keys.principal(context.invocation_metadata())
        except Unauthenticated as exc:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
            raise

    async def _session(self, session_id: str, principal: str, context: Any) -> SessionRecord:
        await self._wait_loaded(context)
        record = self.sessions.get(session_id)
        if record is None:
            if session_id in self.lost:
                await context.abort(
                    grpc.StatusCode.NOT_FOUND, f"session_id: session {session_id} failed: {self.lost[session_id]}"
                )
            await context.abort(grpc.StatusCode.NOT_FOUND, f"session_id: no session {session_id[:64]!r}")
        assert record is not None
        if record.owner != principal:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "session_id: this session belongs to another key")
        return record

    async def _wait_loaded(self, context: Any) -> None:
        """Requests wait (briefly) for the stored sessions to be loaded after a restart."""
        try:
            await asyncio.wait_for(self.loaded.wait(), self.config.internal_deadline_s)
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "the scheduler is still loading its sessions (store unavailable?); retry"
            )

    async def _served_models(self) -> dict[str, ModelPreset]:
        """Models of the registered workers that are up (a suspect one still counts: it may come back)."""
        reply = await self.kvcache.ListWorkers(
            kvcache_pb2.ListWorkersRequest(), timeout=self.config.internal_deadline_s
        )
        return {name: self._preset(name) for name in {w.model for w in reply.workers if w.alive or w.suspect}}

    def _preset(self, model: str) -> ModelPreset:
        if model not in self._presets:
            self._presets[model] = load_preset(model)
        return self._presets[model]

    def _revalidate(self, spec: common_pb2.SessionSpec) -> ValidSpec:
        """A stored spec back to a `ValidSpec` (it passed validation when the session was created)."""
        return validate_spec(spec, {spec.model: self._preset(spec.model)}, self.config.default_lookahead, ALL_OUTPUTS)

    def _worker(self, address: str) -> worker_pb2_grpc.WorkerServiceStub:
        return self._stubs(address)[0]

    def _stubs(self, address: str) -> tuple[worker_pb2_grpc.WorkerServiceStub, health_pb2_grpc.HealthStub]:
        """The worker's service and its health checks, over one channel."""
        if address not in self._workers:
            shared = channel(address)
            self._workers[address] = (worker_pb2_grpc.WorkerServiceStub(shared), health_pb2_grpc.HealthStub(shared))
        return self._workers[address]

    async def _watched(self, address: str, call: Awaitable[T]) -> T:
        """Await a call to a worker while probing its health: a worker that accepted the call but
        stopped answering (a stopped or wedged process) raises `WorkerUnresponsive` within
        about `probe_misses * (probe_interval_s + probe_timeout_s)`, whatever the call's deadline."""
        task = asyncio.ensure_future(call)
        health = self._stubs(address)[1]
        misses = 0
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self.config.probe_interval_s)
                if done:
                    return task.result()
                try:
                    await health.Check(health_pb2.HealthCheckRequest(), timeout=self.config.probe_timeout_s)
                    misses = 0
                except grpc.aio.AioRpcError:
                    misses += 1
                    if misses >= self.config.probe_misses and not task.done():
                        raise WorkerUnresponsive(
                            f"the worker missed {misses} health probes in a row during the call"
                        ) from None
        finally:
            if not task.done():
                task.cancel()

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
        await self._wait_loaded(context)
        if self.stopping:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the scheduler is shutting down; retry")
        unavailable = "the placement service is unavailable; retry in a few seconds"
        try:
            valid = validate_spec(
                request.spec, await self._served_models(), self.config.default_lookahead, self.config.playback.outputs
            )
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise
        except grpc.aio.AioRpcError:
            await context.abort(grpc.StatusCode.UNAVAILABLE, unavailable)
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
            try:
                placed = await self._place(record)
            except PlacementUnavailable:
                await context.abort(grpc.StatusCode.UNAVAILABLE, unavailable)
                raise
            except grpc.aio.AioRpcError as exc:  # the worker refused the session itself (e.g. its size)
                await self._release(record)
                await context.abort(exc.code(), exc.details() or "the worker refused the session")
                raise
            if not placed and not valid.spec.wait_for_capacity:
                await self._release(record)
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"no live worker has room for this session ({valid.shape.pages} KV pages of model "
                    f"{valid.spec.model!r}) now; retry in a few seconds or set spec.wait_for_capacity to queue",
                )
            self.sessions[session_id] = record
            await self._persist(record)
        self._start(record)
        return scheduler_pb2.CreateSessionResponse(session=record.to_proto())

    def _start(self, record: SessionRecord) -> None:
        self._tasks[record.session_id] = asyncio.create_task(self._run(record), name=f"session-{record.session_id}")

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
                    if not record.terminal:  # handed over at a shutdown: the SDK re-attaches to the next scheduler
                        await context.abort(grpc.StatusCode.UNAVAILABLE, "the scheduler is restarting; re-attach")
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
        """Reserve KV room on a live worker (False: none has room, or none serves the model).

        Raises `PlacementUnavailable` when kvcache_svc cannot be reached."""
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
            if exc.code() in RETRYABLE:
                raise PlacementUnavailable(f"kvcache_svc: {exc.code().name}") from exc
            raise
        record.worker_id = reply.worker.worker_id
        record.worker_address = reply.worker.address
        return True

    async def _place(self, record: SessionRecord) -> bool:
        """Admit and open the session on a live worker; False when no live worker has room now.

        A worker that cannot be reached is reported to kvcache_svc and skipped, so a departed or
        hung worker never keeps a session (or a client) waiting.
        """
        excluded: list[str] = []  # unreachable on this attempt
        while await self._admit(record, excluded):
            try:
                await self._open_on_worker(record)
                return True
            except (grpc.aio.AioRpcError, WorkerUnresponsive) as exc:
                if not worker_failed(exc):
                    raise
                log.warning("session %s: worker %s unreachable on open (%s); trying another worker",
                            record.session_id, record.worker_id, _describe(exc))  # fmt: skip
                await self._report_failure(record.worker_id, f"OpenSession: {_describe(exc)}")
                excluded.append(record.worker_id)
                record.worker_id = record.worker_address = ""
        return False

    async def _try_place(self, record: SessionRecord) -> bool:
        """`_place` for a session that waits: kvcache_svc being away is one more reason to wait."""
        try:
            return await self._place(record)
        except PlacementUnavailable as exc:
            log.warning("session %s waits for placement: %s", record.session_id, exc)
            return False

    async def _report_failure(self, worker_id: str, reason: str) -> None:
        try:
            await self.kvcache.ReportWorkerFailure(
                kvcache_pb2.ReportWorkerFailureRequest(worker_id=worker_id, reason=reason),
                timeout=self.config.internal_deadline_s,
            )
        except grpc.aio.AioRpcError as exc:  # placement still excludes it for this session
            log.warning("could not report worker %s as failed: %s", worker_id, exc.code().name)

    async def _open_on_worker(self, record: SessionRecord) -> None:
        """Open (or find open) the session on its worker; announce blocks made while nobody listened."""
        reply = await self._watched(
            record.worker_address,
            self._worker(record.worker_address).OpenSession(
                worker_pb2.OpenSessionRequest(
                    session_id=record.session_id,
                    spec=record.spec,
                    streamer_address=self.config.streamer_address,
                    # A resumed record has no event history yet: ask for every block the worker knows.
                    announced_blocks=0 if record.history_missing else record.announced_blocks,
                ),
                timeout=self.config.block_deadline_s,
            ),
        )
        record.next_block = reply.next_block
        if record.history_missing:
            record.restore_history(list(reply.blocks))
        for event in reply.blocks:  # in block order
            self._announce(record, event)

    def _announce(self, record: SessionRecord, event: common_pb2.BlockEvent) -> None:
        """Publish a block's event once, in order (a block re-made after a failure is not announced again)."""
        if event.block_index < record.announced_blocks:
            return
        record.announced_blocks = event.block_index + 1
        record.publish(scheduler_pb2.InteractResponse(block=event))

    async def _release(self, record: SessionRecord) -> None:
        try:
            await self.kvcache.Release(
                kvcache_pb2.ReleaseRequest(session_id=record.session_id), timeout=self.config.internal_deadline_s
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:  # NOT_FOUND: it held no reservation
                log.warning("release of %s failed: %s", record.session_id, exc.details())

    # ---- the dispatch loop --------------------------------------------------------------------
    async def _run(self, record: SessionRecord) -> None:
        """Drive the session to its end, or until a scheduler shutdown hands it over (then it stays
        unfinished in the store, for the next scheduler to resume)."""
        outcome: tuple[int, str] | None
        try:
            outcome = await self._drive(record)
        except asyncio.CancelledError:
            return  # shutdown past its grace period: the stored record resumes elsewhere
        except Exception as exc:  # a session failure must never take the scheduler down
            log.exception("session %s failed", record.session_id)
            record.error = f"{type(exc).__name__}: {exc}"
            record.publish(
                scheduler_pb2.InteractResponse(
                    error=scheduler_pb2.ErrorEvent(code=grpc.StatusCode.INTERNAL.value[0], message=record.error)
                )
            )
            outcome = common_pb2.SESSION_STATE_FAILED, record.error
        if outcome is None:
            await self._persist(record)
            self._tasks.pop(record.session_id, None)
            return
        state, reason = outcome
        if state == common_pb2.SESSION_STATE_FAILED and not record.error:
            record.error = reason
        # Outputs are finalized (MP4 written) before anyone is told the session ended.
        await self._finish(record)
        record.set_state(state, reason)
        await self._persist(record)

    async def _drive(self, record: SessionRecord) -> tuple[int, str] | None:
        """Place the session if needed, then run its blocks; its final (state, reason), or None
        when the scheduler is handing it over."""
        while not record.worker_address:  # queued, or resumed by a new scheduler: find a worker
            if record.cancel_requested:
                return common_pb2.SESSION_STATE_CANCELLED, "cancelled while queued"
            if self.stopping:
                return self._handover(record)
            if not await self._try_place(record):
                await record.wait(self.config.admission_retry_s)
        if record.paused_since is None:
            record.set_state(common_pb2.SESSION_STATE_RUNNING, f"running on {record.worker_id}")
        await self._persist(record)
        return await self._dispatch_blocks(record)

    def _handover(self, record: SessionRecord) -> tuple[int, str] | None:
        """At a shutdown: None (resume it later) with a persistent store, else the session ends as failed."""
        if self.store.persistent:
            return None
        return common_pb2.SESSION_STATE_FAILED, NO_PERSISTENT_STORE

    async def _dispatch_blocks(self, record: SessionRecord) -> tuple[int, str] | None:
        """Run blocks until the session ends; returns its final state and the reason (None: handed over)."""
        spec = record.spec
        schedule = {c.at_block: c for c in spec.prompts}
        preset = self._preset(spec.model)
        fps = float(preset.video.fps)
        frames_per_block = record.valid.shape.video_frames_per_block
        recoveries = 0
        while True:
            if record.cancel_requested:
                return common_pb2.SESSION_STATE_CANCELLED, "cancelled by the client"
            if record.stop_requested or (record.valid.num_blocks and record.next_block >= record.valid.num_blocks):
                return common_pb2.SESSION_STATE_COMPLETED, "stopped" if record.stop_requested else "done"
            if self.stopping:
                return self._handover(record)
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
            except (grpc.aio.AioRpcError, WorkerUnresponsive) as exc:
                if not worker_failed(exc) or recoveries >= self.config.max_recoveries:
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
                reply = await self._watched(
                    record.worker_address,
                    self._worker(record.worker_address).RunBlock(
                        worker_pb2.RunBlockRequest(
                            session_id=record.session_id,
                            block_index=block,
                            prompt=record.current_prompt,
                            recache=recache,
                        ),
                        timeout=self.config.block_deadline_s,
                    ),
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
        self._announce(record, event)
        await self._persist(record)
        metrics.DISPATCH_OVERHEAD.observe(time.perf_counter() - started - call_s)

    async def _recover(self, record: SessionRecord, failure: BaseException) -> None:
        failed = record.worker_id
        log.warning("worker %s failed on session %s (%s); re-placing", failed, record.session_id, _describe(failure))
        record.publish(
            scheduler_pb2.InteractResponse(
                state=scheduler_pb2.StateChange(state=record.state, reason=f"worker {failed} failed; recovering")  # type: ignore[arg-type]
            )
        )
        # Reported, not excluded: kvcache_svc admits nothing on it until it heartbeats again, so the same
        # worker id is eligible once it has restarted (the only worker of a small mesh, a StatefulSet pod).
        await self._report_failure(failed, f"{_describe(failure)} during a block")
        record.worker_id = record.worker_address = ""
        deadline = time.monotonic() + self.config.block_deadline_s
        while not await self._try_place(record):
            if time.monotonic() > deadline or record.cancel_requested:
                raise RuntimeError(f"no worker could take over session {record.session_id} after {failed} failed")
            await record.wait(self.config.admission_retry_s)
        await self._persist(record)
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

    # ---- restarts -----------------------------------------------------------------------------
    async def resume(self) -> None:
        """On start: load the stored sessions, resume the unfinished ones, and close sessions that
        workers still run but no record describes (their scheduler died with an in-memory store)."""
        delay = 0.2
        while True:
            try:
                keys = await self.store.list_prefix(SESSIONS_PREFIX)
                values = await self.store.get_many(keys)
                break
            except StoreUnavailableError as exc:
                log.warning("cannot load stored sessions yet (%s); retrying", exc)
                await asyncio.sleep(delay)
                delay = min(2 * delay, 5.0)
        resumed = 0
        for key, data in zip(keys, values, strict=True):
            session_id = key.removeprefix(SESSIONS_PREFIX)
            if data is None:
                continue
            try:
                record = SessionRecord.from_json(data, self._revalidate)
            except (CorruptRecord, InvalidRequest) as exc:
                log.error("session %s: stored record is unreadable (%s); skipped", session_id, exc)
                continue
            self.sessions[record.session_id] = record
            if not record.terminal:
                record.publish(
                    scheduler_pb2.InteractResponse(
                        state=scheduler_pb2.StateChange(state=record.state, reason="resumed by a restarted scheduler")  # type: ignore[arg-type]
                    )
                )
                self._start(record)
                resumed += 1
        orphans = await self._find_orphans()
        self._update_gauges()
        self.loaded.set()
        if resumed:
            log.info("resumed %d unfinished session(s) from the store", resumed)
        for address, session_id in orphans:
            await self._close_orphan(address, session_id)

    async def _find_orphans(self) -> list[tuple[str, str]]:
        """(worker address, session id) of sessions that workers run but no record describes (their
        scheduler died with an in-memory store); they are answered for as failed from now on."""
        probe_s = self.config.probe_timeout_s
        try:
            reply = await self.kvcache.ListWorkers(kvcache_pb2.ListWorkersRequest(), timeout=probe_s)
        except grpc.aio.AioRpcError as exc:
            log.warning("cannot look for orphaned sessions: kvcache_svc %s", exc.code().name)
            return []
        orphans = []
        for worker in reply.workers:
            if not worker.alive:
                continue
            try:
                status = await self._worker(worker.address).GetStatus(worker_pb2.GetStatusRequest(), timeout=probe_s)
            except grpc.aio.AioRpcError:
                continue
            for session_id in status.session_ids:
                if session_id not in self.sessions:
                    self.lost[session_id] = NO_PERSISTENT_STORE
                    orphans.append((worker.address, session_id))
        return orphans

    async def _close_orphan(self, address: str, session_id: str) -> None:
        """Finish an orphaned session's outputs (its MP4 is written) and free its room."""
        log.warning("session %s has no record (%s); closing it", session_id, NO_PERSISTENT_STORE)
        try:
            await self._worker(address).CloseSession(
                worker_pb2.CloseSessionRequest(session_id=session_id, finish_stream=True),
                timeout=self.config.internal_deadline_s,
            )
        except grpc.aio.AioRpcError as exc:
            log.warning("closing orphaned session %s failed: %s", session_id, exc.code().name)
        with contextlib.suppress(grpc.aio.AioRpcError):
            await self.kvcache.Release(
                kvcache_pb2.ReleaseRequest(session_id=session_id), timeout=self.config.internal_deadline_s
            )

    async def drain(self) -> None:
        """On SIGTERM: every session stops at its next block boundary. With a persistent store it is
        handed over (left unfinished for the next scheduler, on the same worker); without one it
        ends as failed, its outputs finalized."""
        self.stopping = True
        for record in self.sessions.values():
            record.wake()
        if self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        for record in self.sessions.values():
            record.close_subscribers()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code().name
    return str(exc)


def add_to_server(server: grpc.aio.Server, service: SchedulerService) -> Registration:
    scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(service, server)

    async def on_start(_port: int) -> None:
        service._background(service.resume())

    return Registration([SERVICE_NAME], drain=service.drain, on_start=on_start)
