"""One trace shows a session end to end: client -> scheduler -> worker -> streamer and kvcache_svc."""

from __future__ import annotations

import time

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from inferix.client import Client, StateChanged
from inferix.telemetry import SESSION_ID_ATTR
from inferix_cli.mesh import Mesh
from tests.mesh.conftest import KEY_A
from tests.otlp import SpanCollector

SERVICES = {"inferix-client", "inferix-scheduler", "inferix-worker", "inferix-streamer", "inferix-kvcache"}


def test_one_trace_contains_spans_from_every_service(mesh: Mesh, collector: SpanCollector) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "inferix-client"}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"127.0.0.1:{collector.port}", insecure=True))
    )
    tracer = provider.get_tracer("tests")
    with tracer.start_as_current_span("client.session") as root, Client(mesh.address, api_key=KEY_A) as client:
        info = client.create_session("a red ball", num_blocks=2)
        states = [e.state for e in client.events(info.session_id) if isinstance(e, StateChanged)]
        trace_id = root.get_span_context().trace_id.to_bytes(16, "big")
    provider.shutdown()
    assert states[-1] == "completed"
    expected_names = {"scheduler.block", "worker.block", "streamer.encode"}

    def names() -> set[str]:
        return {span.name for span in list(collector.spans) if span.trace_id == trace_id}

    deadline = time.monotonic() + 20  # services export in batches
    while time.monotonic() < deadline and not (
        collector.services_in_trace(trace_id) >= SERVICES and expected_names <= names()
    ):
        time.sleep(0.2)
    assert collector.services_in_trace(trace_id) >= SERVICES
    assert expected_names <= names()
    # The worker's and the streamer's block spans name the session under the same key.
    for span in list(collector.spans):
        if span.trace_id == trace_id and span.name in ("worker.block", "streamer.encode"):
            attributes = {a.key: a.value.string_value for a in span.attributes}
            assert attributes.get(SESSION_ID_ATTR) == info.session_id, span.name
