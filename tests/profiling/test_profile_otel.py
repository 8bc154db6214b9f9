"""OpenTelemetry export: spans nested like the regions, metrics per block and per record()."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from inferix.profiling import OtelExporter, Profiler, profile
from inferix.telemetry import BLOCK_INDEX_ATTR, SESSION_ID_ATTR


def _sdk() -> Any:
    try:
        from opentelemetry.sdk import metrics, trace
        from opentelemetry.sdk.metrics import export as metrics_export
        from opentelemetry.sdk.trace import export as trace_export
        from opentelemetry.sdk.trace.export import in_memory_span_exporter
    except ImportError:
        pytest.fail("these tests need the OpenTelemetry SDK: pip install -e '.[dev]' (opentelemetry-sdk)")
    return trace, trace_export, in_memory_span_exporter, metrics, metrics_export


def test_regions_become_nested_spans_and_blocks_become_metrics(make_profiler: Callable[..., Profiler]) -> None:
    trace, trace_export, in_memory, metrics, metrics_export = _sdk()
    spans = in_memory.InMemorySpanExporter()
    tracer_provider = trace.TracerProvider()
    tracer_provider.add_span_processor(trace_export.SimpleSpanProcessor(spans))
    reader = metrics_export.InMemoryMetricReader()
    meter_provider = metrics.MeterProvider(metric_readers=[reader])

    profiler = make_profiler(otel=OtelExporter(tracer_provider, meter_provider), fps=16.0)
    request_tracer = tracer_provider.get_tracer("test")
    with request_tracer.start_as_current_span("request") as request_span, profiler.session():
        for index in range(2):
            with profiler.block(index, session="s1") as block:
                for step in range(2):
                    with profile("denoise_step", step=step):
                        pass
                block.pixel_frames = 9
        with pytest.raises(ValueError), profile("vae_decode"):
            raise ValueError("bad latent")
        profiler.record("kv_pages", 12, block=1)
    report = profiler.report()

    finished = {span.context.span_id: span for span in spans.get_finished_spans()}
    by_name: dict[str, list[Any]] = {}
    for span in finished.values():
        by_name.setdefault(span.name, []).append(span)
    assert {name: len(found) for name, found in by_name.items()} == {
        "request": 1,
        "inferix.block": 2,
        "inferix.denoise_step": 4,
        "inferix.vae_decode": 1,
    }
    for block_span in by_name["inferix.block"]:
        assert block_span.parent.span_id == request_span.get_span_context().span_id
    # The region attribute `block` (and `session`, `worker`) is exported under the key every service uses.
    assert sorted(s.attributes[BLOCK_INDEX_ATTR] for s in by_name["inferix.block"]) == [0, 1]
    assert {s.attributes[SESSION_ID_ATTR] for s in by_name["inferix.block"]} == {"s1"}
    assert all("block" not in s.attributes and "session" not in s.attributes for s in by_name["inferix.block"])
    for step_span in by_name["inferix.denoise_step"]:
        parent = finished[step_span.parent.span_id]
        assert parent.name == "inferix.block" and parent.start_time <= step_span.start_time <= step_span.end_time
    error_span = by_name["inferix.vae_decode"][0]
    assert error_span.status.status_code.name == "ERROR"
    assert error_span.status.description == "ValueError: bad latent"
    block_region = next(r for r in report.regions if r.name == "block")
    first_block = min(by_name["inferix.block"], key=lambda s: s.start_time)
    assert (first_block.end_time - first_block.start_time) / 1e9 == pytest.approx(block_region.duration_s, abs=1e-6)

    points = {
        metric.name: metric.data.data_points
        for resource in reader.get_metrics_data().resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    assert points["inferix.block.latency"][0].count == 2
    assert points["inferix.pixel_frames"][0].value == 18
    assert points["inferix.kv_pages"][0].sum == 12 and dict(points["inferix.kv_pages"][0].attributes)["block"] == 1


def test_without_opentelemetry_the_profiler_exports_nothing_and_works(
    make_profiler: Callable[..., Profiler], monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in ("opentelemetry", "opentelemetry.trace", "opentelemetry.metrics", "opentelemetry.context"):
        monkeypatch.setitem(sys.modules, module, None)  # what an environment without the package sees
    assert OtelExporter.from_global() is None
    profiler = make_profiler(otel=True)
    with profiler.session(), profile("denoise_step"):
        pass
    assert [r.name for r in profiler.report().regions] == ["denoise_step"]


def test_regions_whose_parent_is_still_open_at_stop_are_exported_at_stop(
    make_profiler: Callable[..., Profiler],
) -> None:
    trace, trace_export, in_memory, _, _ = _sdk()
    spans = in_memory.InMemorySpanExporter()
    tracer_provider = trace.TracerProvider()
    tracer_provider.add_span_processor(trace_export.SimpleSpanProcessor(spans))
    profiler = make_profiler(otel=OtelExporter(tracer_provider))
    profiler.start()
    left_open = profile("generate")
    left_open.__enter__()
    with profile("denoise_step"):
        pass
    assert spans.get_finished_spans() == ()  # held until its parent closes
    profiler.stop()
    assert [span.name for span in spans.get_finished_spans()] == ["inferix.denoise_step"]
    left_open.__exit__(None, None, None)  # a region that closes after stop is still recorded
    assert [span.name for span in spans.get_finished_spans()] == ["inferix.denoise_step", "inferix.generate"]
