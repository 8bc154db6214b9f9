"""Fuzz the public API over real gRPC: nothing a client sends may crash or wedge the scheduler."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferix.api.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from inferix_cli.mesh import Mesh
from tests.mesh.conftest import KEY_A

EXPECTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
METADATA = (("authorization", f"Bearer {KEY_A}"),)

specs = st.builds(
    common_pb2.SessionSpec,
    model=st.sampled_from(["tiny", "", "nope"]) | st.text(max_size=40),
    resolution=st.builds(common_pb2.Resolution, width=st.integers(0, 2**32 - 1), height=st.integers(0, 2**32 - 1)),
    seed=st.integers(0, 2**64 - 1),
    prompts=st.lists(
        st.builds(common_pb2.PromptChange, at_block=st.integers(0, 2**32 - 1), text=st.text(max_size=3000)),
        max_size=5,
    ),
    num_blocks=st.integers(0, 2**32 - 1),
    lookahead=st.integers(0, 2**32 - 1),
)


def test_fuzzed_create_session_requests(mesh: Mesh) -> None:
    with grpc.insecure_channel(mesh.address) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        created: list[str] = []

        @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(spec=specs, session_id=st.text(max_size=80))
        def one(spec: common_pb2.SessionSpec, session_id: str) -> None:
            try:
                reply = stub.CreateSession(scheduler_pb2.CreateSessionRequest(spec=spec), timeout=30, metadata=METADATA)
                created.append(reply.session.session_id)
            except grpc.RpcError as exc:
                assert exc.code() in EXPECTED, (exc.code(), exc.details())
            try:
                stub.GetSession(scheduler_pb2.GetSessionRequest(session_id=session_id), timeout=30, metadata=METADATA)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.NOT_FOUND, (exc.code(), exc.details())

        one()
        for session_id in created:
            stub.CancelSession(scheduler_pb2.CancelSessionRequest(session_id=session_id), timeout=60, metadata=METADATA)
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
