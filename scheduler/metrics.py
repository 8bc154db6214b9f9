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
BLOCK_VIDEO_SECONDS = Counter(
    "inferix_block_video_seconds_total",
    "Seconds of video in the blocks completed (frames / model fps); over inferix_blocks_total, the real-time "
    "budget of a block",
)
SESSIONS = Gauge("inferix_sessions", "Sessions by state", ["state"])
QUEUE_OLDEST = Gauge(
    "inferix_session_queue_oldest_seconds", "How long the oldest session waiting for a worker has waited (0: none)"
)
RECOVERIES = Counter("inferix_session_recoveries_total", "Sessions moved to another worker after a failure")
HANDOVERS = Histogram(
    "inferix_session_handover_seconds",
    "Sessions moved off a draining worker (SIGTERM: scale-in, rolling update): seconds to place one again",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
)
RECOVERY_FAILURES = Counter(
    "inferix_session_recovery_failures_total",
    "Worker failures a session could not recover from (no worker to move to, or too many recoveries): it failed",
)
