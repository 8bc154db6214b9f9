"""OpenTelemetry export of profiler data, used only when `opentelemetry-api` is importable.

Regions become spans named `inferix.<region name>` (`inferix.block`, `inferix.denoise_step`, ...)
with their real start and end times, nested as the regions were, under the OpenTelemetry context
that was current when the profiler started (so a worker's profile hangs under its request's
trace). Spans are exported once a region's time is known, which on CUDA is after its events
completed; since children close before their parents, a region tree is held until its root is
resolved and then exported top-down. A region's attributes become span attributes; `session`,
`block` and `worker` get the keys every service uses (`inferix.telemetry`: `inferix.session_id`,
`inferix.block_index`, `inferix.worker_id`), so one query finds a session's spans end to end.

Metrics: the histogram `inferix.block.latency` (s) and the counter `inferix.pixel_frames` per done
block, and one histogram `inferix.<metric>` per name given to `Profiler.record`.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

from inferix import __version__
from inferix.profiling.records import AttrValue, BlockRecord, MetricSample, RegionRecord


class OtelExporter:
    """Sends spans and metrics to the given (or the global) OpenTelemetry providers."""

    def __init__(self, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        from opentelemetry import context, metrics, trace

        from inferix.telemetry import BLOCK_INDEX_ATTR, SESSION_ID_ATTR, WORKER_ID_ATTR

        self._span_keys = {"session": SESSION_ID_ATTR, "block": BLOCK_INDEX_ATTR, "worker": WORKER_ID_ATTR}
        self._context = context
        self._trace = trace
        tracer_provider = tracer_provider or trace.get_tracer_provider()
        meter_provider = meter_provider or metrics.get_meter_provider()
        self._tracer = tracer_provider.get_tracer("inferix.profiling", __version__)
        self._meter = meter_provider.get_meter("inferix.profiling", __version__)
        self._block_latency = self._meter.create_histogram(
            "inferix.block.latency", unit="s", description="Per-block latency: block start to decoded frames"
        )
        self._pixel_frames = self._meter.create_counter(
            "inferix.pixel_frames", unit="{frame}", description="Pixel frames of done blocks"
        )
        self._histograms: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._children: dict[int, list[RegionRecord]] = defaultdict(list)
        self._epoch_ns = 0
        self._parent_context: Any = None

    @classmethod
    def from_global(cls) -> OtelExporter | None:
        """An exporter to the global providers, or None when `opentelemetry-api` is not installed."""
        try:
            return cls()
        except ImportError:
            return None

    def start(self, epoch_ns: int) -> None:
        """Bind session time 0 to the wall clock `epoch_ns` and take the current context as parent."""
        self._epoch_ns = epoch_ns
        self._parent_context = self._context.get_current()

    def region(self, record: RegionRecord) -> None:
        """Export the tree under `record` if it is a root; otherwise hold it for its parent."""
        with self._lock:
            if record.parent_id is not None:
                self._children[record.parent_id].append(record)
                return
            self._emit(record, self._parent_context)

    def flush(self) -> None:
        """Export what waits for a parent that never closed (left open at stop) under the session."""
        with self._lock:
            held_ids = {child.id for children in self._children.values() for child in children}
            orphans = [
                child
                for parent_id in list(self._children)
                if parent_id not in held_ids
                for child in self._children.pop(parent_id)
            ]
            for record in orphans:
                self._emit(record, self._parent_context)

    def block(self, record: BlockRecord) -> None:
        attributes = {"inferix.rank": record.rank}
        self._block_latency.record(record.latency_s, attributes)
        self._pixel_frames.add(record.pixel_frames, attributes)

    def metric(self, sample: MetricSample) -> None:
        with self._lock:
            histogram = self._histograms.get(sample.name)
            if histogram is None:
                histogram = self._histograms[sample.name] = self._meter.create_histogram(f"inferix.{sample.name}")
        histogram.record(sample.value, {**sample.attrs, "inferix.rank": sample.rank})

    def _emit(self, record: RegionRecord, parent_context: Any) -> None:
        attributes: dict[str, AttrValue] = {
            **{self._span_keys.get(key, key): value for key, value in record.attrs.items()},
            "inferix.thread": record.thread,
            "inferix.rank": record.rank,
            "inferix.self_s": record.self_s,
            "inferix.cpu_duration_s": record.cpu_duration_s,
        }
        span = self._tracer.start_span(
            f"inferix.{record.name}",
            context=parent_context,
            start_time=self._epoch_ns + round(record.start_s * 1e9),
            attributes=attributes,
        )
        if record.error is not None:
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, record.error))
        child_context = self._trace.set_span_in_context(span, parent_context)
        for child in sorted(self._children.pop(record.id, []), key=lambda c: c.start_s):
            self._emit(child, child_context)
        span.end(end_time=self._epoch_ns + round((record.start_s + record.duration_s) * 1e9))
