"""Inferix's standard performance metrics: their definitions, and the only code that computes them.

Every number the profiler reports, the CLI prints and the HTML report plots comes from here, so
"time to first frame" means the same thing in a benchmark, a bug report and a dashboard.

Timeline
    t = 0 is the session start: `Profiler.start()` (or entering `Profiler.session()`). Start the
    session where the request starts counting, e.g. when `inferix generate` has loaded the model
    and begins the first block. Times are on the profiler's clock: `time.perf_counter_ns` on CPU;
    on CUDA, the GPU timeline (CUDA events on the current stream, read relative to an event
    recorded at session start), so a region's time is when the device did the work, not when
    Python launched it. Monitor samples and `record()` values are host-side and use the CPU time
    since session start.

Block
    One block of latent frames taken from noise to decoded pixel frames. Its work starts at
    `mark_block_start(i)` (or entering `profiler.block(i)`) and is done at `mark_block_done(i,
    pixel_frames)` (or leaving `profiler.block(i)`): after its denoising steps, the context pass
    that writes the clean block into the KV cache, and the VAE decode of its pixel frames. An
    engine that only calls `mark_block_done` runs blocks back to back, so a block without a start
    mark starts when the previous block was done (the first one at t = 0).

Per-block latency (`BlockRecord.latency_s`)
    done(i) - start(i): text encoding on a prompt change, every denoising step, the context pass
    and the VAE decode of block i. Idle time before a block's start is not part of it.

Time to first block (`time_to_first_block_s`)
    The earliest done(i) of the session: from t = 0 until the first whole block is decoded.

Time to first frame (`time_to_first_frame_s`)
    The earliest moment pixel frames became available: the first `mark_frames(n)` with n > 0
    (a streaming VAE that hands frames out while it decodes a block) or the first done(i) with
    pixel frames, whichever is earlier. It equals the time to first block when the engine only
    reports frames per block.

End to end (`end_to_end_s`)
    From t = 0 to the last done(i): the time the user waited for the whole video.

Pixel frames per second, end to end (`pixel_fps`)
    Pixel frames of all done blocks / end to end.

Real-time factor (`real_time_factor`)
    Seconds of video generated / wall seconds = (pixel frames / fps) / end to end, where fps is
    the video's playback rate given to the profiler. Above 1 the engine is faster than real time
    and a live stream never stalls; None when fps is unknown.

Session (`session_s`)
    From t = 0 to `stop()` (or to the report, for a report taken while recording).

Percentiles (p50, p90, p99)
    Nearest-rank method on the sorted samples x(1) <= ... <= x(n): the p-th percentile is
    x(ceil(p * n / 100)), an observed value, never an interpolation. With fewer than 100 samples,
    p99 is the maximum; with one sample, every percentile is that sample.

Merged reports (several ranks of one sequence-parallel worker, which produce one video together)
    A block is done when its slowest rank is: per-block latency is the maximum over ranks of the
    same block index; every time-to and end-to-end figure is the maximum over ranks; the video is
    counted once (the maximum over ranks of blocks and of pixel frames, since ranks that do not
    decode report 0 frames); pixel fps and real-time factor follow from those.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

from inferix.profiling.records import BlockRecord, DurationStats, RegionRecord, RegionStats, Summary


def percentile(sorted_values: Sequence[float], p: int) -> float:
    """The nearest-rank `p`-th percentile (0 < p <= 100) of already sorted, non-empty values."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0 < p <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {p}")
    rank = -(-p * len(sorted_values) // 100)  # ceil in integers: no float rounding at exact ranks
    return sorted_values[rank - 1]


def duration_stats(durations: Iterable[float]) -> DurationStats | None:
    """Count, total, mean, min, p50/p90/p99 and max of `durations`; None when there are none."""
    values = sorted(durations)
    if not values:
        return None
    total = math.fsum(values)
    return DurationStats(
        count=len(values),
        total_s=total,
        mean_s=total / len(values),
        min_s=values[0],
        p50_s=percentile(values, 50),
        p90_s=percentile(values, 90),
        p99_s=percentile(values, 99),
        max_s=values[-1],
    )


def region_stats(regions: Iterable[RegionRecord]) -> list[RegionStats]:
    """Per region name, most total time first: the stage breakdown."""
    durations: dict[str, list[float]] = defaultdict(list)
    self_time: dict[str, float] = defaultdict(float)
    errors: dict[str, int] = defaultdict(int)
    for region in regions:
        durations[region.name].append(region.duration_s)
        self_time[region.name] += region.self_s
        errors[region.name] += region.error is not None
    stats = []
    for name, values in durations.items():
        distribution = duration_stats(values)
        assert distribution is not None  # every name has at least one region
        stats.append(RegionStats(name=name, errors=errors[name], self_s=self_time[name], duration=distribution))
    return sorted(stats, key=lambda s: (-s.duration.total_s, s.name))


def summarize(
    *,
    session_s: float,
    first_block_done_s: float | None,
    first_frame_s: float | None,
    last_block_done_s: float | None,
    blocks: int,
    pixel_frames: int,
    block_latencies: Iterable[float],
    fps: float | None,
) -> Summary:
    """The standard metrics of one rank, from the profiler's running totals and retained blocks.

    Totals and first/last times are kept as running values so they stay exact after the bounded
    block buffer drops old blocks; the latency distribution covers the retained blocks.
    """
    end_to_end = last_block_done_s if blocks else None
    return Summary(
        session_s=session_s,
        end_to_end_s=end_to_end,
        time_to_first_block_s=first_block_done_s,
        time_to_first_frame_s=first_frame_s,
        blocks=blocks,
        pixel_frames=pixel_frames,
        pixel_fps=_rate(pixel_frames, end_to_end),
        real_time_factor=None if fps is None else _rate(pixel_frames / fps, end_to_end),
        block_latency=duration_stats(block_latencies),
    )


def combine_ranks(summaries: Sequence[Summary], blocks: Iterable[BlockRecord], fps: float | None) -> Summary:
    """The summary of ranks that generated one video together (see "Merged reports" above)."""
    slowest_latency: dict[int, float] = {}
    for block in blocks:
        slowest_latency[block.index] = max(block.latency_s, slowest_latency.get(block.index, 0.0))
    end_to_end = _max_known(s.end_to_end_s for s in summaries)
    pixel_frames = max(s.pixel_frames for s in summaries)
    return Summary(
        session_s=max(s.session_s for s in summaries),
        end_to_end_s=end_to_end,
        time_to_first_block_s=_max_known(s.time_to_first_block_s for s in summaries),
        time_to_first_frame_s=_max_known(s.time_to_first_frame_s for s in summaries),
        blocks=max(s.blocks for s in summaries),
        pixel_frames=pixel_frames,
        pixel_fps=_rate(pixel_frames, end_to_end),
        real_time_factor=None if fps is None else _rate(pixel_frames / fps, end_to_end),
        block_latency=duration_stats(slowest_latency.values()),
    )


def _rate(amount: float, seconds: float | None) -> float | None:
    if seconds is None or seconds <= 0:
        return None
    return amount / seconds


def _max_known(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None
