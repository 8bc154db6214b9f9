"""The Scheduler's gRPC surface: `SchedulerServicer` authenticates each call, validates requests,
applies interactive commands to the session records and turns errors into gRPC status codes;
`create_servicer` wires it to kvcache_svc and the workers over gRPC, and `add_to_server` registers it.

What happens to a session after CreateSession is `scheduler.dispatch`'s job; where it runs is
`scheduler.hosting`'s.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from inferix.api.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from inferix.server import Registration
from inferix.spec.served import ServedPreset
from inferix.store import Store
from inferix.telemetry import SESSION_ID_ATTR, tracer
from scheduler.auth import ApiKeys, Unauthenticated
from scheduler.config import Presets, SchedulerConfig
from scheduler.dispatch import Dispatcher
from scheduler.grpc_clients import GrpcKVCache, GrpcWorkers
from scheduler.hosting import CallFailed, Placement, PlacementUnavailable
from scheduler.quotas import QuotaExceeded
from scheduler.sessions import (
    ACTION_BURST,
    ACTION_RATE_PER_S,
    MAX_UNREAD_EVENTS,
    STATE_NAMES,
    PendingAction,
    PendingPrompt,
    SessionRecord,
    TokenBucket,
)
from scheduler.table import SessionTable
from scheduler.validation import InvalidRequest, check_prompt_text, validate_action, validate_spec

SERVICE_NAME = scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name
# A stream whose client sends this many commands past its rate limit is ended.
MAX_REFUSED_COMMANDS = 500
MALFORMED = "a malformed InteractRequest (not the inferix.v1 protobuf); the stream was closed"
FLOODED = "command: the stream kept sending commands past its limit and was closed; re-attach and slow down"
UNREAD = "events: the client left {} events unread and its stream was closed; re-attach with from_block to continue"


class _Flooded(Exception):
    """A stream's client kept sending commands past its limit."""


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServiceServicer):
    def __init__(
        self,
        config: SchedulerConfig,
        api_keys: ApiKeys,
        table: SessionTable,
        placement: Placement,
        dispatcher: Dispatcher,
        presets: Presets,
    ) -> None:
        self.config = config
        self.api_keys = api_keys
        self.table = table
        self.placement = placement
        self.dispatcher = dispatcher
        self.presets = presets
        self._side_tasks: set[asyncio.Future[None]] = set()

    # ---- helpers ------------------------------------------------------------------------------
    async def _principal(self, context: Any) -> str:
        acting = getattr(context, "acting_principal", None)  # a viewer call (`scheduler.viewer_gateway`)
        if isinstance(acting, str):
            return acting
        try:
            return self.api_keys.principal(context.invocation_metadata())
        except Unauthenticated as exc:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
            raise

    async def _session(self, session_id: str, principal: str, context: Any) -> SessionRecord:
        await self._wait_loaded(context)
        record = self.table.records.get(session_id)
        if record is None:
            if session_id in self.table.lost:
                await context.abort(
                    grpc.StatusCode.NOT_FOUND, f"session_id: session {session_id} failed: {self.table.lost[session_id]}"
                )
            await context.abort(grpc.StatusCode.NOT_FOUND, f"session_id: no session {session_id[:64]!r}")
        assert record is not None
        if record.owner != principal:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "session_id: this session belongs to another key")
        return record

    async def _wait_loaded(self, context: Any) -> None:
        """Requests wait (briefly) for the stored sessions to be loaded after a restart."""
        try:
            await asyncio.wait_for(self.table.loaded.wait(), self.config.internal_deadline_s)
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "the scheduler is still loading its sessions (store unavailable?); retry"
            )

    async def _served_models(self) -> dict[str, ServedPreset]:
        served = await self.placement.served_models()
        self.presets.learn(served)
        return {name: self.presets.get(name) for name in served}

    def background(self, work: Awaitable[None]) -> None:
        """Run `work` alongside the calls, holding a reference until it is done."""
        task = asyncio.ensure_future(work)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    # ---- RPCs ---------------------------------------------------------------------------------
    async def CreateSession(
        self, request: scheduler_pb2.CreateSessionRequest, context: Any
    ) -> scheduler_pb2.CreateSessionResponse:
        principal = await self._principal(context)
        await self._wait_loaded(context)
        if self.dispatcher.stopping:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the scheduler is shutting down; retry")
        unavailable = "the placement service is unavailable; retry in a few seconds"
        try:
            valid = validate_spec(
                request.spec, await self._served_models(), self.config.default_lookahead, self.config.playback.outputs
            )
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise
        except CallFailed:
            await context.abort(grpc.StatusCode.UNAVAILABLE, unavailable)
            raise
        open_sessions = sum(1 for r in self.table.records.values() if r.owner == principal and not r.terminal)
        try:
            self.api_keys.quotas.check_create(principal, open_sessions, valid.num_blocks)
        except QuotaExceeded as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        session_id = uuid.uuid4().hex
        streamer = self.config.streamer_public_address or self.config.streamer_address
        record = SessionRecord(
            session_id,
            principal,
            valid,
            self.config.playback.open(session_id, streamer, valid.spec),
        )
        with tracer("inferix.scheduler").start_as_current_span("scheduler.create_session") as span:
            span.set_attribute(SESSION_ID_ATTR, session_id)
            try:
                placed = await self.placement.place(record)
            except PlacementUnavailable:
                await context.abort(grpc.StatusCode.UNAVAILABLE, unavailable)
                raise
            except grpc.aio.AioRpcError as exc:  # the worker refused the session itself (e.g. its size)
                await self.placement.release(record)
                await context.abort(exc.code(), exc.details() or "the worker refused the session")
                raise
            if not placed and not valid.spec.wait_for_capacity:
                await self.placement.release(record)
                # kvcache_svc's refusal says, worker by worker, which room is missing (KV pages, real-time streams).
                refusal = record.no_room or (
                    f"no live worker has room for this session ({valid.shape.pages} KV pages of model "
                    f"{valid.spec.model!r}) now; retry in a few seconds"
                )
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{refusal}; or set spec.wait_for_capacity to queue the session until there is room",
                )
            self.table.records[session_id] = record
            await self.table.persist(record)
        self.dispatcher.start(record)
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
            for r in sorted(self.table.records.values(), key=lambda r: r.created_at)
            if r.owner == principal and (not states or r.state in states)
        ]
        return scheduler_pb2.ListSessionsResponse(sessions=sessions)

    async def CancelSession(
        self, request: scheduler_pb2.CancelSessionRequest, context: Any
    ) -> scheduler_pb2.CancelSessionResponse:
        record = await self._session(request.session_id, await self._principal(context), context)
        await self.dispatcher.cancel(record)
        return scheduler_pb2.CancelSessionResponse(session=record.to_proto())

    async def Interact(
        self, request_iterator: AsyncIterator[scheduler_pb2.InteractRequest], context: Any
    ) -> AsyncIterator[scheduler_pb2.InteractResponse]:
        principal = await self._principal(context)
        try:
            first = await anext(aiter(request_iterator))
        except StopAsyncIteration:
            return
        except DecodeError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{MALFORMED}: {exc}")
        if first.WhichOneof("command") != "attach":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "command: the first message must be `attach`")
        record = await self._session(first.attach.session_id, principal, context)
        quotas = self.api_keys.quotas
        try:
            quotas.open_stream(principal)
        except QuotaExceeded as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        queue = record.subscribe(first.attach.from_block)
        # Set by the command reader when the client's commands end its stream: (status, why).
        closing: asyncio.Future[tuple[grpc.StatusCode, str]] = asyncio.get_running_loop().create_future()
        reader = asyncio.create_task(self._read_commands(record, request_iterator, principal, closing))
        try:
            while True:
                getting = asyncio.ensure_future(queue.get())
                await asyncio.wait((getting, closing), return_when=asyncio.FIRST_COMPLETED)
                if not getting.done():
                    getting.cancel()
                    await context.abort(*closing.result())
                event = getting.result()
                if event is None:
                    if queue.overflowed:
                        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, UNREAD.format(MAX_UNREAD_EVENTS))
                    if not record.terminal:  # handed over at a shutdown: the SDK re-attaches to the next scheduler
                        await context.abort(grpc.StatusCode.UNAVAILABLE, "the scheduler is restarting; re-attach")
                    return
                yield event
        finally:
            quotas.close_stream(principal)
            record.unsubscribe(queue)
            reader.cancel()
            closing.cancel()

    async def _read_commands(
        self,
        record: SessionRecord,
        requests: AsyncIterator[scheduler_pb2.InteractRequest],
        principal: str,
        closing: asyncio.Future[tuple[grpc.StatusCode, str]],
    ) -> None:
        """Apply the stream's commands, at most the key's `commands_per_second` (bursts of twice that):
        beyond, each is refused; a stream that keeps flooding, or sends a malformed message, is ended
        (`closing` says how)."""
        rate = self.api_keys.quotas.of(principal).commands_per_second
        bucket = TokenBucket(rate=float(rate), burst=2 * rate) if rate else None
        try:
            await self._apply_commands(record, requests, bucket, rate)
        except DecodeError as exc:
            closing.set_result((grpc.StatusCode.INVALID_ARGUMENT, f"{MALFORMED}: {exc}"))
        except _Flooded:
            closing.set_result((grpc.StatusCode.RESOURCE_EXHAUSTED, FLOODED))

    async def _apply_commands(
        self,
        record: SessionRecord,
        requests: AsyncIterator[scheduler_pb2.InteractRequest],
        bucket: TokenBucket | None,
        rate: int,
    ) -> None:
        refused = 0
        async for request in requests:
            if bucket is not None and not bucket.take():
                refused += 1
                if refused > MAX_REFUSED_COMMANDS:
                    raise _Flooded
                message = f"command: too many commands (limit commands_per_second={rate}); slow down"
                error = scheduler_pb2.ErrorEvent(code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], message=message)
                record.publish(scheduler_pb2.InteractResponse(error=error), keep=False)
                continue
            record.publish(self._apply_command(record, request), keep=False)

    def _apply_command(
        self, record: SessionRecord, request: scheduler_pb2.InteractRequest
    ) -> scheduler_pb2.InteractResponse:
        """Apply a command to the record (the dispatch loop acts on it at the next block boundary);
        the answer to send back, accepted or an error."""
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
            try:
                held = validate_action(record.valid, request.action)
            except InvalidRequest as exc:
                return error(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            if not record.action_bucket.take():
                return error(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"action: too many actions (limit {ACTION_RATE_PER_S:g} per second, bursts of {ACTION_BURST}); "
                    "send on key changes and sample the mouse",
                )
            # Several actions before one boundary: the latest wins (an action holds for whole blocks).
            record.pending_action = PendingAction(record.boundary, held)
        elif kind == "pause":
            if record.paused_since is None:
                record.paused_since = time.monotonic()
                self.background(self.placement.set_activity(record, paused=True))
            record.set_state(common_pb2.SESSION_STATE_PAUSED, "paused by the client")
        elif kind == "resume":
            if record.paused_since is not None:
                record.paused_total_s += time.monotonic() - record.paused_since
                record.paused_since = None
                self.background(self.placement.set_activity(record, paused=False))
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


def create_servicer(config: SchedulerConfig, store: Store, api_keys: ApiKeys) -> SchedulerServicer:
    """The servicer and its parts, reaching kvcache_svc and the workers over gRPC."""
    table = SessionTable(store)
    presets = Presets(config.default_lookahead)
    placement = Placement(config, GrpcKVCache(config.kvcache_address), GrpcWorkers())
    dispatcher = Dispatcher(config, table, placement, presets, api_keys.quotas)
    return SchedulerServicer(config, api_keys, table, placement, dispatcher, presets)


def add_to_server(server: grpc.aio.Server, servicer: SchedulerServicer) -> Registration:
    scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(servicer, server)

    async def on_start(_port: int) -> None:
        servicer.background(servicer.dispatcher.resume())

    return Registration([SERVICE_NAME], drain=servicer.dispatcher.drain, on_start=on_start)
