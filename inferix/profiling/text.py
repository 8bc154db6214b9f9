"""The plain-text summary `inferix profile REPORT.json` prints: standard metrics, then regions."""

from __future__ import annotations

from collections.abc import Sequence

from inferix.profiling.records import DurationStats, RankInfo, Summary
from inferix.profiling.report import ProfileReport


def format_report(report: ProfileReport, max_regions: int = 20) -> str:
    """The summary table of `report`, with its `max_regions` most expensive region names."""
    lines = [_title(report), ""]
    lines += _summary_lines(report.summary, report.fps)
    lines += ["", _regions_title(len(report.region_stats), max_regions)]
    lines += _region_table(report, max_regions)
    if report.merged:
        lines += ["", "Ranks"]
        lines += _rank_table(report.ranks)
    dropped = [
        f"rank {info.rank}: {info.dropped.regions} regions, {info.dropped.blocks} blocks, "
        f"{info.dropped.metrics} metric samples, {info.dropped.samples} monitor samples"
        for info in report.ranks
        if info.dropped.regions or info.dropped.blocks or info.dropped.metrics or info.dropped.samples
    ]
    if dropped:
        lines += ["", "Dropped by the bounded buffers (distributions cover the rest):"] + [f"  {d}" for d in dropped]
    return "\n".join(lines)


def _title(report: ProfileReport) -> str:
    clocks = sorted({f"{info.clock} ({info.device})" if info.device else info.clock for info in report.ranks})
    parts = [
        f"ranks {','.join(str(info.rank) for info in report.ranks)} of world size {report.world_size}",
        f"clock {', '.join(clocks)}",
        f"fps {_number(report.fps)}",
    ]
    label = f": {report.label}" if report.label else ""
    return f"Inferix profile{label}\n" + " | ".join(parts)


def _summary_lines(summary: Summary, fps: float | None) -> list[str]:
    rows = [
        ("time to first block", _seconds(summary.time_to_first_block_s)),
        ("time to first frame", _seconds(summary.time_to_first_frame_s)),
        ("end to end", _seconds(summary.end_to_end_s)),
        ("session", _seconds(summary.session_s)),
        ("blocks", str(summary.blocks)),
        ("pixel frames", str(summary.pixel_frames)),
        ("pixel fps", _number(summary.pixel_fps)),
        ("real-time factor", _number(summary.real_time_factor) + ("" if fps is not None else " (no fps given)")),
        ("block latency", _distribution(summary.block_latency)),
    ]
    width = max(len(name) for name, _ in rows)
    return [f"  {name:<{width}}  {value}" for name, value in rows]


def _distribution(stats: DurationStats | None) -> str:
    if stats is None:
        return "n/a"
    return (
        f"p50 {_ms(stats.p50_s)}  p90 {_ms(stats.p90_s)}  p99 {_ms(stats.p99_s)}  "
        f"max {_ms(stats.max_s)} ms  (n={stats.count})"
    )


def _regions_title(count: int, max_regions: int) -> str:
    shown = f", top {max_regions} of {count}" if count > max_regions else ""
    return f"Regions (most total time first{shown}; times in ms unless marked s)"


def _region_table(report: ProfileReport, max_regions: int) -> list[str]:
    header = ("name", "count", "total s", "self s", "mean", "p50", "p90", "p99", "max", "errors")
    rows = [
        (
            stats.name,
            str(stats.duration.count),
            f"{stats.duration.total_s:.3f}",
            f"{stats.self_s:.3f}",
            _ms(stats.duration.mean_s),
            _ms(stats.duration.p50_s),
            _ms(stats.duration.p90_s),
            _ms(stats.duration.p99_s),
            _ms(stats.duration.max_s),
            str(stats.errors),
        )
        for stats in report.region_stats[:max_regions]
    ]
    if not rows:
        return ["  (no regions recorded)"]
    return _table(header, rows)


def _rank_table(ranks: list[RankInfo]) -> list[str]:
    header = ("rank", "host", "pid", "first block s", "end to end s", "blocks", "pixel frames", "pixel fps")
    rows = [
        (
            str(info.rank),
            info.host,
            str(info.pid),
            _number(info.summary.time_to_first_block_s),
            _number(info.summary.end_to_end_s),
            str(info.summary.blocks),
            str(info.summary.pixel_frames),
            _number(info.summary.pixel_fps),
        )
        for info in ranks
    ]
    return _table(header, rows)


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        # First column (a name) left-aligned, numbers right-aligned.
        return (
            "  "
            + "  ".join(
                cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(cells)
            ).rstrip()
        )

    return [line(header)] + [line(row) for row in rows]


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f} s"


def _ms(value: float) -> str:
    return f"{value * 1e3:.2f}"


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
