"""CreateSession when no worker has room: the client is told why, worker by worker, in kvcache_svc's words.

Real processes over real gRPC: a kvcache_svc and a scheduler. The worker is only registered in
kvcache_svc (no worker process): admission is refused before any worker would be called.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from inferix.api.v1 import common_pb2, kvcache_pb2, kvcache_pb2_grpc
from inferix.client import Client
from inferix_cli.mesh.launch import ServiceProcess, start_service
from tests.kvcache_svc.conftest import stream_capacity


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def services(tmp_path: Path) -> Iterator[tuple[ServiceProcess, ServiceProcess]]:
    """(kvcache_svc, scheduler); the scheduler's streamer is an address nobody listens on (no session runs)."""
    kvcache = start_service(
        "kvcache", "kvcache_svc", ["--redis-url", "memory://", "--heartbeat-timeout", "60"], tmp_path
    )
    try:
        args = ["--kvcache", kvcache.address, "--streamer", f"127.0.0.1:{_unused_port()}", "--redis-url", "memory://"]
        scheduler = start_service("scheduler", "scheduler", args, tmp_path)
    except BaseException:
        kvcache.stop()
        raise
    yield kvcache, scheduler
    assert scheduler.stop() == 0, scheduler.log_tail()
    assert kvcache.stop() == 0, kvcache.log_tail()


def test_create_session_without_room_states_the_real_time_capacity(
    services: tuple[ServiceProcess, ServiceProcess],
) -> None:
    kvcache, scheduler = services
    with grpc.insecure_channel(kvcache.address) as channel:
        stub = kvcache_pb2_grpc.KVCacheServiceStub(channel)
        stub.RegisterWorker(
            kvcache_pb2.RegisterWorkerRequest(
                worker_id="worker-0",
                address="127.0.0.1:1",
                model="toyworld",
                kv=common_pb2.KVUsage(total_pages=512, page_bytes=4096),
                capacity=[stream_capacity(64, 64, 1, block_ms=150.0, budget_ms=187.5)],
            ),
            timeout=10,
        )
        # Another session holds the worker's only real-time stream at toyworld's native 64x64.
        stub.Admit(
            kvcache_pb2.AdmitRequest(
                session_id="other", model="toyworld", pages=1, resolution=common_pb2.Resolution(width=64, height=64)
            ),
            timeout=10,
        )

        with Client(scheduler.address, timeout=30) as client:
            with pytest.raises(grpc.RpcError) as info:
                client.create_session("a red ball", model="toyworld", num_blocks=4)  # native resolution
            error: grpc.Call = info.value
            details = error.details() or ""
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, details
            for fragment in (
                "no worker has room for session ",
                "(model 'toyworld' at 64x64, ",
                "worker-0: 1 of 1 real-time stream at 64x64 in use (block 150 ms at 1 stream, budget 188 ms), ",
                "ask for a lower resolution",
                "set spec.wait_for_capacity to queue the session until there is room",
            ):
                assert fragment in details, details
            assert "127.0.0.1" not in details  # no internal address reaches a client

            # Queuing still works: the session waits for a stream instead of failing.
            queued = client.create_session("a red ball", model="toyworld", num_blocks=4, wait_for_capacity=True)
            assert queued.state == "queued"
            assert client.cancel_session(queued.session_id).state == "cancelled"
        assert stub.ListWorkers(kvcache_pb2.ListWorkersRequest(), timeout=10).workers[0].stream_load == 1.0
