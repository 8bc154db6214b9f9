"""Real-time capacity from measured block latencies (workers.capacity), and the worker's startup probe."""

from __future__ import annotations

import asyncio

import pytest

from engine.families.wan.loader import load_wan_model
from inferix.spec.capacity import Resolution
from workers.capacity import HEADROOM, MAX_STREAMS, CapacityMeter
from workers.service import WorkerConfig, WorkerService

FPS = 16.0
FRAMES = 3  # a toyworld block: budget 187.5 ms


def test_streams_are_the_largest_batch_whose_blocks_fit_the_budget_with_headroom() -> None:
    meter = CapacityMeter(FPS)
    for batch, latency in ((1, 0.060), (2, 0.090), (4, 0.150), (8, 0.270)):  # 30 ms per extra session
        meter.record(64, 64, batch, latency, FRAMES)
    (cap,) = meter.capacities()
    # 4 -> 150 ms fits, the line through the points gives 5 -> 180 ms: within the 187.5 ms budget, but
    # past the 168.75 ms of its headroom
    assert pytest.approx(0.16875) == HEADROOM * FRAMES / FPS
    assert (cap.resolution, cap.streams, cap.measured_up_to) == (Resolution(64, 64), 4, 8)
    assert cap.budget_ms == pytest.approx(1e3 * FRAMES / FPS) and cap.block_ms == pytest.approx(150)


def test_one_measured_size_assumes_no_further_batching_gain() -> None:
    meter = CapacityMeter(FPS)
    meter.record(64, 64, 2, 0.100, FRAMES)  # 2 sessions in 100 ms: 3 would take 150 ms, 4 200 ms
    assert meter.at(64, 64).streams == 3  # type: ignore[union-attr]
    assert meter.at(32, 32) is None


def test_a_worker_claims_at_most_one_session_past_the_largest_batch_it_measured() -> None:
    meter = CapacityMeter(FPS)
    for batch in (1, 2, 4, 8):  # 10 ms whatever the batch: the line would fit hundreds of sessions
        meter.record(64, 64, batch, 0.010, FRAMES)
    cap = meter.at(64, 64)
    assert cap is not None and (cap.streams, cap.measured_up_to) == (9, 8)
    meter.record(64, 64, 9, 0.010, FRAMES)  # it served 9 at once: the claim grows by one
    assert meter.at(64, 64).streams == 10  # type: ignore[union-attr]


def test_a_worker_slower_than_real_time_holds_no_stream_and_says_how_slow() -> None:
    meter = CapacityMeter(FPS)
    meter.record(128, 128, 1, 1.0, 12)  # budget 750 ms
    cap = meter.at(128, 128)
    assert cap is not None and cap.streams == 0 and cap.block_ms == pytest.approx(1000)


def test_measurements_are_averaged_per_resolution_and_batch_size() -> None:
    meter = CapacityMeter(FPS)
    meter.record(64, 64, 1.2, 0.100, FRAMES)  # a mean batch of 1.2 counts as 1
    meter.record(64, 64, 1, 0.200, FRAMES)
    meter.record(32, 32, 1, 0.010, FRAMES)
    small, large = meter.capacities()
    assert (small.resolution.width, large.resolution.width) == (32, 64)
    assert large.block_ms == pytest.approx(1e3 * (0.7 * 0.100 + 0.3 * 0.200))
    assert small.streams == 2  # 10 ms alone: one session past the one measured


def test_a_flat_latency_line_claims_at_most_max_streams() -> None:
    meter = CapacityMeter(FPS)
    meter.record(64, 64, 1, 0.010, FRAMES)
    meter.record(64, 64, 2 * MAX_STREAMS, 0.010, FRAMES)
    assert meter.at(64, 64).streams == MAX_STREAMS  # type: ignore[union-attr]


def test_a_pinned_capacity_overrides_the_measured_streams_only() -> None:
    meter = CapacityMeter(FPS, pinned_streams=6)
    meter.record(64, 64, 1, 0.150, FRAMES)
    cap = meter.at(64, 64)
    assert cap is not None and cap.streams == 6 and cap.block_ms == pytest.approx(150 * 6)
    with pytest.raises(ValueError, match="pinned_streams"):
        CapacityMeter(FPS, pinned_streams=-1)


def test_cleared_latencies_are_forgotten_and_later_ones_stand_alone() -> None:
    meter = CapacityMeter(FPS)
    meter.record(64, 64, 1, 0.900, FRAMES)  # a slow first block (the probe's warm-up)
    meter.clear()
    assert meter.at(64, 64) is None and meter.capacities() == []
    meter.record(64, 64, 1, 0.080, FRAMES)
    cap = meter.at(64, 64)
    # 80 ms of a 187.5 ms budget: 2 streams (blended with the cleared 900 ms it would be none)
    assert cap is not None and cap.streams == 2 and cap.block_ms == pytest.approx(160.0)


def test_the_worker_probe_measures_its_native_resolution_with_batched_sessions() -> None:
    """The real startup probe of a toyworld worker (no other service needed: it talks to none)."""
    model = load_wan_model("toyworld")

    async def probe() -> tuple[list[object], list[str], int]:
        service = WorkerService(model, WorkerConfig("w", "127.0.0.1:1", kv_pages=64, capacity_probe_streams=2))
        await service.probe_capacity()
        return service.capacity_report(), service.pool.session_ids(), service.batcher.running

    report, left_open, running = asyncio.run(probe())
    assert left_open == [] and running == 0  # probe sessions are closed, their pages freed
    (cap,) = report
    assert (cap.resolution.width, cap.resolution.height) == (64, 64)  # type: ignore[attr-defined]
    assert cap.measured_up_to in (1, 2) and cap.budget_ms == pytest.approx(187.5)  # type: ignore[attr-defined]
    assert cap.block_ms > 0  # type: ignore[attr-defined]
