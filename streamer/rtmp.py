"""RTMP push of one session: the paced H.264 packets muxed, unchanged, into FLV to `rtmp://host/app/<session>`.

Players (OBS Media Source, VLC, `ffplay -rtmp_live live ...`) read the stream from the RTMP server
(nginx with the RTMP module; `inferix serve` starts one). The publisher runs on its own thread
because FFmpeg's RTMP client blocks: a slow or dead server stalls that thread only. Packets reach it
through a bounded queue (`KeyframeGate`), so the pacer never waits for it.

When the server goes away (or is not there at all) the session carries on: the publisher reports
the error once per outage (`OutputEvent`, relayed by the scheduler into the session's events),
drops the frames it cannot send and reconnects with exponential backoff, at the next keyframe (FLV
needs the SPS/PPS, and players a decodable start). A successful reconnect is reported as recovered.
"""

from __future__ import annotations

import io
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction

import av

from streamer import metrics
from streamer.pacing import KeyframeGate, LiveStats
from streamer.packets import LivePacket

log = logging.getLogger("inferix.streamer.rtmp")

_FLV_TIME_BASE = Fraction(1, 1000)  # FLV timestamps are milliseconds


class RtmpState(StrEnum):
    CONNECTING = "connecting"
    CONNECTED = "connected"
    RETRYING = "retrying"  # the last attempt or push failed; waiting out the backoff
    ENDED = "ended"


class OutputEventKind(StrEnum):
    ERROR = "error"
    RECOVERED = "recovered"


@dataclass(frozen=True)
class OutputEvent:
    """Something an output of a session did that the session's watchers should hear about."""

    session_id: str
    output: str
    kind: OutputEventKind
    message: str


@dataclass(frozen=True)
class RtmpConfig:
    """Where and how to push (`--rtmp-url` and friends)."""

    url: str  # application URL, e.g. rtmp://127.0.0.1:1935/live; the stream key is the session id
    connect_timeout_s: float = 5.0
    write_timeout_s: float = 5.0
    backoff_initial_s: float = 0.25
    backoff_max_s: float = 8.0
    queue_s: float = 2.0  # seconds of packets buffered for a slow server before it drops

    def session_url(self, session_id: str) -> str:
        return f"{self.url.rstrip('/')}/{session_id}"


class RtmpPublisher:
    """The RTMP output of one session (a `LiveConsumer`); `offer`/`end` on the event loop, I/O on its thread."""

    name = "rtmp"

    def __init__(
        self,
        session_id: str,
        fps: float,
        config: RtmpConfig,
        stats: LiveStats,
        report: Callable[[OutputEvent], None],
    ) -> None:
        self.session_id = session_id
        self.url = config.session_url(session_id)
        self.config = config
        self.state = RtmpState.CONNECTING
        self.error = ""
        self.connects = 0
        self._stats = stats
        self._report = report  # called on the publisher thread
        self._gate = KeyframeGate(capacity=max(2, round(config.queue_s * fps)))
        self._queue: deque[LivePacket] = deque()
        self._cond = threading.Condition()
        self._accepting = True  # False while waiting out a backoff: offered packets are dropped
        self._ended = False
        self._stop_now = False
        self._thread = threading.Thread(target=self._run, name=f"rtmp-{session_id}", daemon=True)
        self._thread.start()

    # ---- event loop side ----------------------------------------------------------------------
    def offer(self, packet: LivePacket) -> None:
        with self._cond:
            if not self._accepting:
                self._stats.count_drop(self.name)
                return
            if not self._gate.admit(packet.packet.keyframe, len(self._queue)):
                self._sync_drops()
                return
            self._queue.append(packet)
            self._cond.notify()

    def end(self) -> None:
        """Send what is queued, then disconnect (the FLV stream ends cleanly)."""
        with self._cond:
            self._ended = True
            self._cond.notify()

    def stop(self) -> None:
        """Disconnect now, without sending what is queued (shutdown)."""
        with self._cond:
            self._ended = self._stop_now = True
            self._cond.notify()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _sync_drops(self) -> None:
        """Move the gate's drop count into the stats (called with the lock held)."""
        dropped, self._gate.dropped = self._gate.dropped, 0
        self._stats.count_drop(self.name, dropped)

    # ---- publisher thread ---------------------------------------------------------------------
    def _next(self) -> LivePacket | None:
        with self._cond:
            while not self._queue and not self._ended:
                self._cond.wait()
            if self._stop_now or not self._queue:
                return None
            return self._queue.popleft()

    def _run(self) -> None:
        backoff = self.config.backoff_initial_s
        failures = 0
        outage = False
        while True:
            first = self._next()
            if first is None:
                break
            try:
                container, stream = self._connect(first)
            except Exception as exc:  # refused, unreachable, handshake or publish rejected
                failures += 1
                self._fail(f"cannot connect to {self.url}: {_describe(exc)}", report=not outage)
                outage = True
                self._wait_backoff(backoff)
                backoff = min(backoff * 2, self.config.backoff_max_s)
                continue
            if outage:
                self._report_event(
                    OutputEventKind.RECOVERED, f"rtmp output: reconnected to {self.url} after {failures} attempt(s)"
                )
            outage, failures, backoff = False, 0, self.config.backoff_initial_s
            try:
                self._push(container, stream, first)
            except Exception as exc:  # the server went away mid-stream
                failures += 1
                self._fail(f"lost the connection to {self.url}: {_describe(exc)}", report=True)
                outage = True
                _close_quietly(container)
                self._wait_backoff(backoff)
                backoff = min(backoff * 2, self.config.backoff_max_s)
                continue
            _close_quietly(container)
            break
        self.state = RtmpState.ENDED
        log.info("session %s: rtmp push to %s ended", self.session_id, self.url)

    def _connect(self, first: LivePacket) -> tuple[av.container.OutputContainer, av.stream.Stream]:
        """Open the FLV/RTMP connection; the stream's SPS/PPS come from `first` (always a keyframe)."""
        assert first.packet.keyframe, "the gate starts every connection at a keyframe"
        self.state = RtmpState.CONNECTING
        timeout = (self.config.connect_timeout_s, self.config.write_timeout_s)
        container = av.open(self.url, "w", format="flv", timeout=timeout)
        try:
            # A one-packet H.264 demuxer gives a stream template carrying the SPS/PPS (FLV's AVC
            # sequence header); the packets themselves are muxed as they are, never re-encoded.
            with av.open(io.BytesIO(first.packet.data), format="h264") as probe:
                stream = container.add_stream_from_template(probe.streams.video[0])
            stream.time_base = _FLV_TIME_BASE
            container.start_encoding()  # connects, handshakes and publishes now, not at the first packet
        except Exception:
            _close_quietly(container)
            raise
        self.state = RtmpState.CONNECTED
        self.connects += 1
        self.error = ""
        metrics.RTMP_CONNECTS.inc()
        if self.connects > 1:
            metrics.RTMP_RECONNECTS.inc()
        log.info("session %s: pushing rtmp to %s", self.session_id, self.url)
        return container, stream

    def _push(self, container: av.container.OutputContainer, stream: av.stream.Stream, first: LivePacket) -> None:
        origin = first.live_s  # every connection starts its FLV clock at 0
        last_ms = -1
        packet: LivePacket | None = first
        while packet is not None:
            ms = max(last_ms + 1, round((packet.live_s - origin) * 1000))
            out = av.Packet(packet.packet.data)
            out.pts = out.dts = ms
            out.time_base = _FLV_TIME_BASE
            out.is_keyframe = packet.packet.keyframe
            out.stream = stream
            container.mux(out)
            self._stats.count_sent(self.name)
            last_ms = ms
            packet = self._next()

    def _fail(self, message: str, report: bool) -> None:
        metrics.RTMP_FAILURES.inc()
        self.state = RtmpState.RETRYING
        self.error = message
        with self._cond:
            self._accepting = False
            self._stats.count_drop(self.name, len(self._queue))
            self._queue.clear()
            self._sync_drops()
        log.warning("session %s: rtmp output: %s", self.session_id, message)
        if report:
            self._report_event(OutputEventKind.ERROR, f"rtmp output: {message}; the session continues, retrying")

    def _wait_backoff(self, seconds: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._ended, timeout=seconds)
            self._accepting = True
            self._gate.waiting = True  # resume at the next keyframe

    def _report_event(self, kind: OutputEventKind, message: str) -> None:
        try:
            self._report(OutputEvent(self.session_id, self.name, kind, message))
        except Exception:
            log.exception("session %s: could not report an rtmp event", self.session_id)


def _describe(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text.split(": '", 1)[0]  # FFmpeg errors end with the URL, which the caller already names


def _close_quietly(container: av.container.OutputContainer) -> None:
    try:
        container.close()
    except Exception as exc:  # closing a dead connection fails the same way the push did
        log.debug("closing an rtmp connection: %s", exc)
