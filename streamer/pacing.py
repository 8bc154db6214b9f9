"""Real-time pacing of a session's encoded packets for the live outputs (RTMP, WebRTC).

Workers deliver frames in bursts, a block at a time and usually ahead of real time (the scheduler
keeps `lookahead` blocks in hand). The encoder takes them as fast as they come, so the MP4 gets
every frame at once; the live outputs must instead show frame `n` at `t0 + n / fps` on the wall
clock. The pacer sits after the encoder (one encode, no re-encode for pacing), holds the encoded
packets that are not yet due and releases each one on time to every live consumer.

- **Jitter buffer.** The clock starts `jitter_buffer_s` after ingest accepted the first frame, which
  absorbs the encode time and the spread of a burst (transfer and encode of the frames of a block).
- **Catch-up.** The clock is (re)started by one frame; if that frame came in late against the ones
  after it (a cold gRPC stream ramping up its flow-control window, a busy machine, a hiccup that
  delivered several frames at once), its lateness would be added to every later frame of a source
  that sends frame by frame in real time. So over the first couple of seconds of frames that come
  at the steady frame cadence after each (re)start, if every one had more than the jitter buffer
  plus one frame in hand, the clock catches up (releases up to 25% faster until it has; timestamps
  stay on the frame grid). Blocks (bursts) never trigger it: frames that arrive a block at a time
  well ahead are the scheduler's lookahead, a cushion against slow blocks that playing them sooner
  would throw away.
- **Underruns.** When generation falls behind, the next frame is not there when due. Under `hold`
  (the default) the live timeline keeps in step with the wall clock: viewers keep the last frame on
  screen, and when frames come back the clock restarts (with the jitter buffer again, rounded to
  whole frames), so the freeze is in the timestamps and latency does not grow. Under `stall` the
  timestamps stay the media timeline (frame index / fps): players see a continuous stream that
  pauses and re-buffers, which suits restreaming or recording the RTMP output. Both count and time
  the underrun.
- **Backlog.** A pusher far ahead of real time (no scheduler lookahead) would make the pacer hold
  minutes of video; past `max_backlog_s` the live outputs skip ahead to a keyframe (counted as
  dropped). Ingest and the MP4 are never affected: the pacer never blocks the encoder.
- **Slow consumers.** Consumers take packets without blocking (`offer`); each has its own bounded
  queue (`KeyframeGate`) and drops for itself only, resuming at the next keyframe.
- **Interactive sessions** (`AdaptiveClock`, the session's latency mode). The scheduler dispatches
  each of their blocks one generation time before it is due, so blocks arrive about on time and
  what is left to absorb is the spread of generation times. The clock starts like the smooth one
  (one jitter buffer after the first frame), and once it has seen `jitter_window_s` of arrivals it
  moves each frame's due time down to the latest arrival of that window plus `margin_s` (up to half
  a frame earlier per frame released, at most twice real time, timestamps following): the buffer is
  the measured jitter, not a fixed delay. A late frame is played `margin_s` after it came (an
  underrun, counted); the clock gives that held time back once the window no longer holds the late
  block, so one slow block never stays in the timeline. The underrun policy does not apply: the live timestamps are the
  release times.

`PacingClock` and `KeyframeGate` hold the rules without I/O or threads (tested with synthetic
clocks); `Pacer` runs them on the event loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from opentelemetry import trace
from opentelemetry.context import Context

from inferix.telemetry import BLOCK_INDEX_ATTR, SESSION_ID_ATTR
from inferix.telemetry import tracer as get_tracer
from streamer import metrics
from streamer.packets import EncodedPacket, LivePacket, StreamFormat

log = logging.getLogger("inferix.streamer.pacing")


class UnderrunPolicy(StrEnum):
    """What the live timeline does when generation falls behind real time."""

    HOLD = "hold"  # the freeze is in the timestamps (whole frames): viewers hold the last frame, stay in step
    STALL = "stall"  # timestamps stay frame index / fps (no gaps): players pause and re-buffer


@dataclass(frozen=True)
class PacingConfig:
    """Pacing settings of a streamer (`--jitter-buffer-ms`, `--underrun-policy`, `--max-backlog-s`).

    Under either policy a generation that falls behind is counted (underruns, seconds held) in the
    metrics, the stream info, the viewer page and the block's `streamer.publish` span.
    """

    jitter_buffer_s: float = 0.1
    policy: UnderrunPolicy = UnderrunPolicy.HOLD
    max_backlog_s: float = 60.0
    startup_s: float = 2.0  # seconds of steady-cadence frames after a (re)start that may reveal spare delay
    # Interactive sessions (AdaptiveClock): the arrivals that size the buffer, and the headroom over them.
    # Four seconds hold about twenty blocks of a 3-frame model at 16 fps: enough to see its spread of
    # generation times, short enough that a slow block's held time is given back soon after.
    jitter_window_s: float = 4.0
    margin_s: float = 0.02


@dataclass
class PacingClock:
    """When each frame is due and where it sits on the live timeline (times are `time.monotonic()` seconds)."""

    fps: float
    config: PacingConfig
    anchor_time: float | None = None  # frame `anchor_index` is due at `anchor_time`
    anchor_index: int = 0
    first_index: int = 0
    gap_frames: int = 0  # frame intervals the live timeline held the last frame for, in all underruns
    underruns: int = 0
    underrun_s: float = 0.0
    last_arrival: float = float("-inf")
    spare_s: float = 0.0  # how much earlier the clock may still move (catch-up after a (re)start)
    _min_slack: float = float("inf")
    _steady: int = 0  # frames seen at the steady cadence since the (re)start

    @property
    def started(self) -> bool:
        return self.anchor_time is not None

    def start(self, index: int, now: float) -> None:
        """The first frame arrived at `now`: it is due one jitter buffer later."""
        self.anchor_time = now + self.config.jitter_buffer_s
        self.anchor_index = self.first_index = index
        self._restart()

    def _restart(self) -> None:
        self.spare_s = 0.0
        self._steady = 0
        self._min_slack = float("inf")

    def observe(self, index: int, arrived: float) -> None:
        """Note how early a frame arrived; shortly after a (re)start this may let the clock catch up.

        Only frames that came at the steady cadence (about one frame interval after the previous
        one) count: in a burst frame n+1 arrives with frame n but is due a frame later, and the first
        frame of a block comes after a long gap, early on purpose (lookahead); neither is spare time.
        """
        gap, self.last_arrival = arrived - self.last_arrival, arrived
        interval = 1 / self.fps
        steady = 0.5 * interval <= gap <= 1.5 * interval
        if not steady or self._steady >= self.config.startup_s * self.fps or index <= self.anchor_index:
            return
        self._steady += 1
        self._min_slack = min(self._min_slack, self.due(index) - arrived)
        self.spare_s = max(0.0, self._min_slack - self.config.jitter_buffer_s - 1 / self.fps)

    def catch_up(self) -> float:
        """Move the clock up to a quarter frame earlier if start-up left spare delay; returns the shift."""
        if self.spare_s <= 0 or self.anchor_time is None:
            return 0.0
        shift = min(self.spare_s, 0.25 / self.fps)
        self.anchor_time -= shift
        self.spare_s -= shift
        self._min_slack -= shift
        return shift

    def due(self, index: int) -> float:
        assert self.anchor_time is not None, "start() first"
        return self.anchor_time + (index - self.anchor_index) / self.fps

    def due_index(self, now: float) -> float:
        """The (fractional) frame index due at `now`."""
        assert self.anchor_time is not None, "start() first"
        return self.anchor_index + (now - self.anchor_time) * self.fps

    def late_arrival(self, index: int, now: float) -> float:
        """Frame `index` arrived at `now` with nothing else waiting; returns the seconds it was late (0 if on time).

        A late frame means an underrun: the clock restarts a jitter buffer after `now`, rounded up to
        whole frame intervals so the live timeline stays on the frame grid (the freeze is k frames
        long; players and probes keep seeing a clean `fps` stream), and the freeze is counted.
        """
        old_due = self.due(index)
        if now <= old_due:
            return 0.0
        held = math.ceil((now + self.config.jitter_buffer_s - old_due) * self.fps - 1e-9)
        self.anchor_time = old_due + held / self.fps
        self.anchor_index = index
        self.gap_frames += held
        self._restart()
        self.underruns += 1
        frozen = held / self.fps
        self.underrun_s += frozen
        return frozen

    def skip_to(self, index: int, now: float, skipped: int) -> None:
        """Drop `skipped` frames before `index` from the live timeline: `index` is due now."""
        self.anchor_time = now
        self.anchor_index = index
        self.gap_frames -= skipped  # the timeline continues from the last frame shown
        self.spare_s = 0.0

    def live_s(self, index: int) -> float:
        """The frame's live timestamp (seconds since the live output started), by policy.

        Always on the 1/fps grid: catching up releases frames sooner but does not squeeze their
        timestamps; under `hold` the underruns' frozen frame intervals are in the timeline.
        """
        held = self.gap_frames if self.config.policy is UnderrunPolicy.HOLD else 0
        return (index - self.first_index + held) / self.fps


@dataclass
class AdaptiveClock(PacingClock):
    """The clock of an interactive session: its buffer is the arrival jitter measured over a window.

    Frame `index` is due at `anchor_time + (index - anchor_index) / fps` as in `PacingClock`; what
    differs is how the anchor moves (module docstring): down towards the latest arrival of the window
    (`catch_up`), up only for a frame that came late (`late_arrival`), and the live timestamps are
    the due times, so the browser sees exactly the cadence it is sent.
    """

    # (arrived, arrived - index / fps) of the frames of the last `jitter_window_s` that no later frame of
    # the window came as late as: offsets decrease along it, so the window's arrival line is the first.
    # Kept so that the line is read in O(1) for every frame released (`catch_up`), not searched for.
    _arrivals: collections.deque[tuple[float, float]] = field(default_factory=collections.deque)
    _started_at: float = 0.0
    _first_due: float = 0.0

    def start(self, index: int, now: float) -> None:
        super().start(index, now)
        assert self.anchor_time is not None
        self._first_due = self.anchor_time
        self._started_at = now
        self._arrivals.clear()

    def observe(self, index: int, arrived: float) -> None:
        arrivals, offset = self._arrivals, arrived - index / self.fps
        while arrivals and arrivals[-1][1] <= offset:
            arrivals.pop()  # this frame is as late, and leaves the window after it
        arrivals.append((arrived, offset))
        while arrivals[0][0] < arrived - self.config.jitter_window_s:
            arrivals.popleft()

    @property
    def measured(self) -> bool:
        """Whether a whole window of arrivals has been seen (until then the start-up buffer holds)."""
        return bool(self._arrivals) and self._arrivals[-1][0] - self._started_at >= self.config.jitter_window_s

    def buffer_s(self) -> float:
        """How much later than the window's latest arrival line frames are due: the buffer in use."""
        if self.anchor_time is None or not self._arrivals:
            return 0.0
        return self.anchor_time - self.anchor_index / self.fps - self._arrivals[0][1]

    def catch_up(self) -> float:
        """Move the clock up to half a frame earlier while it is later than the window needs: a player
        gets a slow block's held time back within about twice that time once the window forgets it."""
        if self.anchor_time is None or not self.measured:
            return 0.0
        excess = self.buffer_s() - self.config.margin_s
        if excess <= 0:
            return 0.0
        shift = min(excess, 0.5 / self.fps)
        self.anchor_time -= shift
        return shift

    def late_arrival(self, index: int, now: float) -> float:
        """Frame `index` came at `now` after it was due: it is played `margin_s` later (an underrun)."""
        old_due = self.due(index)
        if now <= old_due:
            return 0.0
        self.anchor_time = now + self.config.margin_s
        self.anchor_index = index
        frozen = self.anchor_time - old_due
        self.underruns += 1
        self.underrun_s += frozen
        return frozen

    def skip_to(self, index: int, now: float, skipped: int) -> None:
        """Frame `index` is due now (a backlog skip); its timestamp is its release time, as always here."""
        self.anchor_time = now
        self.anchor_index = index

    def live_s(self, index: int) -> float:
        """The frame's live timestamp: its due time since the first frame's (freezes and catch-up included)."""
        return self.due(index) - self._first_due


@dataclass
class KeyframeGate:
    """Admission to one consumer's bounded queue: start at a keyframe; on overflow drop until the next one.

    A P-frame is useless without the frames before it, so after a drop the consumer skips the rest
    of the GOP and resumes at the next keyframe (one per second) rather than showing corrupt video.
    Frames skipped while joining (before the first keyframe) are not counted as dropped.
    """

    capacity: int
    started: bool = False
    waiting: bool = True
    dropped: int = 0

    def admit(self, keyframe: bool, queued: int) -> bool:
        if queued >= self.capacity:
            self.waiting = True
            self.dropped += self.started
            return False
        if self.waiting and not keyframe:
            self.dropped += self.started
            return False
        self.waiting = False
        self.started = True
        return True

    def resync(self) -> None:
        """The consumer lost its state (e.g. reconnected): wait for a keyframe again, not counted as a drop."""
        self.started = False
        self.waiting = True


class LiveConsumer(Protocol):
    """A live output of one session (the RTMP publisher, a WebRTC viewer hub)."""

    name: str

    def offer(self, packet: LivePacket) -> None:
        """Take a released packet; called on the event loop and must not block (queue or drop)."""

    def end(self) -> None:
        """No more packets will come (the session ended or the streamer shuts down)."""


@dataclass
class LiveStats:
    """What the live side of a session did; read by GetStreamInfo, the viewer page and the tests."""

    created_at_unix: float | None = None  # from the scheduler's announcement
    first_in_unix: float | None = None
    first_out_unix: float | None = None
    frames_in: int = 0
    frames_out: int = 0
    underruns: int = 0
    underrun_s: float = 0.0
    backlog_frames: int = 0
    dropped: dict[str, int] = field(default_factory=dict)  # by output name
    sent: dict[str, int] = field(default_factory=dict)
    _recent_out: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=64))

    def count_drop(self, output: str, frames: int = 1) -> None:
        if frames:
            self.dropped[output] = self.dropped.get(output, 0) + frames
            metrics.FRAMES_DROPPED.labels(output).inc(frames)

    def count_sent(self, output: str) -> None:
        self.sent[output] = self.sent.get(output, 0) + 1
        metrics.FRAMES_SENT.labels(output).inc()

    @property
    def time_to_first_frame_s(self) -> float | None:
        start = self.created_at_unix if self.created_at_unix is not None else self.first_in_unix
        if start is None or self.first_out_unix is None:
            return None
        return max(0.0, self.first_out_unix - start)

    def fps_out(self, now: float | None = None) -> float:
        """Frames released per second over the last two seconds (0 when idle)."""
        now = time.monotonic() if now is None else now
        recent = [t for t in self._recent_out if now - t <= 2.0]
        if len(recent) < 2:
            return 0.0
        span = max(now - recent[0], recent[-1] - recent[0])
        return (len(recent) - 1) / span if span > 0 else 0.0


@dataclass
class _PublishSpan:
    """One block's release to the live outputs, reported as a `streamer.publish` span."""

    block_index: int
    parent: Context | None
    first_frame: int
    start_ns: int
    end_ns: int = 0
    frames: int = 0
    underruns: int = 0
    late_s: float = 0.0


class Pacer:
    """The `PacketSink` that paces one session's packets to its live consumers.

    `write`/`close` run on the encoder thread and only hand over to the event loop; the pacing task
    runs on the loop. `release` gets each packet when due; `on_end` is called once all are out.
    """

    name = "live"

    def __init__(
        self,
        session_id: str,
        fmt: StreamFormat,
        config: PacingConfig,
        stats: LiveStats,
        release: Callable[[LivePacket], None],
        on_end: Callable[[], None],
        tracer: trace.Tracer | None = None,
        interactive: bool = False,
    ) -> None:
        self.session_id = session_id
        self.clock = AdaptiveClock(fmt.fps, config) if interactive else PacingClock(fmt.fps, config)
        self.stats = stats
        self._release = release
        self._on_end = on_end
        self._loop = asyncio.get_running_loop()
        self._pending: collections.deque[EncodedPacket] = collections.deque()
        self._wakeup = asyncio.Event()
        self._closed = False
        self._aborted = False
        self._span: _PublishSpan | None = None
        self._late_blocks: dict[int, int] = {}  # underruns by the block whose frame came late
        self._tracer = tracer or get_tracer("inferix.streamer")
        self.task = self._loop.create_task(self._run(), name=f"pace-{session_id}")

    # ---- encoder thread ------------------------------------------------------------------------
    def write(self, packet: EncodedPacket) -> None:
        self._loop.call_soon_threadsafe(self._arrive, packet, time.monotonic())

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._close)

    # ---- event loop ----------------------------------------------------------------------------
    def abort(self) -> None:
        """Stop now (shutdown): packets not yet due are not sent."""
        self._aborted = True
        self._close()

    def _close(self) -> None:
        self._closed = True
        self._wakeup.set()

    def _arrive(self, packet: EncodedPacket, arrived: float) -> None:
        stats = self.stats
        stats.frames_in += 1
        if stats.first_in_unix is None:
            stats.first_in_unix = time.time() - (time.monotonic() - arrived)
        clock = self.clock
        if not clock.started:
            received = packet.received_s if packet.received_s is not None else arrived
            clock.start(packet.pts, min(received, arrived))
        elif not self._pending:
            frozen = clock.late_arrival(packet.pts, arrived)
            if frozen:
                stats.underruns, stats.underrun_s = clock.underruns, clock.underrun_s
                metrics.UNDERRUNS.inc()
                metrics.UNDERRUN_SECONDS.inc(frozen)
                if self._span is not None and self._span.block_index == packet.block_index:
                    self._span.underruns += 1  # late within the block being published
                else:
                    self._late_blocks[packet.block_index] = self._late_blocks.get(packet.block_index, 0) + 1
                log.debug("session %s: frame %d came %.3fs late (underrun)", self.session_id, packet.pts, frozen)
        clock.observe(packet.pts, packet.received_s if packet.received_s is not None else arrived)
        self._pending.append(packet)
        self._trim_backlog(arrived)
        stats.backlog_frames = len(self._pending)
        self._wakeup.set()

    def _trim_backlog(self, now: float) -> None:
        """Skip the live outputs ahead to a keyframe when far more than `max_backlog_s` is waiting."""
        pending = self._pending
        excess = (pending[-1].pts - self.clock.due_index(now)) / self.clock.fps - self.clock.config.max_backlog_s
        if excess <= 0:
            return
        target = pending[0].pts + int(excess * self.clock.fps) + 1
        keyframe = next((p for p in pending if p.pts >= target and p.keyframe), None)
        if keyframe is None:
            return  # no keyframe to resume at yet: keep everything until one arrives
        dropped = 0
        while pending[0] is not keyframe:
            pending.popleft()
            dropped += 1
        self.clock.skip_to(keyframe.pts, now, dropped)
        self.stats.count_drop("live", dropped)
        log.warning(
            "session %s: live outputs skipped %d frames (more than %.0fs buffered)",
            self.session_id,
            dropped,
            self.clock.config.max_backlog_s,
        )

    async def _run(self) -> None:
        try:
            while True:
                if self._aborted:
                    break
                if not self._pending:
                    if self._closed:
                        break
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                packet = self._pending[0]
                delay = self.clock.due(packet.pts) - time.monotonic()
                if delay > 0:
                    self._wakeup.clear()
                    # woken early by an abort or a backlog skip; a normal arrival changes nothing due before it
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wakeup.wait(), delay)
                    continue
                self._pending.popleft()
                self._emit(packet, -delay)
                self.clock.catch_up()
        except Exception:
            log.exception("session %s: pacing failed; live outputs stop", self.session_id)
        finally:
            self._end_span()
            self.stats.backlog_frames = 0
            self._on_end()

    def _emit(self, packet: EncodedPacket, late_s: float) -> None:
        now = time.monotonic()
        stats = self.stats
        stats.frames_out += 1
        stats.backlog_frames = len(self._pending)
        stats._recent_out.append(now)
        if stats.first_out_unix is None:
            stats.first_out_unix = time.time()
            ttff = stats.time_to_first_frame_s
            if ttff is not None:
                metrics.TIME_TO_FIRST_FRAME.observe(ttff)
        metrics.FRAMES_OUT.inc()
        metrics.PACING_LATENESS.observe(late_s)
        self._track_span(packet, late_s)
        try:
            self._release(LivePacket(packet, self.clock.live_s(packet.pts)))
        except Exception:
            log.exception("session %s: a live output failed on frame %d", self.session_id, packet.pts)

    def _track_span(self, packet: EncodedPacket, late_s: float) -> None:
        span = self._span
        now_ns = time.time_ns()
        if span is None or span.block_index != packet.block_index:
            self._end_span()
            span = self._span = _PublishSpan(packet.block_index, packet.trace_context, packet.pts, now_ns)
            span.underruns = self._late_blocks.pop(packet.block_index, 0)
        span.frames += 1
        span.end_ns = now_ns
        span.late_s = max(span.late_s, late_s)

    def _end_span(self) -> None:
        span, self._span = self._span, None
        if span is None:
            return
        self._tracer.start_span(
            "streamer.publish",
            context=span.parent,
            start_time=span.start_ns,
            attributes={
                SESSION_ID_ATTR: self.session_id,
                BLOCK_INDEX_ATTR: span.block_index,
                "inferix.first_frame": span.first_frame,
                "inferix.frames": span.frames,
                "inferix.underruns": span.underruns,
                "inferix.max_release_lateness_seconds": span.late_s,
                "inferix.underrun_policy": str(self.clock.config.policy),
                "inferix.latency": "interactive" if isinstance(self.clock, AdaptiveClock) else "smooth",
            },
        ).end(end_time=max(span.end_ns, span.start_ns))
