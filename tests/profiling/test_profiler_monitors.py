"""Background monitors: process readings, gauges, failures, bounded timeline, optional NVML."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import pytest

from inferix.profiling import Profiler, ProfileReport
from inferix.profiling.monitors import NvmlMonitor, ProcessMonitor


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_sampler_records_process_readings_and_gauges(make_profiler: Callable[..., Profiler]) -> None:
    pool = {"used_pages": 0, "total_pages": 64}
    profiler = make_profiler(sample_interval_s=0.01)
    profiler.add_gauge("kv_pool", lambda: pool)  # registered before start
    with profiler.session():
        for used in range(1, 6):
            pool["used_pages"] = used
            _busy(0.03)
        profiler.add_gauge("queue_depth", lambda: 2)  # registered while running
        _busy(0.05)
    timeline = profiler.report().timelines[0]

    assert len(timeline.t_s) >= 5 and timeline.t_s == sorted(timeline.t_s)
    assert {"process.cpu_percent", "process.rss_bytes", "kv_pool.used_pages", "kv_pool.total_pages"} <= set(
        timeline.series
    )
    assert all(v is not None and v > 10_000_000 for v in timeline.series["process.rss_bytes"])
    busiest = max(v or 0.0 for v in timeline.series["process.cpu_percent"])
    assert 0.0 < busiest <= 150.0 * (os.cpu_count() or 1)  # the busy loop shows; how much depends on the machine
    readings = [v for v in timeline.series["kv_pool.used_pages"] if v is not None]
    assert (
        readings == sorted(readings) and readings[-1] == 5.0 and set(timeline.series["kv_pool.total_pages"]) == {64.0}
    )
    queue = timeline.series["queue_depth"]
    assert queue[0] is None and queue[-1] == 2.0  # None before the gauge existed


def test_a_failing_gauge_is_logged_and_dropped_while_the_others_go_on(
    make_profiler: Callable[..., Profiler], caplog: pytest.LogCaptureFixture
) -> None:
    calls = {"broken": 0}

    def broken() -> float:
        calls["broken"] += 1
        raise RuntimeError("pool is gone")

    profiler = make_profiler(sample_interval_s=0.01)
    profiler.add_gauge("broken", broken)
    profiler.add_gauge("fine", lambda: 1.0)
    with caplog.at_level(logging.WARNING, logger="inferix.profiling.monitors"), profiler.session():
        time.sleep(0.08)
    timeline = profiler.report().timelines[0]

    assert calls["broken"] == 1
    assert "broken" not in timeline.series and len(timeline.series["fine"]) == len(timeline.t_s) >= 3
    assert "'broken' failed" in caplog.text


def test_the_timeline_is_bounded(make_profiler: Callable[..., Profiler]) -> None:
    profiler = make_profiler(sample_interval_s=0.005, max_samples=3)
    with profiler.session():
        time.sleep(0.08)
    report = profiler.report()
    assert len(report.timelines[0].t_s) == 3 and report.ranks[0].dropped.samples > 0


def test_process_monitor_reads_cpu_and_rss() -> None:
    monitor = ProcessMonitor()
    _busy(0.02)
    values = monitor.sample()
    assert values["process.cpu_percent"] > 0 and values["process.rss_bytes"] > 0


def test_nvml_monitor_is_optional_and_never_raises() -> None:
    # Without pynvml, a driver or a GPU it answers None; with a GPU it reads the gpu.* series.
    monitor = NvmlMonitor.open(0)
    if monitor is None:
        return
    try:
        values = monitor.sample()
        assert "gpu.memory_used_bytes" in values and values["gpu.memory_total_bytes"] > 0
    finally:
        monitor.close()


def test_non_finite_gauge_readings_are_missing_values(make_profiler: Callable[..., Profiler]) -> None:
    profiler = make_profiler(sample_interval_s=0.01)
    profiler.add_gauge("kv_pool", lambda: {"used_pages": float("nan"), "total_pages": 64.0})
    with profiler.session():
        time.sleep(0.03)
    report = profiler.report()
    assert "kv_pool.used_pages" not in report.timelines[0].series
    assert ProfileReport.from_json(report.to_json()) == report  # still valid JSON
