"""The records a profile report is made of: plain frozen dataclasses that map 1:1 to JSON.

Every time is in seconds since the recording rank's session start (see `metrics` for what the
session start is). Each class reads itself back from the dict `dataclasses.asdict` made of it,
so a report round-trips through JSON exactly (Python writes floats with `repr`, which parses
back to the same float).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

AttrValue = str | int | float | bool
"""The types a region attribute or metric attribute may have: what JSON and OpenTelemetry hold."""

_SCALARS = (str, int, float, bool)  # a tuple: isinstance checks it faster than the union


def clean_attrs(attrs: dict[str, Any]) -> dict[str, AttrValue]:
    """Attributes as JSON/OpenTelemetry values: anything that is not a scalar becomes its `str`.

    Done when a record is resolved, not when a region opens, so the hot path does not pay it.
    """
    return {key: value if isinstance(value, _SCALARS) else str(value) for key, value in attrs.items()}


@dataclass(frozen=True)
class RegionRecord:
    """One closed timed region.

    `self_s` is `duration_s` minus the durations of the region's direct children (clamped at 0);
    `cpu_duration_s` is the CPU-side time between enter and exit, which on a CUDA clock differs
    from `duration_s` (GPU time) and shows launch-bound regions. `error` is set when the region
    was left by an exception: "TypeName: message".
    """

    id: int
    parent_id: int | None
    name: str
    depth: int
    thread: str
    rank: int
    start_s: float
    duration_s: float
    self_s: float
    cpu_duration_s: float
    error: str | None
    attrs: dict[str, AttrValue]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RegionRecord:
        return cls(
            id=int(data["id"]),
            parent_id=None if data["parent_id"] is None else int(data["parent_id"]),
            name=str(data["name"]),
            depth=int(data["depth"]),
            thread=str(data["thread"]),
            rank=int(data["rank"]),
            start_s=float(data["start_s"]),
            duration_s=float(data["duration_s"]),
            self_s=float(data["self_s"]),
            cpu_duration_s=float(data["cpu_duration_s"]),
            error=None if data["error"] is None else str(data["error"]),
            attrs=clean_attrs(dict(data["attrs"])),
        )


@dataclass(frozen=True)
class BlockRecord:
    """One generated block: from the moment its work started until its pixel frames were ready."""

    index: int
    pixel_frames: int
    rank: int
    start_s: float
    done_s: float
    latency_s: float

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BlockRecord:
        return cls(
            index=int(data["index"]),
            pixel_frames=int(data["pixel_frames"]),
            rank=int(data["rank"]),
            start_s=float(data["start_s"]),
            done_s=float(data["done_s"]),
            latency_s=float(data["latency_s"]),
        )


@dataclass(frozen=True)
class MetricSample:
    """One value given to `Profiler.record`, on the CPU timeline (it is a host-side number)."""

    name: str
    value: float
    t_s: float
    rank: int
    thread: str
    attrs: dict[str, AttrValue]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MetricSample:
        return cls(
            name=str(data["name"]),
            value=float(data["value"]),
            t_s=float(data["t_s"]),
            rank=int(data["rank"]),
            thread=str(data["thread"]),
            attrs=clean_attrs(dict(data["attrs"])),
        )


@dataclass(frozen=True)
class Timeline:
    """What the background monitors sampled, column-wise: `series[name][i]` was read at `t_s[i]`.

    A value is None where that series had no reading at that time (a gauge registered late, a
    monitor that failed and was dropped).
    """

    rank: int
    t_s: list[float]
    series: dict[str, list[float | None]]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Timeline:
        return cls(
            rank=int(data["rank"]),
            t_s=[float(t) for t in data["t_s"]],
            series={
                str(name): [None if v is None else float(v) for v in values] for name, values in data["series"].items()
            },
        )


@dataclass(frozen=True)
class DurationStats:
    """Distribution of a set of durations; percentiles use the nearest-rank method (`metrics`)."""

    count: int
    total_s: float
    mean_s: float
    min_s: float
    p50_s: float
    p90_s: float
    p99_s: float
    max_s: float

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DurationStats:
        return cls(
            count=int(data["count"]),
            **{key: float(data[key]) for key in ("total_s", "mean_s", "min_s", "p50_s", "p90_s", "p99_s", "max_s")},
        )


@dataclass(frozen=True)
class RegionStats:
    """All retained regions of one name: how often, how long, and how much of it was their own."""

    name: str
    errors: int
    self_s: float
    duration: DurationStats

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RegionStats:
        return cls(
            name=str(data["name"]),
            errors=int(data["errors"]),
            self_s=float(data["self_s"]),
            duration=DurationStats.from_dict(data["duration"]),
        )


@dataclass(frozen=True)
class Summary:
    """The standard metrics; each is defined in `inferix.profiling.metrics`. None: not measurable."""

    session_s: float
    end_to_end_s: float | None
    time_to_first_block_s: float | None
    time_to_first_frame_s: float | None
    blocks: int
    pixel_frames: int
    pixel_fps: float | None
    real_time_factor: float | None
    block_latency: DurationStats | None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Summary:
        def optional(key: str) -> float | None:
            return None if data[key] is None else float(data[key])

        return cls(
            session_s=float(data["session_s"]),
            end_to_end_s=optional("end_to_end_s"),
            time_to_first_block_s=optional("time_to_first_block_s"),
            time_to_first_frame_s=optional("time_to_first_frame_s"),
            blocks=int(data["blocks"]),
            pixel_frames=int(data["pixel_frames"]),
            pixel_fps=optional("pixel_fps"),
            real_time_factor=optional("real_time_factor"),
            block_latency=None if data["block_latency"] is None else DurationStats.from_dict(data["block_latency"]),
        )


@dataclass(frozen=True)
class Dropped:
    """How many records the bounded buffers let go (oldest first); statistics cover the rest."""

    regions: int = 0
    blocks: int = 0
    metrics: int = 0
    samples: int = 0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Dropped:
        return cls(**{key: int(data[key]) for key in ("regions", "blocks", "metrics", "samples")})


@dataclass(frozen=True)
class RankInfo:
    """Who recorded: one entry in a rank's own report, one per rank in a merged report."""

    rank: int
    host: str
    pid: int
    clock: str
    device: str
    started_unix_s: float
    summary: Summary
    dropped: Dropped

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankInfo:
        return cls(
            rank=int(data["rank"]),
            host=str(data["host"]),
            pid=int(data["pid"]),
            clock=str(data["clock"]),
            device=str(data["device"]),
            started_unix_s=float(data["started_unix_s"]),
            summary=Summary.from_dict(data["summary"]),
            dropped=Dropped.from_dict(data["dropped"]),
        )
