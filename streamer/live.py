"""The live side of one session: its pacer, RTMP publisher and WebRTC viewers, and what they report.

A `LiveSession` can exist before the session's first frame: the scheduler announces a session when
it creates it (with the outputs it asked for), and a viewer may open the page before generation
starts. The pacer is created with the first frame (it needs the frame rate) and attached to the
session's `EncodedStream` as one more packet sink; from then on it feeds the consumers below.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from inferix.api.v1 import streamer_pb2
from inferix.spec.latency import LatencyMode
from streamer.ice import IceServers
from streamer.pacing import AdaptiveClock, LiveConsumer, LiveStats, Pacer, PacingConfig
from streamer.packets import LivePacket, StreamFormat
from streamer.rtmp import OutputEvent, RtmpConfig, RtmpPublisher
from streamer.webrtc import ViewerHub

log = logging.getLogger("inferix.streamer.live")

_SHUTDOWN_JOIN_S = 2.0  # how long shutdown waits for an RTMP thread stuck in network I/O


@dataclass(frozen=True)
class LiveConfig:
    """Settings of the live outputs of every session (streamer flags)."""

    pacing: PacingConfig = PacingConfig()
    rtmp: RtmpConfig | None = None  # None: no RTMP push (no --rtmp-url)
    max_viewers: int = 16
    ice: IceServers = IceServers()  # STUN / TURN for viewers behind NAT (--ice-server)


@dataclass(frozen=True)
class Announcement:
    """What the scheduler told us about a session when it created it."""

    rtmp: bool
    webrtc: bool
    created_at_unix: float | None
    latency: LatencyMode = LatencyMode.SMOOTH


class LiveSession:
    """Live outputs of one session id. Lives on the event loop."""

    def __init__(self, session_id: str, config: LiveConfig, report: Callable[[OutputEvent], None]) -> None:
        self.session_id = session_id
        self.config = config
        self.stats = LiveStats()
        self.announcement: Announcement | None = None
        self.format: StreamFormat | None = None
        self.hub = ViewerHub(session_id, self.stats, config.max_viewers, ice=config.ice)
        self.publisher: RtmpPublisher | None = None
        self.pacer: Pacer | None = None
        self.ended = False
        self.ended_event = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._report = report

    @property
    def latency(self) -> LatencyMode:
        """The session's latency mode; smooth when it was not announced (a stream pushed without a scheduler)."""
        return self.announcement.latency if self.announcement is not None else LatencyMode.SMOOTH

    def jitter_buffer_ms(self) -> float:
        """The jitter buffer the session's live outputs use now: measured (interactive) or the fixed one."""
        clock = self.pacer.clock if self.pacer is not None else None
        if isinstance(clock, AdaptiveClock) and clock.measured:
            return clock.buffer_s() * 1e3
        return self.config.pacing.jitter_buffer_s * 1e3

    @property
    def consumers(self) -> list[LiveConsumer]:
        return [c for c in (self.publisher, self.hub) if c is not None]

    def announce(self, announcement: Announcement) -> None:
        """The scheduler created this session (sent again after a reconnect: idempotent)."""
        self.announcement = announcement
        if announcement.created_at_unix:
            self.stats.created_at_unix = announcement.created_at_unix
        self._start_rtmp()

    def open(self, fmt: StreamFormat) -> Pacer:
        """The first frame arrived: start pacing (the caller attaches the pacer to the encoded stream)."""
        assert self.pacer is None, "a session's live output opens once"
        self.format = fmt
        self.hub.fps = fmt.fps
        self.pacer = Pacer(
            self.session_id, fmt, self.config.pacing, self.stats, self._release, self._on_end,
            interactive=self.latency is LatencyMode.INTERACTIVE,
        )  # fmt: skip
        self._start_rtmp()
        return self.pacer

    def _start_rtmp(self) -> None:
        wanted = self.announcement is not None and self.announcement.rtmp and self.config.rtmp is not None
        if not wanted or self.publisher is not None or self.format is None or self.ended:
            return
        assert self.config.rtmp is not None
        self.publisher = RtmpPublisher(
            self.session_id, self.format.fps, self.config.rtmp, self.stats, self._report_from_thread
        )

    def _report_from_thread(self, event: OutputEvent) -> None:
        self._loop.call_soon_threadsafe(self._report, event)

    def _release(self, packet: LivePacket) -> None:
        for consumer in self.consumers:
            consumer.offer(packet)

    def _on_end(self) -> None:
        self.ended = True
        for consumer in self.consumers:
            consumer.end()
        self.ended_event.set()
        log.info("session %s: live output ended after %d frames", self.session_id, self.stats.frames_out)

    async def shutdown(self) -> None:
        """Stop every live output now (streamer shutdown): frames not yet due are not sent."""
        if self.pacer is not None:
            self.pacer.abort()
            await self.pacer.task
        elif not self.ended:
            self._on_end()
        if self.publisher is not None:
            self.publisher.stop()
            await asyncio.to_thread(self.publisher.join, _SHUTDOWN_JOIN_S)
        await self.hub.close()

    def to_proto(self) -> streamer_pb2.LiveStats:
        stats = self.stats
        ttff = stats.time_to_first_frame_s
        publisher = self.publisher
        return streamer_pb2.LiveStats(
            frames_out=stats.frames_out,
            underruns=stats.underruns,
            underrun_seconds=stats.underrun_s,
            time_to_first_frame_ms=ttff * 1e3 if ttff is not None else 0.0,
            backlog_frames=stats.backlog_frames,
            viewers=len(self.hub.viewers),
            rtmp_state=str(publisher.state) if publisher is not None else "off",
            rtmp_error=publisher.error if publisher is not None else "",
            rtmp_connects=publisher.connects if publisher is not None else 0,
            dropped_frames=stats.dropped,
            frames_sent=stats.sent,
        )

    def to_json(self) -> dict[str, object]:
        """The live stats as the viewer page's status API reports them."""
        stats = self.stats
        ttff = stats.time_to_first_frame_s
        publisher = self.publisher
        fmt = self.format
        return {
            "width": fmt.width if fmt else None,
            "height": fmt.height if fmt else None,
            "fps": fmt.fps if fmt else None,
            "frames_in": stats.frames_in,
            "frames_out": stats.frames_out,
            "fps_out": round(stats.fps_out(), 2),
            "time_to_first_frame_ms": round(ttff * 1e3, 1) if ttff is not None else None,
            "underruns": stats.underruns,
            "underrun_s": round(stats.underrun_s, 3),
            "backlog_frames": stats.backlog_frames,
            "viewers": len(self.hub.viewers),
            "dropped_frames": dict(stats.dropped),
            "rtmp": {
                "state": str(publisher.state) if publisher is not None else "off",
                "error": publisher.error if publisher is not None else "",
            },
            "ended": self.ended,
            "latency": self.latency.value,
            "jitter_buffer_ms": round(self.jitter_buffer_ms(), 1),
        }


class LiveRegistry:
    """Every live session of the streamer by id, created by an announcement or by a first frame."""

    def __init__(self, config: LiveConfig, report: Callable[[OutputEvent], None]) -> None:
        self.config = config
        self.sessions: dict[str, LiveSession] = {}
        self._report = report
        self._added = asyncio.Event()

    def get(self, session_id: str) -> LiveSession | None:
        return self.sessions.get(session_id)

    def get_or_create(self, session_id: str) -> LiveSession:
        live = self.sessions.get(session_id)
        if live is None:
            live = self.sessions[session_id] = LiveSession(session_id, self.config, self._report)
            self._added.set()
            self._added = asyncio.Event()
        return live

    async def wait_for(self, session_id: str, timeout: float) -> LiveSession | None:
        """The session, waiting up to `timeout` for its announcement (a page opened right after creation)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while (live := self.sessions.get(session_id)) is None:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._added.wait(), remaining)
        return live

    async def shutdown(self) -> None:
        await asyncio.gather(*(live.shutdown() for live in self.sessions.values()), return_exceptions=True)
