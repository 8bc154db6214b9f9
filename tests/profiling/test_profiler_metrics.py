"""The standard metrics, hooks and custom metrics, bounded buffers, and CUDA-event timing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from inferix.profiling import BLOCK_DONE, CudaClock, Profiler, percentile, profile
from tests.profiling.helpers import FakeGpu, ManualClock


def test_percentiles_use_the_nearest_rank_method() -> None:
    values = [float(v) for v in range(1, 11)]
    assert (percentile(values, 50), percentile(values, 90), percentile(values, 99)) == (5.0, 9.0, 10.0)
    hundred = [float(v) for v in range(1, 101)]
    assert (percentile(hundred, 50), percentile(hundred, 90), percentile(hundred, 99)) == (50.0, 90.0, 99.0)
    assert percentile([3.5], 50) == percentile([3.5], 99) == 3.5
    assert percentile([1.0, 2.0], 50) == 1.0  # an observed value, never interpolated
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile(values, 0)


def test_standard_metrics_follow_their_definitions(
    make_profiler: Callable[..., Profiler], manual_clock: ManualClock
) -> None:
    profiler = make_profiler(clock=manual_clock, fps=16.0)
    with profiler.session():
        manual_clock.advance(0.1)
        profiler.mark_block_start(0)
        manual_clock.advance(0.6)
        profiler.mark_frames(1)  # a streaming decoder hands out the first frame mid-block
        manual_clock.advance(0.3)
        profiler.mark_block_done(0, pixel_frames=9)  # t = 1.0, latency 0.9
        manual_clock.advance(0.6)
        profiler.mark_block_done(1, pixel_frames=12)  # no start mark: starts at block 0's done, latency 0.6
        manual_clock.advance(0.4)
        with profiler.block(2) as block:  # t = 2.0 .. 2.4
            manual_clock.advance(0.4)
            block.pixel_frames = 12
        manual_clock.advance(0.6)  # idle after the last block: session time, not end-to-end time
    summary = profiler.report().summary

    assert summary.time_to_first_frame_s == pytest.approx(0.7)
    assert summary.time_to_first_block_s == pytest.approx(1.0)
    assert summary.end_to_end_s == pytest.approx(2.4)
    assert summary.session_s == pytest.approx(3.0)
    assert (summary.blocks, summary.pixel_frames) == (3, 33)
    assert summary.pixel_fps == pytest.approx(33 / 2.4)
    assert summary.real_time_factor == pytest.approx((33 / 16) / 2.4)
    latency = summary.block_latency
    assert latency is not None
    assert (latency.count, latency.min_s, latency.p50_s, latency.p90_s, latency.max_s) == pytest.approx(
        (3, 0.4, 0.6, 0.9, 0.9)
    )
    blocks = profiler.report().blocks
    assert [(b.index, b.start_s, b.done_s) for b in blocks] == pytest.approx(
        [(0, 0.1, 1.0), (1, 1.0, 1.6), (2, 2.0, 2.4)]
    )


def test_first_frame_is_the_first_block_when_frames_come_per_block(
    make_profiler: Callable[..., Profiler], manual_clock: ManualClock
) -> None:
    profiler = make_profiler(clock=manual_clock)  # no fps: no real-time factor
    with profiler.session():
        manual_clock.advance(0.5)
        profiler.mark_block_done(0, pixel_frames=0)  # e.g. a decoder that holds the first block back
        manual_clock.advance(0.5)
        profiler.mark_block_done(1, pixel_frames=8)
    summary = profiler.report().summary
    assert (summary.time_to_first_block_s, summary.time_to_first_frame_s) == pytest.approx((0.5, 1.0))
    assert summary.real_time_factor is None and summary.pixel_fps == pytest.approx(8.0)


def test_hooks_get_the_block_values_and_custom_events(
    make_profiler: Callable[..., Profiler], manual_clock: ManualClock
) -> None:
    profiler = make_profiler(clock=manual_clock)
    blocks: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    order: list[str] = []
    profiler.on(BLOCK_DONE, lambda **payload: blocks.append(payload))
    profiler.on("step_done", lambda **payload: steps.append(payload))
    profiler.on("step_done", lambda **payload: order.append(f"second {payload['step']}"))
    with profiler.session():
        for index in range(2):
            with profiler.block(index) as block:
                for step in range(3):
                    with profile("denoise_step", block=index, step=step):
                        manual_clock.advance(0.1)
                    profiler.emit("step_done", block=index, step=step)
                    order.append(f"first {step}")
                block.pixel_frames = 9
            profiler.record("kv_pages", 6 * (index + 1), block=index)
    report = profiler.report()

    assert [b["block_index"] for b in blocks] == [0, 1]
    assert blocks[1]["pixel_frames"] == 9
    assert blocks[1]["start_s"] == pytest.approx(0.3) and blocks[1]["done_s"] == pytest.approx(0.6)
    assert blocks[1]["latency_s"] == pytest.approx(0.3)
    assert steps == [{"block": b, "step": s} for b in range(2) for s in range(3)]
    assert order[:2] == ["second 0", "first 0"]  # callbacks run synchronously, in registration order
    assert [(m.name, m.value, m.attrs) for m in report.metrics] == [
        ("kv_pages", 6.0, {"block": 0}),
        ("kv_pages", 12.0, {"block": 1}),
    ]
    assert report.metrics[1].t_s >= report.metrics[0].t_s


def test_a_block_that_raises_is_a_failed_region_and_not_done(make_profiler: Callable[..., Profiler]) -> None:
    profiler = make_profiler()
    with profiler.session():
        with pytest.raises(RuntimeError), profiler.block(0):
            raise RuntimeError("out of memory")
        with profiler.block(1) as block:
            block.pixel_frames = 4
    report = profiler.report()
    assert [b.index for b in report.blocks] == [1]
    assert [(r.name, r.attrs["block"], r.error) for r in report.regions] == [
        ("block", 0, "RuntimeError: out of memory"),
        ("block", 1, None),
    ]


def test_bounded_buffers_drop_the_oldest_and_keep_totals_exact(
    make_profiler: Callable[..., Profiler], manual_clock: ManualClock
) -> None:
    profiler = make_profiler(clock=manual_clock, max_records=4)
    with profiler.session():
        for index in range(10):
            with profiler.block(index) as block:
                manual_clock.advance(0.1 * (index + 1))
                block.pixel_frames = 3
            profiler.record("kv_pages", index)
    report = profiler.report()
    assert [b.index for b in report.blocks] == [6, 7, 8, 9]
    assert len(report.regions) == len(report.metrics) == 4
    assert report.ranks[0].dropped.blocks == report.ranks[0].dropped.regions == report.ranks[0].dropped.metrics == 6
    assert (report.summary.blocks, report.summary.pixel_frames) == (10, 30)
    assert report.summary.time_to_first_block_s == pytest.approx(0.1)
    assert report.summary.block_latency is not None and report.summary.block_latency.count == 4


def test_cuda_times_come_from_events_resolved_without_synchronizing_the_hot_path(
    make_profiler: Callable[..., Profiler], fake_gpu: FakeGpu, cuda_clock: CudaClock
) -> None:
    profiler = make_profiler(clock=cuda_clock)
    done: list[dict[str, Any]] = []
    profiler.on(BLOCK_DONE, lambda **payload: done.append(payload))
    profiler.start()
    fake_gpu.run(5.0)  # queued work from before the block
    with profiler.block(0) as block:
        with profile("denoise_step", step=0):
            fake_gpu.run(30.0)  # kernels take 30 ms on the device; Python returns at once
        with profile("vae_decode"):
            fake_gpu.run(20.0)
        block.pixel_frames = 9

    assert fake_gpu.synchronizations == 0  # the hot path never waited for the device
    assert done == []  # the block's events have not completed: its latency is not known yet

    fake_gpu.finish()
    with profile("next"):  # any later profiler call resolves what completed, without waiting
        pass
    assert fake_gpu.synchronizations == 0
    assert [d["block_index"] for d in done] == [0]
    assert done[0]["latency_s"] == pytest.approx(0.050) and done[0]["start_s"] == pytest.approx(0.005)

    with profile("unfinished"):
        fake_gpu.run(7.0)
    report = profiler.report()  # report time may wait for what is still pending
    assert fake_gpu.synchronizations > 0
    profiler.stop()

    regions = {r.name: r for r in report.regions}
    assert regions["denoise_step"].duration_s == pytest.approx(0.030)
    assert regions["vae_decode"].start_s == pytest.approx(0.035)
    assert regions["block"].self_s == pytest.approx(0.0)
    assert regions["unfinished"].duration_s == pytest.approx(0.007)
    assert regions["denoise_step"].cpu_duration_s < 0.030  # CPU side only launched the work
    assert report.ranks[0].clock == "cuda" and report.ranks[0].device == "fake gpu"


def test_record_refuses_values_json_cannot_hold(make_profiler: Callable[..., Profiler]) -> None:
    profiler = make_profiler()
    with profiler.session():
        with pytest.raises(ValueError, match="kv_pages=inf: record\\(\\) needs a finite number"):
            profiler.record("kv_pages", float("inf"))
        profiler.record("kv_pages", 3)
    assert [m.value for m in profiler.report().metrics] == [3.0]
