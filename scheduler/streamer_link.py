"""The scheduler's end of the streamer link (`StreamerService.Link`).

Opened once the scheduler listens and kept open, reconnecting with backoff when the streamer
restarts. On every (re)connect the scheduler says hello (its own API address, where the viewer page's
commands go) and announces every live session (which outputs it wants, when it was created); then
each new session as it is created. The streamer answers with output events, which become events
of the session: an output that failed (the RTMP server is unreachable) is an `ErrorEvent` with
code UNAVAILABLE — the session keeps running — and its recovery is a `StateChange` that keeps the
state and says what recovered (as a worker recovery does). Both go to the clients attached now.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc

from inferix.api.v1 import scheduler_pb2, streamer_pb2, streamer_pb2_grpc
from inferix.server import channel
from scheduler.playback import announcement
from scheduler.sessions import SessionRecord

log = logging.getLogger("inferix.scheduler.link")

_BACKOFF_INITIAL_S = 0.2
_BACKOFF_MAX_S = 5.0


class StreamerLink:
    """Announces sessions to the streamer and relays its output events into session events."""

    def __init__(self, streamer_address: str, scheduler_address: str) -> None:
        self.streamer_address = streamer_address
        self.scheduler_address = scheduler_address
        self.sessions: dict[str, SessionRecord] = {}  # the scheduler's live table (bound at startup)
        self.connected = asyncio.Event()
        self._outgoing: asyncio.Queue[streamer_pb2.SessionAnnouncement] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def bind(self, sessions: dict[str, SessionRecord]) -> None:
        self.sessions = sessions

    def announce(self, session: streamer_pb2.SessionAnnouncement) -> None:
        """Tell the streamer about a new session (queued until the link is up; re-sent on reconnect)."""
        self._outgoing.put_nowait(session)

    async def start(self, _port: int) -> None:
        """`Registration.on_start`: run the link in the background for the life of the scheduler."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="streamer-link")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _requests(self) -> AsyncIterator[streamer_pb2.LinkRequest]:
        yield streamer_pb2.LinkRequest(hello=streamer_pb2.LinkHello(scheduler_address=self.scheduler_address))
        for record in list(self.sessions.values()):
            if not record.terminal:
                yield streamer_pb2.LinkRequest(session=announcement(record.session_id, record.spec, record.created_at))
        while True:
            yield streamer_pb2.LinkRequest(session=await self._outgoing.get())

    async def _run(self) -> None:
        backoff = _BACKOFF_INITIAL_S
        stub = streamer_pb2_grpc.StreamerServiceStub(channel(self.streamer_address))  # reconnects by itself
        while True:
            try:
                call = stub.Link(self._requests())
                await call.wait_for_connection()
                self.connected.set()
                log.info("linked to the streamer at %s", self.streamer_address)
                backoff = _BACKOFF_INITIAL_S
                async for event in call:
                    self._relay(event)
                log.warning("the streamer closed the link; reconnecting")
            except grpc.aio.AioRpcError as exc:
                log.warning("streamer link to %s failed (%s); retrying", self.streamer_address, exc.code().name)
            self.connected.clear()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX_S)

    def _relay(self, event: streamer_pb2.LinkResponse) -> None:
        record = self.sessions.get(event.session_id)
        if record is None or record.terminal:
            return
        # Not kept in the session's history: these are live notices, and a client attaching later (e.g. to
        # send one command) must not read an old output error as the answer to its command.
        if event.kind == streamer_pb2.OUTPUT_EVENT_KIND_ERROR:
            error = scheduler_pb2.ErrorEvent(code=grpc.StatusCode.UNAVAILABLE.value[0], message=event.message)
            record.publish(scheduler_pb2.InteractResponse(error=error), keep=False)
        elif event.kind == streamer_pb2.OUTPUT_EVENT_KIND_RECOVERED:
            state = scheduler_pb2.StateChange(state=record.state, reason=event.message)  # type: ignore[arg-type]
            record.publish(scheduler_pb2.InteractResponse(state=state), keep=False)
