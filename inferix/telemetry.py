"""OpenTelemetry and Prometheus wiring shared by every service.

Tracing is configured from the standard `OTEL_*` environment variables: a service exports spans
over OTLP/gRPC when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set, and keeps a
no-op tracer otherwise. gRPC interceptors propagate the trace context (W3C traceparent in the
metadata) on every hop, so one trace shows a session end to end. A service that does not export
spans installs no interceptors: they run Python on every call, on a worker's event loop, whose
GIL time its engine thread waits for (bench/RESULTS.md, issue 38). Configure tracing on every service
or on none; a service without it does not pass a trace on.
"""

from __future__ import annotations

import os
from typing import Any

import grpc
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

# Span attributes, the same keys in every service (and in the profiler's OTLP export), so that one
# query finds a session's spans end to end.
SESSION_ID_ATTR = "inferix.session_id"
BLOCK_INDEX_ATTR = "inferix.block_index"
WORKER_ID_ATTR = "inferix.worker_id"

_configured = False


def exporting() -> bool:
    """Whether this process exports spans (the `OTEL_*` environment asks for it)."""
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return bool(endpoint) and os.environ.get("OTEL_SDK_DISABLED", "").lower() != "true"


def setup_tracing(service_name: str) -> None:
    """Install a tracer provider named after the service (once per process)."""
    global _configured
    if _configured:
        return
    _configured = True
    if not exporting():
        return
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)


def shutdown_tracing() -> None:
    """Flush pending spans (called on graceful shutdown)."""
    provider = trace.get_tracer_provider()
    shutdown = getattr(provider, "shutdown", None)
    if callable(shutdown):
        shutdown()


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


def client_interceptors() -> list[Any]:
    """grpc.aio client interceptors that inject the current trace context."""
    from opentelemetry.instrumentation.grpc import aio_client_interceptors

    return list(aio_client_interceptors())


def server_interceptor() -> Any:
    """Server spans for our own services. Not for grpc.health.v1: its aio `Watch` writes with
    `context.write` instead of yielding, which the OpenTelemetry interceptor cannot wrap (every Watch
    failed with a TypeError), and health probes are noise in traces anyway."""
    from opentelemetry.instrumentation.grpc import aio_server_interceptor, filters

    return aio_server_interceptor(filter_=filters.negate(filters.service_name("grpc.health.v1.Health")))


class _ClientCallDetails(grpc.ClientCallDetails):
    def __init__(self, details: grpc.ClientCallDetails, metadata: list[tuple[str, str | bytes]]) -> None:
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = metadata
        self.credentials = details.credentials
        self.wait_for_ready = getattr(details, "wait_for_ready", None)
        self.compression = getattr(details, "compression", None)


class TraceContextInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Sync-channel interceptor that injects the current trace context (W3C traceparent) into metadata."""

    @staticmethod
    def _details(details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        return _ClientCallDetails(details, [*(details.metadata or ()), *carrier.items()])

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)
