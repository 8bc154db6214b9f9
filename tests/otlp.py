"""An in-test OTLP/gRPC trace collector: services export their spans to it over real gRPC."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1.trace_pb2 import Span


class SpanCollector(trace_service_pb2_grpc.TraceServiceServicer):
    """A minimal OTLP/gRPC trace endpoint: keeps every exported span with its service name."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.services: list[str] = []  # service.name of each span, same order
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None
        self.port = 0

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        with self._lock:
            for resource_spans in request.resource_spans:
                service = next(
                    (a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"), ""
                )
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend(scope_spans.spans)
                    self.services.extend([service] * len(scope_spans.spans))
        return trace_service_pb2.ExportTraceServiceResponse()

    def start(self) -> SpanCollector:
        self._server = grpc.server(ThreadPoolExecutor(2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(None)

    @property
    def env(self) -> dict[str, str]:
        """Environment that makes a service export its spans here."""
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{self.port}",
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }

    def services_in_trace(self, trace_id: bytes) -> set[str]:
        with self._lock:
            return {svc for span, svc in zip(self.spans, self.services, strict=True) if span.trace_id == trace_id}
