"""The profiler: timed regions, block milestones, custom metrics and event hooks for one session.

A `Profiler` records one session (`start()` .. `stop()`, or `with profiler.session():`). While it
runs it is the process's active profiler, so code that does not hold it can still time itself
with `profile(name, **attrs)` (a context manager and a decorator) or reach it with
`get_profiler()`. With no profiler running, `profile()` is a global read and a `None` check that
returns an inert region (shared per name; a small one holding the attributes when given some),
and the recording methods of a disabled or stopped `Profiler` return after a flag check:
instrumented code can stay instrumented in production.

Regions nest per thread and per asyncio task (the open region lives in a `ContextVar`): a region
opened inside another on the same thread or task becomes its child. Records are resolved in the
order they closed; on CUDA that waits for their events to complete (checked without blocking
whenever the profiler is called, forced at `report()` and `stop()`), so `block_done` hooks fire
once a block's latency is known, possibly on a later profiler call or in `report()`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import math
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextvars import ContextVar, Token
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from inferix.errors import UserError
from inferix.profiling.clock import Clock, Stamp, select_clock
from inferix.profiling.metrics import region_stats, summarize
from inferix.profiling.monitors import Gauge, GaugeValue, Monitor, ProcessMonitor, Sampler, cuda_monitors
from inferix.profiling.otel import OtelExporter
from inferix.profiling.records import (
    BlockRecord,
    Dropped,
    MetricSample,
    RankInfo,
    RegionRecord,
    Timeline,
    clean_attrs,
)
from inferix.profiling.report import ProfileReport

BLOCK_DONE = "block_done"
"""Event the profiler emits when a block's latency is known; keyword arguments: block_index,
pixel_frames, start_s, done_s, latency_s."""

F = TypeVar("F", bound=Callable[..., Any])

_current_region: ContextVar[_OpenRegion | None] = ContextVar("inferix_profiling_region", default=None)
_active: Profiler | None = None
_active_lock = threading.Lock()


class Region:
    """What `profile()` returns: a context manager, and a decorator that times every call.

    This base class is the inactive form: entering and leaving it does nothing. As a decorator
    the region opens on the profiler that is active when the function is called, so functions
    decorated at import time are timed whenever a profiler runs later.
    """

    __slots__ = ("name", "attrs")

    def __init__(self, name: str, attrs: dict[str, Any]) -> None:
        self.name = name
        self.attrs = attrs

    def __enter__(self) -> Region:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        return None

    def __call__(self, func: F) -> F:
        return _decorate(func, self.name, self.attrs)


class _ActiveRegion(Region):
    """A region bound to a running profiler; use each one for a single `with`."""

    __slots__ = ("_profiler", "_open", "_token")

    def __init__(self, profiler: Profiler, name: str, attrs: dict[str, Any]) -> None:
        super().__init__(name, attrs)
        self._profiler = profiler

    def __enter__(self) -> Region:
        self._open, self._token = self._profiler._open_region(self.name, self.attrs)
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self._profiler._close_region(self._open, self._token, exc)


@functools.lru_cache(maxsize=1024)
def _inactive_region(name: str) -> Region:
    # Shared per name, so `with profile("name"):` builds nothing while no profiler runs; bounded,
    # so names built at run time cannot grow it without limit.
    return Region(name, {})


def profile(name: str, **attrs: Any) -> Region:
    """Time a region on the active profiler: `with profile("vae_decode"):` or `@profile("dit")`.

    `attrs` (str, int, float or bool; anything else is stored as its str) describe this occurrence,
    e.g. `profile("denoise_step", block=3, step=1)`; keep `name` static so regions aggregate.
    """
    profiler = _active
    if profiler is None:
        return Region(name, attrs) if attrs else _inactive_region(name)
    return _ActiveRegion(profiler, name, attrs)


def get_profiler() -> Profiler:
    """The running profiler, or a shared disabled one, so callers never need a None check."""
    profiler = _active
    return _DISABLED if profiler is None else profiler


def _decorate(func: F, name: str, attrs: dict[str, Any]) -> F:
    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            with profile(name, **attrs):
                return await func(*args, **kwargs)

        return cast(F, async_wrapper)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with profile(name, **attrs):
            return func(*args, **kwargs)

    return cast(F, wrapper)


@dataclass(slots=True, eq=False)
class _OpenRegion:
    profiler: Profiler
    id: int
    name: str
    attrs: dict[str, Any]
    parent: _OpenRegion | None
    depth: int
    thread: str
    start: Stamp
    child_s: float = 0.0  # resolved children add their duration here, for the parent's self time


@dataclass(slots=True)
class _PendingRegion:
    region: _OpenRegion
    end: Stamp
    error: str | None


@dataclass(slots=True)
class _PendingBlock:
    index: int
    pixel_frames: int
    start: Stamp
    done: Stamp


@dataclass(slots=True)
class _PendingFrames:
    stamp: Stamp


_Pending = _PendingRegion | _PendingBlock | _PendingFrames


class BlockScope:
    """`with profiler.block(i) as block: ...; block.pixel_frames = n`: one block, start to done.

    Entering marks the block's start and opens a region named "block" (attribute block=i);
    leaving closes it and marks the block done with `pixel_frames`. A block left by an exception
    is recorded as a failed "block" region and not counted as done.
    """

    __slots__ = ("index", "pixel_frames", "_profiler", "_region")

    def __init__(self, profiler: Profiler | None, index: int, attrs: dict[str, Any]) -> None:
        self.index = index
        self.pixel_frames = 0
        self._profiler = profiler
        self._region = (
            Region("block", {}) if profiler is None else profiler.region("block", **{**attrs, "block": index})
        )

    def __enter__(self) -> BlockScope:
        if self._profiler is not None:
            self._profiler.mark_block_start(self.index)
        self._region.__enter__()
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self._region.__exit__(exc_type, exc, tb)
        if self._profiler is None:
            return
        if exc is None:
            self._profiler.mark_block_done(self.index, self.pixel_frames)
        else:
            self._profiler._forget_block_start(self.index)


@dataclass
class _Totals:
    """Running values that stay exact when the bounded buffers drop old records."""

    regions: int = 0
    blocks: int = 0
    metrics: int = 0
    pixel_frames: int = 0
    first_block_done_s: float | None = None
    last_block_done_s: float | None = None
    first_frame_s: float | None = None


class Profiler:
    """Records one profiling session of this process (one rank).

    Args:
        enabled: False makes every method a flag check and records nothing.
        device: "auto" (CUDA events when torch is imported and CUDA is available), "cpu" or "cuda".
        fps: the video's playback rate, needed for the real-time factor.
        label: free text stored in the report (model, preset, resolution...).
        rank, world_size: this process's place in a multi-GPU worker; default: the RANK and
            WORLD_SIZE variables torchrun sets, else 0 and 1.
        sample_interval_s: how often the background thread samples the monitors and gauges;
            None: no background thread, no monitors, gauges ignored.
        otel: True exports to the global OpenTelemetry providers when `opentelemetry-api` is
            installed; False never; or an `OtelExporter` bound to chosen providers.
        max_records: how many regions, blocks and metric samples each buffer keeps (oldest
            dropped first; totals stay exact, distributions cover what was kept).
        max_samples: how many monitor samples the timeline keeps.
        clock: a clock to use instead of `device`'s (its `start()` is called at session start).
    """

    def __init__(
        self,
        enabled: bool = True,
        *,
        device: str = "auto",
        fps: float | None = None,
        label: str = "",
        rank: int | None = None,
        world_size: int | None = None,
        sample_interval_s: float | None = 0.2,
        otel: bool | OtelExporter = True,
        max_records: int = 200_000,
        max_samples: int = 20_000,
        clock: Clock | None = None,
    ) -> None:
        if fps is not None and fps <= 0:
            raise UserError(f"fps must be positive, got {fps}")
        self._enabled = enabled
        self._device = device
        self._fps = fps
        self._label = label
        self._rank = _env_int("RANK", 0) if rank is None else rank
        self._world_size = _env_int("WORLD_SIZE", 1) if world_size is None else world_size
        if not 0 <= self._rank < self._world_size:
            raise UserError(f"rank {self._rank} is not in a world of size {self._world_size}")
        self._sample_interval_s = sample_interval_s
        self._otel_option = otel
        self._max_samples = max_samples
        self._given_clock = clock

        self._clock: Clock | None = None
        self._running = False
        self._started_unix_s = 0.0
        self._stop_stamp: Stamp | None = None
        self._sampler: Sampler | None = None
        self._otel: OtelExporter | None = None
        self._gauges: list[Monitor] = []
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._pending: deque[_Pending] = deque()
        self._regions: deque[RegionRecord] = deque(maxlen=max_records)
        self._blocks: deque[BlockRecord] = deque(maxlen=max_records)
        self._metrics: deque[MetricSample] = deque(maxlen=max_records)
        self._block_starts: dict[int, Stamp] = {}
        self._last_done: Stamp | None = None
        self._frames_marked = False
        self._totals = _Totals()
        self._callbacks: dict[str, tuple[Callable[..., None], ...]] = {}  # replaced, never mutated

    @property
    def enabled(self) -> bool:
        return self._enabled

    # -- session -------------------------------------------------------------------------------

    def start(self) -> Profiler:
        """Begin the session (t = 0) and become the active profiler; no-op when disabled."""
        global _active
        if not self._enabled:
            return self
        with _active_lock:  # held throughout, so `_active` is only ever a fully started profiler
            if self._clock is not None:
                raise RuntimeError("this Profiler already recorded a session; create a new Profiler for another")
            if _active is not None:
                raise RuntimeError("another Profiler is running in this process; stop() it before starting one")
            clock = self._given_clock or select_clock(self._device)
            # Slow set-up (imports, NVML init) happens before t = 0: it is not generation time.
            if isinstance(self._otel_option, OtelExporter):
                self._otel = self._otel_option
            elif self._otel_option:
                self._otel = OtelExporter.from_global()
            if self._sample_interval_s is not None:
                monitors: list[Monitor] = [ProcessMonitor()]
                if self._given_clock is None and clock.kind == "cuda":
                    monitors += cuda_monitors()
                self._sampler = Sampler(
                    monitors + self._gauges, self._sample_interval_s, self._max_samples, self._cpu_seconds
                )
            clock.start()
            self._clock = clock
            self._started_unix_s = time.time()
            if self._otel is not None:
                self._otel.start(round(self._started_unix_s * 1e9))
            if self._sampler is not None:
                self._sampler.start()
            self._running = True
            _active = self
        return self

    def stop(self) -> None:
        """End the session: stop sampling, resolve every pending time, flush OpenTelemetry."""
        global _active
        with _active_lock:
            if not self._running:
                return
            if _active is self:
                _active = None
            self._running = False
        assert self._clock is not None
        self._stop_stamp = self._clock.stamp()
        if self._sampler is not None:
            self._sampler.stop()
        self._resolve_all()
        if self._otel is not None:
            self._otel.flush()

    @contextlib.contextmanager
    def session(self) -> Iterator[Profiler]:
        """`with Profiler().session() as profiler:` start, and stop even on error."""
        self.start()
        try:
            yield self
        finally:
            self.stop()

    # -- recording -----------------------------------------------------------------------------

    def region(self, name: str, **attrs: Any) -> Region:
        """Like `profile()`, on this profiler (a context manager; see `Region` for decorators)."""
        if not self._running:
            return Region(name, attrs) if attrs else _inactive_region(name)
        return _ActiveRegion(self, name, attrs)

    def block(self, index: int, **attrs: Any) -> BlockScope:
        """Time block `index` from start to done; see `BlockScope`."""
        return BlockScope(self if self._running else None, index, attrs)

    def mark_block_start(self, block_index: int) -> None:
        """Block `block_index`'s work starts now (needed when blocks overlap or wait in between)."""
        if not self._running:
            return
        assert self._clock is not None
        stamp = self._clock.stamp()
        with self._lock:
            self._block_starts[block_index] = stamp

    def mark_block_done(self, block_index: int, pixel_frames: int) -> None:
        """Block `block_index`'s `pixel_frames` decoded frames are ready now.

        Without a start mark the block started when the previous block was done (or at t = 0).
        """
        if not self._running:
            return
        assert self._clock is not None
        stamp = self._clock.stamp()
        with self._lock:
            start = self._block_starts.pop(block_index, None)
            if start is None:
                start = self._last_done if self._last_done is not None else self._clock.origin
            self._last_done = stamp
        self._submit(_PendingBlock(block_index, pixel_frames, start, stamp))

    def mark_frames(self, count: int) -> None:
        """`count` pixel frames became available now (a streaming decoder, mid-block).

        Only the first such moment matters (time to first frame); later calls cost a flag check.
        """
        if not self._running or self._frames_marked or count <= 0:
            return
        assert self._clock is not None
        self._frames_marked = True
        self._submit(_PendingFrames(self._clock.stamp()))

    def record(self, metric: str, value: float, **attrs: Any) -> None:
        """Record a custom value now, e.g. `record("kv_pages", pool.used, block=i)`.

        `value` should be a host number: `float()` of a CUDA tensor would synchronize the device.
        """
        if not self._running:
            return
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"profiler metric {metric}={number}: record() needs a finite number")
        sample = MetricSample(
            name=metric,
            value=number,
            t_s=self._cpu_seconds(),
            rank=self._rank,
            thread=threading.current_thread().name,
            attrs=clean_attrs(attrs),
        )
        with self._lock:
            self._metrics.append(sample)
            self._totals.metrics += 1
        if self._otel is not None:
            self._otel.metric(sample)

    def add_gauge(self, name: str, read: Callable[[], GaugeValue]) -> None:
        """Sample `read()` with the monitors, e.g. KV pool occupancy.

        `read` runs on the sampler thread and returns a number or a mapping of numbers (series
        `name` or `name.key`); if it raises it is logged and dropped.
        """
        if not self._enabled:
            return
        gauge = Gauge(name, read)
        if self._sampler is not None:
            self._sampler.add(gauge)
        else:
            self._gauges.append(gauge)

    # -- hooks ---------------------------------------------------------------------------------

    def on(self, event: str, callback: Callable[..., None]) -> None:
        """Call `callback(**payload)` for every `emit(event, **payload)` (and BLOCK_DONE)."""
        if not self._enabled:
            return
        with self._lock:
            self._callbacks[event] = (*self._callbacks.get(event, ()), callback)

    def emit(self, event: str, **payload: Any) -> None:
        """Call the callbacks registered for `event`, in registration order, on this thread.

        A callback's exception propagates to the caller: hooks are part of the program.
        """
        if not self._enabled:
            return
        for callback in self._callbacks.get(event, ()):
            callback(**payload)

    # -- reports -------------------------------------------------------------------------------

    def report(self) -> ProfileReport:
        """Everything recorded so far (waits for pending CUDA events); empty if never started."""
        clock = self._clock
        if clock is None:
            return self._report(0.0, "off", "", Timeline(self._rank, [], {}), 0)
        self._resolve_all()
        end = self._stop_stamp if self._stop_stamp is not None else clock.stamp()
        timeline, samples_dropped = (
            self._sampler.timeline(self._rank) if self._sampler else (Timeline(self._rank, [], {}), 0)
        )
        return self._report(clock.seconds(end), clock.kind, clock.device, timeline, samples_dropped)

    def write(self, directory: str | Path) -> ProfileReport:
        """Write `profile-rank<R>.json` and `.html` into `directory`; returns the report."""
        report = self.report()
        stem = Path(directory) / f"profile-rank{self._rank}"
        report.write_json(stem.with_suffix(".json"))
        from inferix.profiling.html import write_html  # matplotlib: only paid by who writes HTML

        write_html(report, stem.with_suffix(".html"))
        return report

    # -- internals -----------------------------------------------------------------------------

    def _cpu_seconds(self) -> float:
        assert self._clock is not None
        return (time.perf_counter_ns() - self._clock.origin.cpu_ns) / 1e9

    def _open_region(self, name: str, attrs: dict[str, Any]) -> tuple[_OpenRegion, Token[_OpenRegion | None]]:
        assert self._clock is not None
        parent = _current_region.get()
        if parent is not None and parent.profiler is not self:
            parent = None  # left open by an earlier profiler's session
        depth = 0 if parent is None else parent.depth + 1
        region = _OpenRegion(
            self, next(self._ids), name, attrs, parent, depth, threading.current_thread().name, self._clock.stamp()
        )
        return region, _current_region.set(region)

    def _close_region(self, region: _OpenRegion, token: Token[_OpenRegion | None], exc: BaseException | None) -> None:
        assert self._clock is not None
        end = self._clock.stamp()
        # Closed in another context than it opened in (a worker's block scope opens when the block is
        # admitted and closes in the batch pump's callback): reset refuses, and that context's own
        # current region is left as it is.
        with contextlib.suppress(ValueError):
            _current_region.reset(token)
        self._submit(_PendingRegion(region, end, None if exc is None else _describe(exc)))

    def _forget_block_start(self, block_index: int) -> None:
        with self._lock:
            self._block_starts.pop(block_index, None)

    def _submit(self, item: _Pending) -> None:
        with self._lock:
            self._pending.append(item)
            resolved = self._drain(wait=False)
        self._publish(resolved)

    def _resolve_all(self) -> None:
        with self._lock:
            resolved = self._drain(wait=True)
        self._publish(resolved)

    def _drain(self, wait: bool) -> list[RegionRecord | BlockRecord]:
        """Resolve pending items in close order; without `wait`, stop at the first not ready."""
        clock = self._clock
        assert clock is not None
        resolved: list[RegionRecord | BlockRecord] = []
        while self._pending:
            item = self._pending[0]
            if not wait and not _is_ready(clock, item):
                break
            self._pending.popleft()
            if isinstance(item, _PendingRegion):
                resolved.append(self._resolve_region(clock, item))
            elif isinstance(item, _PendingBlock):
                resolved.append(self._resolve_block(clock, item))
            else:
                self._first_frame(clock.seconds(item.stamp))
        return resolved

    def _resolve_region(self, clock: Clock, item: _PendingRegion) -> RegionRecord:
        region = item.region
        start_s = clock.seconds(region.start)
        duration = clock.seconds(item.end) - start_s
        if region.parent is not None:
            region.parent.child_s += duration
        record = RegionRecord(
            id=region.id,
            parent_id=None if region.parent is None else region.parent.id,
            name=region.name,
            depth=region.depth,
            thread=region.thread,
            rank=self._rank,
            start_s=start_s,
            duration_s=duration,
            self_s=max(0.0, duration - region.child_s),
            cpu_duration_s=(item.end.cpu_ns - region.start.cpu_ns) / 1e9,
            error=item.error,
            attrs=clean_attrs(region.attrs),
        )
        self._regions.append(record)
        self._totals.regions += 1
        return record

    def _resolve_block(self, clock: Clock, item: _PendingBlock) -> BlockRecord:
        start_s, done_s = clock.seconds(item.start), clock.seconds(item.done)
        record = BlockRecord(
            index=item.index,
            pixel_frames=item.pixel_frames,
            rank=self._rank,
            start_s=start_s,
            done_s=done_s,
            latency_s=done_s - start_s,
        )
        self._blocks.append(record)
        totals = self._totals
        totals.blocks += 1
        totals.pixel_frames += item.pixel_frames
        totals.first_block_done_s = _earliest(totals.first_block_done_s, done_s)
        totals.last_block_done_s = max(done_s, totals.last_block_done_s or 0.0)
        if item.pixel_frames > 0:
            self._first_frame(done_s)
        return record

    def _first_frame(self, t_s: float) -> None:
        self._totals.first_frame_s = _earliest(self._totals.first_frame_s, t_s)

    def _publish(self, records: list[RegionRecord | BlockRecord]) -> None:
        """Hand resolved records to OpenTelemetry and the hooks, outside the lock."""
        for record in records:
            if isinstance(record, BlockRecord):
                if self._otel is not None:
                    self._otel.block(record)
                self.emit(
                    BLOCK_DONE,
                    block_index=record.index,
                    pixel_frames=record.pixel_frames,
                    start_s=record.start_s,
                    done_s=record.done_s,
                    latency_s=record.latency_s,
                )
            elif self._otel is not None:
                self._otel.region(record)

    def _report(
        self, session_s: float, clock: str, device: str, timeline: Timeline, samples_dropped: int
    ) -> ProfileReport:
        with self._lock:
            regions, blocks, metrics = list(self._regions), list(self._blocks), list(self._metrics)
            totals = self._totals
            summary = summarize(
                session_s=session_s,
                first_block_done_s=totals.first_block_done_s,
                first_frame_s=totals.first_frame_s,
                last_block_done_s=totals.last_block_done_s,
                blocks=totals.blocks,
                pixel_frames=totals.pixel_frames,
                block_latencies=[b.latency_s for b in blocks],
                fps=self._fps,
            )
            dropped = Dropped(
                regions=totals.regions - len(regions),
                blocks=totals.blocks - len(blocks),
                metrics=totals.metrics - len(metrics),
                samples=samples_dropped,
            )
        info = RankInfo(
            rank=self._rank,
            host=socket.gethostname(),
            pid=os.getpid(),
            clock=clock,
            device=device,
            started_unix_s=self._started_unix_s,
            summary=summary,
            dropped=dropped,
        )
        return ProfileReport(
            label=self._label,
            fps=self._fps,
            world_size=self._world_size,
            ranks=[info],
            summary=summary,
            region_stats=region_stats(regions),
            blocks=blocks,
            regions=regions,
            metrics=metrics,
            timelines=[timeline],
        )


_DISABLED = Profiler(enabled=False, rank=0, world_size=1)


def _is_ready(clock: Clock, item: _Pending) -> bool:
    if isinstance(item, _PendingRegion):
        return clock.is_ready(item.end) and clock.is_ready(item.region.start)
    if isinstance(item, _PendingBlock):
        return clock.is_ready(item.done) and clock.is_ready(item.start)
    return clock.is_ready(item.stamp)


def _earliest(current: float | None, candidate: float) -> float:
    return candidate if current is None else min(current, candidate)


def _describe(exc: BaseException) -> str:
    message = str(exc)
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text[:500]


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise UserError(f"environment variable {name}={value!r} must be an integer (torchrun sets it)") from exc
