"""The viewer page's window on the scheduler: commands (prompt, action, pause, resume, stop) and session status.

The page talks JSON to the streamer; the streamer forwards to the scheduler's public gRPC API with
the page's viewer token in the `x-inferix-viewer-token` metadata, where the scheduler checks it
again and limits it to that one session (GetSession and Interact). So the streamer holds no
credentials of its own and the scheduler stays the only place that applies commands (rate limits,
prompt validation and block-boundary semantics are the same as for SDK clients).

A command is one short Interact stream: attach, send the command, wait for the scheduler's
`accepted` (or the error naming the command). A session's commands go one at a time: the scheduler
publishes every answer to every stream attached to the session, so two of them in flight at once
could each take the other's answer. Status comes from a watcher per watched session: one GetSession
(with the model's action schema), then an Interact stream whose block events give the current prompt,
the action each block was made under and block latency; it stops when nobody has asked for the
session's status for a while.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from inferix.api.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from inferix.server import channel
from inferix.viewer_token import METADATA_KEY
from streamer.errors import StreamerError

log = logging.getLogger("inferix.streamer.control")

# Page command -> Interact command name (the name the scheduler echoes in `accepted`).
COMMANDS = {"prompt": "set_prompt", "action": "action", "pause": "pause", "resume": "resume", "stop": "stop"}
_DEADLINE_S = 10.0
_WATCH_IDLE_S = 30.0  # a watcher with no status request for this long stops
_FROM_NO_BLOCKS = 2**32 - 1  # attach without replaying block events
_TERMINAL = ("completed", "cancelled", "failed")
_RECENT_BLOCKS = 16  # block events kept for the page (which marks an action applied when its block is made)

# gRPC status -> HTTP status of the page's JSON API.
_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 403,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
_CODES = {code.value[0]: code for code in grpc.StatusCode}


class ControlError(StreamerError):
    """A command or status request the scheduler refused or could not be reached for."""

    def __init__(self, http_status: int, message: str) -> None:
        super().__init__(message)
        self.http_status = http_status


def _from_rpc(exc: grpc.aio.AioRpcError) -> ControlError:
    return ControlError(_HTTP_STATUS.get(exc.code(), 502), f"scheduler: {exc.details() or exc.code().name}")


def _state_name(value: int) -> str:
    return common_pb2.SessionState.Name(value).removeprefix("SESSION_STATE_").lower()


@dataclass
class SessionView:
    """What the scheduler says about a session, as the viewer page shows it."""

    state: str = "unknown"
    prompt: str = ""
    blocks_done: int = 0
    created_at_unix: float = 0.0
    last_error: str = ""
    # The model's actions (None: a text model) and the action held for the next block as far as known:
    # GetSession's at first, then the one the latest block was made under.
    action_schema: dict[str, object] | None = None
    current_action: dict[str, list[Any]] | None = None
    block_latency_ms: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=16))
    engine_ms: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=16))
    recent_blocks: collections.deque[dict[str, object]] = field(
        default_factory=lambda: collections.deque(maxlen=_RECENT_BLOCKS)
    )

    def to_json(self) -> dict[str, object]:
        latency = list(self.block_latency_ms)
        engine = list(self.engine_ms)
        return {
            "state": self.state,
            "prompt": self.prompt,
            "blocks_done": self.blocks_done,
            "created_at_unix": self.created_at_unix,
            "last_error": self.last_error,
            "action_schema": self.action_schema,
            "current_action": self.current_action,
            "recent_blocks": list(self.recent_blocks),
            "block_latency_ms": {
                "last": round(latency[-1], 1) if latency else None,
                "p50": round(statistics.median(latency), 1) if latency else None,
                "engine_last": round(engine[-1], 1) if engine else None,
            },
        }

    def add_block(self, block: common_pb2.BlockEvent) -> None:
        self.prompt = block.prompt
        self.blocks_done = max(self.blocks_done, block.block_index + 1)
        self.block_latency_ms.append(block.timings.dispatch_to_done_ms)
        self.engine_ms.append(block.timings.total_ms)
        entry: dict[str, object] = {
            "block": block.block_index,
            "first_frame": block.first_frame,
            "num_frames": block.num_frames,
        }
        if block.HasField("action"):
            self.current_action = entry["action"] = _action_json(block.action)
        self.recent_blocks.append(entry)


def _schema_json(schema: common_pb2.ActionSchema) -> dict[str, object]:
    return {
        "keys": [{"name": k.name, "key": k.key} for k in schema.keys],
        "mouse": [{"name": a.name, "minimum": a.minimum, "maximum": a.maximum} for a in schema.mouse],
        "one_hot": schema.one_hot,
    }


def _action_json(action: common_pb2.HeldAction) -> dict[str, list[Any]]:
    return {"keys": list(action.keys), "mouse": list(action.mouse)}


class _Watcher:
    """Keeps a `SessionView` current from the scheduler's events while someone is looking."""

    def __init__(self, control: SchedulerControl, session_id: str, token: str) -> None:
        self.session_id = session_id
        self.token = token
        self.view = SessionView()
        self.error: ControlError | None = None
        self.ready = asyncio.Event()
        self.last_used = time.monotonic()
        self.task = asyncio.get_running_loop().create_task(self._run(control), name=f"watch-{session_id}")

    async def _run(self, control: SchedulerControl) -> None:
        metadata = ((METADATA_KEY, self.token),)
        try:
            stub = control.stub()
            reply = await stub.GetSession(
                scheduler_pb2.GetSessionRequest(session_id=self.session_id), metadata=metadata, timeout=_DEADLINE_S
            )
            session = reply.session
            view = self.view
            view.state, view.prompt = _state_name(session.state), session.current_prompt
            view.blocks_done, view.created_at_unix = session.blocks_done, session.created_at_unix
            if session.HasField("action_schema"):
                view.action_schema = _schema_json(session.action_schema)
                view.current_action = _action_json(session.current_action)
            self.ready.set()
            from_block = max(0, session.blocks_done - (view.block_latency_ms.maxlen or 0))
            await self._follow(stub, metadata, from_block)
        except grpc.aio.AioRpcError as exc:
            self.error = _from_rpc(exc)
        except ControlError as exc:
            self.error = exc
        finally:
            self.ready.set()

    async def _follow(self, stub: scheduler_pb2_grpc.SchedulerServiceStub, metadata: tuple, from_block: int) -> None:
        attach = scheduler_pb2.InteractRequest(
            attach=scheduler_pb2.Attach(session_id=self.session_id, from_block=from_block)
        )
        stop = asyncio.Event()

        async def requests() -> AsyncIterator[scheduler_pb2.InteractRequest]:
            yield attach
            await stop.wait()

        call = stub.Interact(requests(), metadata=metadata)
        idle = asyncio.Event()

        async def hang_up_when_idle() -> None:  # also for a quiet (e.g. paused) session
            while time.monotonic() - self.last_used <= _WATCH_IDLE_S:
                await asyncio.sleep(_WATCH_IDLE_S / 4)
            idle.set()
            call.cancel()

        guard = asyncio.get_running_loop().create_task(hang_up_when_idle())
        view = self.view
        try:
            async for response in call:
                kind = response.WhichOneof("event")
                if kind == "block":
                    view.add_block(response.block)
                elif kind == "state":
                    view.state = _state_name(response.state.state)
                elif kind == "error":
                    view.last_error = response.error.message
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            if not idle.is_set():
                raise
        finally:
            guard.cancel()
            stop.set()
            call.cancel()


class SchedulerControl:
    """Forwards viewer commands and status requests to the scheduler, authorized by the viewer token."""

    def __init__(self, address: str = "", fixed: bool = False) -> None:
        self.address = address
        self.fixed = fixed  # --scheduler given: the link's hello does not override it
        self._channel: grpc.aio.Channel | None = None
        self._channel_address = ""
        self._watchers: dict[str, _Watcher] = {}
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}  # per session: its command lock and its users

    def learn_address(self, address: str) -> None:
        """The scheduler said where its API is (on the link)."""
        if not self.fixed and address and address != self.address:
            log.info("viewer commands go to the scheduler at %s", address)
            self.address = address

    def stub(self) -> scheduler_pb2_grpc.SchedulerServiceStub:
        if not self.address:
            raise ControlError(
                503, "no scheduler is known to this streamer yet (start the scheduler, or pass --scheduler)"
            )
        if self._channel is None or self._channel_address != self.address:
            self._channel = channel(self.address)
            self._channel_address = self.address
        return scheduler_pb2_grpc.SchedulerServiceStub(self._channel)

    async def command(
        self,
        session_id: str,
        token: str,
        command: str,
        text: str = "",
        keys: tuple[str, ...] = (),
        mouse: tuple[float, ...] = (),
    ) -> int:
        """Apply a page command (`text` for prompt, `keys`/`mouse` for action); returns the block it
        applies at. Raises `ControlError`."""
        name = COMMANDS.get(command)
        if name is None:
            raise ControlError(404, f"unknown command {command!r}; use one of {', '.join(COMMANDS)}")
        request = scheduler_pb2.InteractRequest()
        if name == "set_prompt":
            request.set_prompt.text = text
        elif name == "action":
            request.action.keys.extend(keys)
            request.action.mouse.extend(mouse)
        else:
            getattr(request, name).SetInParent()
        stub = self.stub()
        lock, users = self._locks.get(session_id, (asyncio.Lock(), 0))
        self._locks[session_id] = (lock, users + 1)
        try:
            async with lock:
                return await self._send(stub, session_id, token, name, request)
        finally:
            lock, users = self._locks[session_id]
            if users == 1:  # the last one out: the table holds only sessions with commands in flight
                del self._locks[session_id]
            else:
                self._locks[session_id] = (lock, users - 1)

    async def _send(
        self,
        stub: scheduler_pb2_grpc.SchedulerServiceStub,
        session_id: str,
        token: str,
        name: str,
        request: scheduler_pb2.InteractRequest,
    ) -> int:
        """One Interact stream: attach, send the command, wait for its answer."""
        done = asyncio.Event()

        async def requests() -> AsyncIterator[scheduler_pb2.InteractRequest]:
            yield scheduler_pb2.InteractRequest(
                attach=scheduler_pb2.Attach(session_id=session_id, from_block=_FROM_NO_BLOCKS)
            )
            yield request
            await done.wait()

        call = stub.Interact(requests(), metadata=((METADATA_KEY, token),), timeout=_DEADLINE_S)
        try:
            async for response in call:
                kind = response.WhichOneof("event")
                if kind == "accepted" and response.accepted.command == name:
                    return int(response.accepted.applies_at_block)
                if kind == "error" and response.error.message.startswith((f"{name}:", f"{name}.")):
                    code = _CODES.get(response.error.code, grpc.StatusCode.UNKNOWN)
                    raise ControlError(_HTTP_STATUS.get(code, 502), response.error.message)
        except grpc.aio.AioRpcError as exc:
            raise _from_rpc(exc) from exc
        finally:
            done.set()
            call.cancel()
        raise ControlError(409, f"{name}: the session ended before the command was accepted")

    async def view(self, session_id: str, token: str) -> SessionView:
        """The scheduler's current view of the session (starts a watcher on first use)."""
        watcher = self._watchers.get(session_id)
        finished = watcher is not None and watcher.error is None and watcher.view.state in _TERMINAL
        if watcher is None or (watcher.task.done() and not finished) or watcher.token != token:
            if watcher is not None:
                watcher.task.cancel()
            watcher = self._watchers[session_id] = _Watcher(self, session_id, token)
        watcher.last_used = time.monotonic()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(watcher.ready.wait(), _DEADLINE_S)
        if watcher.error is not None:
            error = watcher.error
            self._watchers.pop(session_id, None)
            raise error
        return watcher.view

    async def close(self) -> None:
        for watcher in self._watchers.values():
            watcher.task.cancel()
        self._watchers.clear()
        if self._channel is not None:
            await self._channel.close()
