"""OpenTelemetry and Prometheus wiring shared by every service.

Tracing is configured from the standard `OTEL_*` environment variables: a service exports spans
over OTLP/gRPC when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set, and keeps a
no-op tracer otherwise. gRPC interceptors propagate the trace context (W3C traceparent in the
metadata) on every hop, so one trace shows a session end to end.
"""

from __future__ import annotations

import os
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

_configured = False


def setup_tracing(service_name: str) -> None:
    """Install a tracer provider named after the service (once per process)."""
    global _configured
    if _configured:
        return
    _configured = True
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not endpoint or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
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
    from opentelemetry.instrumentation.grpc import aio_server_interceptor

    return aio_server_interceptor()
