"""Prometheus metrics of the streamer (served by `--metrics-port`).

No per-session labels: session ids are unbounded and would explode the series count; rejections
are labelled by the offending field, a small fixed set.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

FRAMES_RECEIVED = Counter("inferix_streamer_frames_received", "Frames accepted for encoding (duplicates excluded)")
FRAMES_DUPLICATE = Counter(
    "inferix_streamer_frames_duplicate", "Frames skipped because their index was already received (re-sends)"
)
FRAMES_REJECTED = Counter(
    "inferix_streamer_frames_rejected",
    "Frames refused, by the VideoFrame field at fault (or finished / encoder_failed)",
    ["reason"],
)
ENCODE_SECONDS = Histogram(
    "inferix_streamer_encode_seconds",
    "Encoder time per frame (pixel conversion + H.264 encode)",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0),
)
SESSIONS_ACTIVE = Gauge(
    "inferix_streamer_sessions_active", "Sessions that received frames and are not finished (computed at scrape time)"
)
