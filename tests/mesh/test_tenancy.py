"""Tenancy on a real mesh: per-key quotas (open sessions, session length, blocks per hour) refused with
RESOURCE_EXHAUSTED naming the limit, a key stored as its SHA-256 digest, and no key or viewer token
in anything a session leaves behind (service logs, traces, metrics)."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import grpc
import pytest

from inferix.client import BlockDone, Client, SessionError
from inferix.mesh import Mesh, MeshConfig, start_mesh
from scheduler.auth import key_digest
from tests.otlp import SpanCollector

ALICE, BOB = "tenant-alice-0123456789", "tenant-bob-0123456789ab"
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
        f"{ALICE} alice sessions=2 blocks_per_session=6 blocks_per_hour={HOURLY}\nsha256:{key_digest(BOB).hex()} bob\n"
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
