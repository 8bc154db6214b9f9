"""Pacing rules (`PacingClock`, `KeyframeGate`) on synthetic clocks, and the `Pacer` on a real event loop."""

from __future__ import annotations

import asyncio
import time

import pytest

from streamer.pacing import (
    AdaptiveClock,
    KeyframeGate,
    LiveStats,
    Pacer,
    PacingClock,
    PacingConfig,
    UnderrunPolicy,
)
from streamer.packets import EncodedPacket, LivePacket, StreamFormat


def packet(index: int, keyframe: bool = False, block: int = 0) -> EncodedPacket:
    return EncodedPacket(b"\x00\x00\x00\x01" + bytes([index % 256]), index, index, 1, keyframe, block_index=block)


def test_frames_are_due_on_the_wall_clock_after_the_jitter_buffer() -> None:
    clock = PacingClock(16.0, PacingConfig(jitter_buffer_s=0.1))
    clock.start(0, now=100.0)
    assert clock.due(0) == pytest.approx(100.1)
    assert clock.due(16) == pytest.approx(101.1)
    assert clock.live_s(8) == pytest.approx(0.5)
    assert clock.due_index(100.6) == pytest.approx(8.0)
    assert clock.late_arrival(5, now=100.2) == 0.0  # early frames change nothing
    assert clock.underruns == 0


@pytest.mark.parametrize("policy", list(UnderrunPolicy))
def test_a_late_frame_is_an_underrun_and_the_policy_sets_the_timeline(policy: UnderrunPolicy) -> None:
    clock = PacingClock(10.0, PacingConfig(jitter_buffer_s=0.2, policy=policy))
    clock.start(0, now=0.0)  # frame 10 due at 1.2
    frozen = clock.late_arrival(10, now=2.0)  # 0.8 s late: re-buffers, due again at 2.2
    assert frozen == pytest.approx(1.0)
    assert (clock.underruns, clock.underrun_s) == (1, pytest.approx(1.0))
    assert clock.due(10) == pytest.approx(2.2) and clock.due(11) == pytest.approx(2.3)
    if policy is UnderrunPolicy.HOLD:
        assert clock.live_s(10) == pytest.approx(2.0)  # the freeze is in the timestamps
    else:
        assert clock.live_s(10) == pytest.approx(1.0)  # continuous media time; players re-buffer


def test_a_late_starting_frame_is_caught_up_on_but_bursts_are_not() -> None:
    fps, jitter = 16.0, 0.1
    # frame 0 came in 0.3 s late (a cold stream); frames 1.. arrive on time at i / fps
    clock = PacingClock(fps, PacingConfig(jitter_buffer_s=jitter))
    clock.start(0, now=0.3)
    clock.observe(0, 0.3)
    for index in range(1, 30):
        clock.observe(index, max(0.3, index / fps))  # frames 1-4 were held up with it
    assert clock.spare_s == pytest.approx(0.3 - 1 / fps)  # all of the lateness but one frame's margin
    shifts = [clock.catch_up() for _ in range(40)]
    assert max(shifts) <= 0.25 / fps + 1e-9  # at most 25% faster while catching up
    assert sum(shifts) == pytest.approx(0.3 - 1 / fps)
    assert clock.due(29) - 29 / fps == pytest.approx(jitter + 1 / fps)

    # blocks arrive as bursts, well before they are due (the scheduler's lookahead): that cushion stays
    clock = PacingClock(fps, PacingConfig(jitter_buffer_s=jitter))
    clock.start(0, now=0.0)
    clock.observe(0, 0.0)
    for block in range(4):
        for index in range(max(1, 12 * block), 12 * (block + 1)):
            clock.observe(index, 0.2 * block + 0.004 * (index - 12 * block))
    assert clock.spare_s == 0.0 and clock.catch_up() == 0.0


def test_skip_to_makes_a_frame_due_now() -> None:
    clock = PacingClock(16.0, PacingConfig(jitter_buffer_s=0.0))
    clock.start(0, now=0.0)
    clock.skip_to(160, now=2.0, skipped=150)
    assert clock.due(160) == pytest.approx(2.0)
    assert clock.due(176) == pytest.approx(3.0)


def _arrive(clock: AdaptiveClock, index: int, at: float, pending: bool = False) -> float:
    """What the pacer does with an arrival: a late one (nothing pending) is an underrun; then observe it."""
    if not clock.started:
        clock.start(index, at)
        frozen = 0.0
    else:
        frozen = 0.0 if pending else clock.late_arrival(index, at)
    clock.observe(index, at)
    return frozen


def _blocks(clock: AdaptiveClock, fps: float, blocks: range, lateness: dict[int, float]) -> float:
    """3-frame blocks arriving at once, on their due line plus `lateness[block]`; releases every frame
    when due (catching up after each, as the pacer does). Returns the seconds frozen."""
    frozen = 0.0
    for block in blocks:
        first = 3 * block
        at = first / fps + lateness.get(block, 0.0)
        for index in range(first, first + 3):
            frozen += _arrive(clock, index, at + 0.001 * (index - first), pending=index > first)
        for _ in range(3):
            clock.catch_up()
    return frozen


def test_an_interactive_clock_shrinks_its_buffer_to_the_measured_jitter() -> None:
    fps = 16.0
    config = PacingConfig(jitter_buffer_s=0.1, jitter_window_s=2.0, margin_s=0.01)
    clock = AdaptiveClock(fps, config)
    jitter = {b: 0.02 * (b % 3) for b in range(200)}  # blocks come 0, 20 or 40 ms after their line
    assert _blocks(clock, fps, range(0, 11), jitter) == 0.0  # ~2 s: the start-up buffer holds
    assert clock.due(0) == pytest.approx(0.1)
    assert _blocks(clock, fps, range(11, 40), jitter) == 0.0
    assert clock.underruns == 0
    # the buffer is now the spread seen (40 ms) plus the margin, not the 100 ms it started with
    assert clock.due(120) - 120 / fps == pytest.approx(0.04 + 0.01, abs=1e-6)
    assert clock.buffer_s() == pytest.approx(0.01, abs=1e-6)
    # timestamps are the due times: steady except where the clock caught up (a quarter frame at most)
    steps = [clock.live_s(i + 1) - clock.live_s(i) for i in range(100, 119)]
    assert all(step == pytest.approx(1 / fps) for step in steps)


def test_an_interactive_clock_gives_a_late_blocks_held_time_back() -> None:
    fps = 16.0
    config = PacingConfig(jitter_buffer_s=0.1, jitter_window_s=2.0, margin_s=0.01)
    clock = AdaptiveClock(fps, config)
    _blocks(clock, fps, range(0, 40), {})
    settled = clock.due(120) - 120 / fps
    assert settled == pytest.approx(0.01, abs=1e-6)  # the first frame of each block sets the line
    frozen = _blocks(clock, fps, range(40, 41), {40: 0.3})  # one slow block: 300 ms late
    assert clock.underruns == 1 and frozen == pytest.approx(0.3 - settled + 0.01, abs=1e-6)
    assert clock.due(123) - 123 / fps == pytest.approx(0.31, abs=1e-6)  # played as it came, plus the margin
    _blocks(clock, fps, range(41, 80), {})  # on time again: once the window forgets it, the delay goes
    assert clock.due(240) - 240 / fps == pytest.approx(settled, abs=1e-6)
    assert clock.underruns == 1
    # a smooth clock keeps a freeze in its timeline for good (the `hold` policy)
    smooth = PacingClock(fps, PacingConfig(jitter_buffer_s=0.1))
    smooth.start(0, 0.0)
    smooth.late_arrival(120, 120 / fps + 0.3)
    assert smooth.due(240) - 240 / fps >= 0.3


def test_keyframe_gate_starts_at_a_keyframe_and_drops_a_gop_on_overflow() -> None:
    gate = KeyframeGate(capacity=3)
    assert [gate.admit(k, 0) for k in (False, False)] == [False, False]
    assert gate.dropped == 0  # skipping to the first keyframe is joining, not dropping
    assert gate.admit(True, 0) and gate.admit(False, 1) and gate.admit(False, 2)
    assert not gate.admit(False, 3)  # full: this one and the rest of its GOP go
    assert not gate.admit(False, 0)
    assert gate.dropped == 2
    assert gate.admit(True, 0)  # the next keyframe resumes
    gate.resync()
    assert not gate.admit(False, 0) and gate.dropped == 2


class Recorder:
    """A live consumer that records when each packet was released."""

    name = "test"

    def __init__(self) -> None:
        self.released: list[tuple[int, float, float]] = []  # (index, monotonic time, live_s)
        self.ended = False

    def offer(self, live: LivePacket) -> None:
        self.released.append((live.packet.pts, time.monotonic(), live.live_s))

    def end(self) -> None:
        self.ended = True


def _pace(frames: list[tuple[float, EncodedPacket]], config: PacingConfig, fps: float) -> tuple[Recorder, LiveStats]:
    """Feed `(delay before, packet)` pairs from a thread, as the encoder does; run until the pacer ends."""
    recorder, stats = Recorder(), LiveStats()

    async def main() -> None:
        done = asyncio.Event()
        pacer = Pacer("s", StreamFormat(64, 64, fps), config, stats, recorder.offer, done.set)

        def feed() -> None:
            for delay, item in frames:
                time.sleep(delay)
                pacer.write(item)
            pacer.close()

        await asyncio.gather(asyncio.to_thread(feed), done.wait())
        recorder.end()

    asyncio.run(main())
    return recorder, stats


def test_pacer_turns_a_burst_into_frames_at_the_frame_rate() -> None:
    fps = 50.0
    burst = [(0.0, packet(i, keyframe=i % 10 == 0)) for i in range(25)]  # half a second of video at once
    started = time.monotonic()
    recorder, stats = _pace(burst, PacingConfig(jitter_buffer_s=0.05), fps)
    assert [index for index, _, _ in recorder.released] == list(range(25))
    first = recorder.released[0][1]
    assert first - started == pytest.approx(0.05, abs=0.04)  # the jitter buffer
    for index, at, live_s in recorder.released:
        assert at - first == pytest.approx(index / fps, abs=0.025), index  # on the wall clock, not the burst
        assert live_s == pytest.approx(index / fps)
    assert (stats.frames_in, stats.frames_out, stats.underruns) == (25, 25, 0)
    assert stats.time_to_first_frame_s == pytest.approx(0.05, abs=0.04)


def test_pacer_holds_through_an_underrun_and_reports_it() -> None:
    fps = 50.0
    frames = [(0.0, packet(i, keyframe=i == 0)) for i in range(5)]
    frames.append((0.3, packet(5)))  # generation falls behind: frame 5 is 0.2 s late
    frames += [(0.0, packet(i)) for i in range(6, 10)]
    recorder, stats = _pace(frames, PacingConfig(jitter_buffer_s=0.02), fps)
    times = {index: at for index, at, _ in recorder.released}
    live = {index: live_s for index, _, live_s in recorder.released}
    assert stats.underruns == 1 and stats.underrun_s == pytest.approx(0.22, abs=0.05)
    assert times[5] - times[4] == pytest.approx(0.22, abs=0.05)  # the last frame was held meanwhile
    assert times[6] - times[5] == pytest.approx(1 / fps, abs=0.025)  # then the frame rate again
    assert live[5] - live[4] == pytest.approx(times[5] - times[4], abs=0.025)  # hold: timestamps carry the gap
    assert all(round(value * fps, 6).is_integer() for value in live.values())  # on the frame grid
    assert recorder.ended


def test_pacer_skips_live_outputs_ahead_when_the_backlog_is_too_long() -> None:
    fps = 100.0
    frames = [(0.0, packet(i, keyframe=i % 20 == 0)) for i in range(100)]  # 1 s at once, 0.3 s allowed
    recorder, stats = _pace(frames, PacingConfig(jitter_buffer_s=0.0, max_backlog_s=0.3), fps)
    released = [index for index, _, _ in recorder.released]
    assert released[-1] == 99 and len(released) < 100
    assert stats.dropped["live"] == 100 - len(released)
    resumed = next(b for a, b in zip(released, released[1:], strict=False) if b != a + 1)
    assert resumed % 20 == 0  # live outputs resume at a keyframe
