"""Tenancy on a real mesh: per-key quotas (open sessions, session length, blocks per hour) refused with
RESOURCE_EXHAUSTED naming the limit, a key stored as its SHA-256 digest, no key or viewer token in
anything a session leaves behind (service logs, traces, metrics), and hostile Interact clients
(malformed messages, command floods, too many streams) refused without disturbing the session."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import grpc
import pytest

from inferix.api.v1 import scheduler_pb2, scheduler_pb2_grpc
from inferix.client import BlockDone, Client, SessionError
from inferix_cli.mesh import Mesh, MeshConfig, start_mesh
from scheduler.auth import key_digest
from scheduler.rpc import MAX_REFUSED_COMMANDS
from tests.otlp import SpanCollector

ALICE, BOB, CAROL = "tenant-alice-0123456789", "tenant-bob-0123456789ab", "tenant-carol-0123456789"
INTERACT = "/inferix.v1.SchedulerService/Interact"
HOURLY = 10  # alice's blocks per hour: two sessions of 6 blocks cannot both finish
RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]


@pytest.fixture(scope="module")
def spans() -> Iterator[SpanCollector]:
    collector = SpanCollector().start()
    yield collector
    collector.stop()


@pytest.fixture(scope="module")
def tenant_mesh(tmp_path_factory: pytest.TempPathFactory, spans: SpanCollector) -> Iterator[Mesh]:
    workdir = tmp_path_factory.mktemp("tenancy")
    keys = workdir / "api-keys"
    keys.write_text(
        f"{ALICE} alice sessions=2 blocks_per_session=6 blocks_per_hour={HOURLY}\n"
        f"sha256:{key_digest(BOB).hex()} bob\n"
        f"{CAROL} carol streams=2 commands_per_second=20\n"
    )
    config = MeshConfig(
        workdir=workdir, api_keys_file=keys, workers=1, worker_threads=1, realtime_streams=64, capacity_probe=0
    )
    config.env.update(spans.env)
    running = start_mesh(config)
    yield running
    running.stop()


def refusal(client: Client, **spec: object) -> str:
    with pytest.raises(grpc.RpcError) as refused:
        client.create_session("a red ball bouncing to the right", **spec)  # type: ignore[arg-type]
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value.details()
    return refused.value.details() or ""


def test_quotas_are_enforced_per_key_and_a_hashed_key_works(tenant_mesh: Mesh) -> None:
    with Client(tenant_mesh.address, api_key=ALICE, timeout=120) as alice:
        first = alice.create_session("a red ball bouncing to the right", num_blocks=6, seed=1, lookahead=6)
        second = alice.create_session("a blue ball falling", num_blocks=6, seed=2, lookahead=6)
        assert "limit sessions=2" in refusal(alice, num_blocks=2)
        # Both run until the hourly budget is spent; the one holding the next block says why it waits.
        waiting: list[SessionError] = []
        with alice.interact(second.session_id) as session:
            for event in session.events():
                if isinstance(event, SessionError):
                    waiting.append(event)
                    break
        assert waiting[0].code == RESOURCE_EXHAUSTED
        assert f"limit blocks_per_hour={HOURLY}" in waiting[0].message, waiting[0].message
        done = [alice.get_session(s.session_id).blocks_done for s in (first, second)]
        assert sum(done) == HOURLY, done
        alice.cancel_session(first.session_id)
        assert "num_blocks: 7 is above the limit blocks_per_session=6 of key 'alice'" in refusal(alice, num_blocks=7)
        assert "num_blocks: 0 (unbounded) is above" in refusal(alice, num_blocks=0)
        assert f"limit blocks_per_hour={HOURLY}" in refusal(alice, num_blocks=2)
        alice.cancel_session(second.session_id)
    with Client(tenant_mesh.address, api_key=BOB, timeout=120) as bob:  # stored as its digest
        info = bob.create_session("a green square bouncing around", num_blocks=3, seed=3)
        with bob.interact(info.session_id) as session:
            blocks = [e for e in session.events() if isinstance(e, BlockDone)]
        assert len(blocks) == 3
        assert "#token=" in info.viewer_url


def test_no_key_or_viewer_token_is_in_logs_traces_or_metrics(tenant_mesh: Mesh, spans: SpanCollector) -> None:
    with Client(tenant_mesh.address, api_key=BOB, timeout=120) as bob:
        info = bob.create_session("a yellow ball falling", num_blocks=2, seed=4)
        token = info.viewer_url.split("#token=", 1)[1]
        with bob.interact(info.session_id) as session:
            list(session.events())
        with (
            Client(tenant_mesh.address, api_key="not-a-key-0123456789", timeout=30) as stranger,
            pytest.raises(grpc.RpcError),
        ):
            stranger.list_sessions()
    secrets = [ALICE, BOB, "not-a-key-0123456789", token]
    written = {p.name: p.read_text(errors="replace") for p in tenant_mesh.config.workdir.rglob("*.log")}
    assert written, "the services write logs"
    for process in tenant_mesh.processes():
        if process.metrics_port:
            url = f"http://127.0.0.1:{process.metrics_port}/metrics"
            written[url] = urllib.request.urlopen(url, timeout=10).read().decode()
    written["traces"] = "\n".join(str(span) for span in spans.spans)
    assert spans.spans, "the services export traces"
    for where, text in written.items():
        for secret in secrets:
            assert secret not in text, f"a secret ({secret[:6]}...) appears in {where}"


def attach(session_id: str, *then: scheduler_pb2.InteractRequest) -> Iterator[scheduler_pb2.InteractRequest]:
    yield scheduler_pb2.InteractRequest(attach=scheduler_pb2.Attach(session_id=session_id))
    yield from then


def test_hostile_interact_clients_are_refused_and_the_session_goes_on(tenant_mesh: Mesh) -> None:
    metadata = (("authorization", f"Bearer {CAROL}"),)
    with (
        Client(tenant_mesh.address, api_key=CAROL, timeout=120) as carol,
        grpc.insecure_channel(tenant_mesh.address) as channel,
    ):
        # 18 s of video at real-time pace: still running while the held streams below are counted.
        info = carol.create_session("a cyan ball bouncing around", num_blocks=96, seed=5, lookahead=1)
        # A malformed message: the call fails, nothing else does.
        raw = channel.stream_stream(INTERACT)
        with pytest.raises(grpc.RpcError) as malformed:
            list(raw(iter([b"\xff\xfe not a protobuf"]), metadata=metadata, timeout=30))
        assert malformed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "a malformed InteractRequest" in (malformed.value.details() or "")
        attached = scheduler_pb2.InteractRequest(attach=scheduler_pb2.Attach(session_id=info.session_id))
        later = raw(iter([attached.SerializeToString(), b"\xff\xfe"]), metadata=metadata, timeout=30)
        with pytest.raises(grpc.RpcError) as malformed:
            list(later)  # its events until the malformed message ends it
        assert malformed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        # A flood of commands: refused past commands_per_second, then the stream is closed.
        resume = scheduler_pb2.InteractRequest(resume=scheduler_pb2.Resume())
        flood = stub.Interact(attach(info.session_id, *[resume] * (MAX_REFUSED_COMMANDS + 200)), metadata=metadata)
        refusals = []
        with pytest.raises(grpc.RpcError) as closed:
            for response in flood:
                if response.WhichOneof("event") == "error":
                    refusals.append(response.error.message)
        assert closed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "kept sending commands past its limit" in (closed.value.details() or "")
        assert refusals and all("limit commands_per_second=20" in m for m in refusals), refusals[:3]
        # Streams per key: two are held open, a third is refused.
        held = [stub.Interact(attach(info.session_id), metadata=metadata) for _ in range(2)]
        for stream in held:
            next(stream)  # attached: its first event arrived
        with pytest.raises(grpc.RpcError) as third:
            next(stub.Interact(attach(info.session_id), metadata=metadata))
        assert third.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "limit streams=2" in (third.value.details() or "")
        for stream in held:
            stream.cancel()
        # The owner is not disturbed: the session completes for a well-behaved stream.
        with carol.interact(info.session_id) as session:
            blocks = {e.block_index for e in session.events() if isinstance(e, BlockDone)}
        assert blocks == set(range(96))
        assert carol.get_session(info.session_id).state == "completed"
