"""Inferix's built-in profiler: timed regions, the standard metrics, monitors and reports.

    profiler = Profiler(fps=16, label="self-forcing 480p")
    with profiler.session():
        with profiler.block(0) as block:
            with profile("denoise_step", block=0, step=0):
                ...
            block.pixel_frames = 9
    profiler.write("out/profile")          # profile-rank0.json + profile-rank0.html

The metric definitions (time to first block/frame, per-block latency, pixel fps, real-time
factor, percentiles) are in `inferix.profiling.metrics`; `inferix profile REPORT.json` prints a
report and `inferix profile merge` combines the ranks of one multi-GPU worker.
"""

from inferix.profiling.clock import Clock, CpuClock, CudaClock, Stamp
from inferix.profiling.metrics import percentile
from inferix.profiling.monitors import GaugeValue
from inferix.profiling.otel import OtelExporter
from inferix.profiling.profiler import BLOCK_DONE, BlockScope, Profiler, Region, get_profiler, profile
from inferix.profiling.records import (
    BlockRecord,
    DurationStats,
    MetricSample,
    RankInfo,
    RegionRecord,
    RegionStats,
    Summary,
    Timeline,
)
from inferix.profiling.report import SCHEMA_VERSION, ProfileReport, merge_reports

__all__ = [
    "BLOCK_DONE",
    "SCHEMA_VERSION",
    "BlockRecord",
    "BlockScope",
    "Clock",
    "CpuClock",
    "CudaClock",
    "DurationStats",
    "GaugeValue",
    "MetricSample",
    "OtelExporter",
    "ProfileReport",
    "Profiler",
    "RankInfo",
    "Region",
    "RegionRecord",
    "RegionStats",
    "Stamp",
    "Summary",
    "Timeline",
    "get_profiler",
    "merge_reports",
    "percentile",
    "profile",
]
