"""Many sessions on one worker: their blocks run batched, fairly, and exactly as `inferix generate`.

One worker serves six toyworld sessions created at once through the SDK. Its real-time capacity is
pinned to six streams (`--realtime-streams 6`): this 2-core CI machine measures about three, and
the point here is six sessions in one batch; the measured figures are in bench/RESULTS.md.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from inferix.api.v1 import kvcache_pb2, kvcache_pb2_grpc
from inferix.client import BlockDone, Client, PromptChange, StateChanged
from inferix.server import INTERNAL_TOKEN_ENV, INTERNAL_TOKEN_HEADER
from inferix_cli.mesh import Mesh, start_mesh
from tests.mesh.conftest import KEY_A, generate_digests, mesh_config, stream_info

SESSIONS = [(f"ball number {i} bouncing", 10 + i) for i in range(6)]
BLOCKS = 8


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    running = start_mesh(mesh_config(tmp_path_factory.mktemp("batching"), workers=1, realtime_streams=6))
    yield running
    codes = running.stop()
    assert all(code == 0 for code in codes.values()), codes


def worker_metric(mesh: Mesh, name: str) -> dict[str, float]:
    port = mesh.workers[0].metrics_port
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {m[1]: float(m[2]) for m in re.finditer(rf'^{name}_bucket{{le="([^"]+)"}} (\S+)$', text, re.M)}


def run_session(mesh: Mesh, prompt: str, seed: int) -> tuple[str, float, list[float]]:
    """Create one session, follow it to the end; its id, duration, and each block's arrival time."""
    with Client(mesh.address, api_key=KEY_A, timeout=120) as client:
        began = time.monotonic()
        info = client.create_session(prompt, num_blocks=BLOCKS, seed=seed)
        arrivals, states = [], []
        for event in client.events(info.session_id):
            if isinstance(event, BlockDone):
                arrivals.append(time.monotonic() - began)
            elif isinstance(event, StateChanged):
                states.append(event.state)
        assert states[-1] == "completed", states
        return info.session_id, time.monotonic() - began, arrivals


def test_six_sessions_share_batches_fairly_and_each_equals_generate(one_worker: Mesh) -> None:
    with ThreadPoolExecutor(len(SESSIONS)) as pool:
        futures = [pool.submit(run_session, one_worker, prompt, seed) for prompt, seed in SESSIONS]
        results = [f.result(timeout=600) for f in futures]

    expected = generate_digests([((PromptChange(0, prompt),), BLOCKS, seed) for prompt, seed in SESSIONS])
    for (session_id, _, arrivals), digest in zip(results, expected, strict=True):
        assert len(arrivals) == BLOCKS
        streamed = stream_info(one_worker, session_id)
        assert streamed.finished and streamed.frames == BLOCKS * 3
        assert streamed.frames_sha256 == digest

    # No session starves: they advance together, so every one ends close to the others.
    durations = [duration for _, duration, _ in results]
    assert max(durations) <= 1.5 * min(durations) + 1.0, durations
    for block in range(BLOCKS):
        at = [arrivals[block] for _, _, arrivals in results]
        assert max(at) - min(at) <= 0.5 * max(durations), (block, at)

    # The worker ran forwards of more than four sessions (six when all were mid-block).
    buckets = worker_metric(one_worker, "inferix_worker_batch_sessions")
    assert buckets["+Inf"] > 0 and buckets["+Inf"] - buckets["4.0"] > 0, buckets
    frames = sum(BLOCKS * 3 for _ in results)
    print(f"6 sessions: {frames / max(durations):.1f} frames/s in all, {BLOCKS * 3 / max(durations):.1f} each")


def test_sessions_beyond_the_capacity_are_refused_with_it_or_wait(one_worker: Mesh) -> None:
    with Client(one_worker.address, api_key=KEY_A, timeout=120) as client:
        running = [client.create_session(p, num_blocks=0, seed=s) for p, s in SESSIONS]  # unbounded
        try:
            with pytest.raises(grpc.RpcError) as refused:
                client.create_session("one too many", num_blocks=2)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "6 of 6 real-time streams" in (refused.value.details() or ""), refused.value.details()

            waiting = client.create_session("a patient ball", num_blocks=2, seed=3, wait_for_capacity=True)
            assert waiting.state == "queued"
            client.cancel_session(running[0].session_id)  # its share goes back: the queued one runs
            states = [e.state for e in client.events(waiting.session_id) if isinstance(e, StateChanged)]
            assert states[-1] == "completed"
        finally:
            for info in running:
                client.cancel_session(info.session_id)

    with grpc.insecure_channel(one_worker.kvcache.address) as channel:
        token = ((INTERNAL_TOKEN_HEADER, one_worker.config.env[INTERNAL_TOKEN_ENV]),)
        stub = kvcache_pb2_grpc.KVCacheServiceStub(channel)
        (worker,) = stub.ListWorkers(kvcache_pb2.ListWorkersRequest(), metadata=token, timeout=10).workers
    (capacity,) = worker.capacity
    assert (capacity.resolution.width, capacity.resolution.height, capacity.streams) == (64, 64, 6)
    assert capacity.budget_ms == pytest.approx(187.5) and capacity.block_ms > 0
