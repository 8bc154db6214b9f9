"""Prometheus metrics of the scheduler."""

from prometheus_client import Counter, Gauge, Histogram

BLOCKS = Counter("inferix_blocks_total", "Blocks completed, all sessions")
TIME_TO_FIRST_BLOCK = Histogram(
    "inferix_time_to_first_block_seconds",
    "Session creation to first block event",
    buckets=(0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64),
)
BLOCK_LATENCY = Histogram(
    "inferix_block_latency_seconds",
    "Dispatch to completion of one block (engine, decode, publish, commit)",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32),
)
DISPATCH_OVERHEAD = Histogram(
    "inferix_dispatch_overhead_seconds",
    "Scheduler time per block outside the worker call",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05),
)
SESSIONS = Gauge("inferix_sessions", "Sessions by state", ["state"])
RECOVERIES = Counter("inferix_session_recoveries_total", "Sessions moved to another worker after a failure")
