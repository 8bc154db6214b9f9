"""The streamer's end of the scheduler link (`StreamerService.Link`).

The scheduler opens the link when it starts and keeps it open (reconnecting if the streamer
restarts). Over it the scheduler sends its own address (`hello`: where viewer commands go) and an
announcement per session (which outputs it wants, when it was created, its latency mode); the streamer sends back
output events (RTMP server lost / reconnected), which the scheduler adds to the session's events.
Events raised while no scheduler is connected are kept (bounded) and sent when one connects.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator

from inferix.api.v1 import streamer_pb2
from inferix.spec.latency import LatencyMode
from streamer.control import SchedulerControl
from streamer.ingest import valid_session_id
from streamer.live import Announcement, LiveRegistry
from streamer.rtmp import OutputEvent, OutputEventKind

log = logging.getLogger("inferix.streamer.link")

_PENDING_EVENTS = 256
_KINDS = {
    OutputEventKind.ERROR: streamer_pb2.OUTPUT_EVENT_KIND_ERROR,
    OutputEventKind.RECOVERED: streamer_pb2.OUTPUT_EVENT_KIND_RECOVERED,
}


def _to_proto(event: OutputEvent) -> streamer_pb2.LinkResponse:
    return streamer_pb2.LinkResponse(
        session_id=event.session_id, output=event.output, kind=_KINDS[event.kind], message=event.message
    )


class LinkHub:
    """Fans output events out to the connected schedulers and applies what they announce."""

    def __init__(self, control: SchedulerControl) -> None:
        self.control = control
        self.registry: LiveRegistry | None = None  # set once the registry exists (it reports through us)
        self._subscribers: list[asyncio.Queue[OutputEvent | None]] = []
        self._pending: collections.deque[OutputEvent] = collections.deque(maxlen=_PENDING_EVENTS)

    @property
    def connected(self) -> int:
        return len(self._subscribers)

    def report(self, event: OutputEvent) -> None:
        """An output event (on the event loop): to every connected scheduler, or kept for the next one."""
        if not self._subscribers:
            self._pending.append(event)
        for queue in self._subscribers:
            queue.put_nowait(event)

    async def serve(
        self, requests: AsyncIterator[streamer_pb2.LinkRequest]
    ) -> AsyncIterator[streamer_pb2.LinkResponse]:
        """One link: read hello/announcements in the background, stream events until closed."""
        queue: asyncio.Queue[OutputEvent | None] = asyncio.Queue()
        while self._pending:
            queue.put_nowait(self._pending.popleft())
        self._subscribers.append(queue)
        reader = asyncio.get_running_loop().create_task(self._read(requests, queue))
        log.info("scheduler link opened (%d open)", len(self._subscribers))
        try:
            while (event := await queue.get()) is not None:
                yield _to_proto(event)
        finally:
            reader.cancel()
            self._subscribers.remove(queue)
            log.info("scheduler link closed (%d open)", len(self._subscribers))

    async def _read(
        self, requests: AsyncIterator[streamer_pb2.LinkRequest], queue: asyncio.Queue[OutputEvent | None]
    ) -> None:
        try:
            async for request in requests:
                kind = request.WhichOneof("message")
                if kind == "hello":
                    self.control.learn_address(request.hello.scheduler_address)
                elif kind == "session" and self.registry is not None:
                    session = request.session
                    if not valid_session_id(session.session_id):
                        log.warning("ignoring an announcement with a bad session id %r", session.session_id[:64])
                        continue
                    self.registry.get_or_create(session.session_id).announce(
                        Announcement(
                            session.rtmp,
                            session.webrtc,
                            session.created_at_unix or None,
                            LatencyMode.from_proto(session.latency),
                        )
                    )
        finally:
            queue.put_nowait(None)  # the scheduler hung up: end the response stream too

    def close(self) -> None:
        """End every link (shutdown), so the server does not wait out its grace period for them."""
        for queue in self._subscribers:
            queue.put_nowait(None)
