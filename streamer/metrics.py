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
FRAMES_OUT = Counter(
    "inferix_streamer_frames_out",
    "Frames released to the live outputs on the wall clock (rate() is the output frame rate)",
)
FRAMES_SENT = Counter("inferix_streamer_frames_sent", "Frames handed to a live output, by output", ["output"])
FRAMES_DROPPED = Counter(
    "inferix_streamer_frames_dropped",
    "Frames a live output skipped (slow viewer, RTMP server away, backlog skip as output=live), by output",
    ["output"],
)
UNDERRUNS = Counter("inferix_streamer_underruns", "Frames that were not there when due (generation behind real time)")
UNDERRUN_SECONDS = Counter("inferix_streamer_underrun_seconds", "Seconds the live outputs held a frame in underruns")
PACING_LATENESS = Histogram(
    "inferix_streamer_pacing_lateness_seconds",
    "How late the pacer released a frame against its due time (event loop health)",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25),
)
TIME_TO_FIRST_FRAME = Histogram(
    "inferix_streamer_time_to_first_frame_seconds",
    "Session creation (announced by the scheduler; else the first frame in) to the first frame out",
    buckets=(0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0),
)
VIEWERS = Gauge("inferix_streamer_webrtc_viewers", "Connected WebRTC viewers (all sessions)")
RTMP_CONNECTS = Counter("inferix_streamer_rtmp_connects", "Successful RTMP connections (reconnects included)")
RTMP_RECONNECTS = Counter(
    "inferix_streamer_rtmp_reconnects", "RTMP connections made again after a failure (a session's later connections)"
)
RTMP_FAILURES = Counter("inferix_streamer_rtmp_failures", "RTMP connection attempts or pushes that failed")
