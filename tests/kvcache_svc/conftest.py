"""Fixtures of the kvcache_svc tests: real service processes, a real redis-server, a gRPC client."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from inferix.api.v1 import common_pb2, kvcache_pb2, kvcache_pb2_grpc
from inferix_cli.mesh.launch import ServiceProcess, start_service
from tests.store.redis_server import RedisServer


def stream_capacity(
    width: int, height: int, streams: int, block_ms: float = 100.0, budget_ms: float = 187.5, measured_up_to: int = 8
) -> kvcache_pb2.StreamCapacity:
    """A worker's measured real-time capacity at one resolution, as it reports it."""
    return kvcache_pb2.StreamCapacity(
        resolution=common_pb2.Resolution(width=width, height=height),
        streams=streams,
        block_ms=block_ms,
        budget_ms=budget_ms,
        measured_up_to=measured_up_to,
    )


@dataclass
class KVCache:
    """A running `python -m kvcache_svc` and a client for it."""

    process: ServiceProcess
    channel: grpc.Channel
    stub: kvcache_pb2_grpc.KVCacheServiceStub
    args: list[str] = field(default_factory=list)

    def register(
        self,
        worker_id: str,
        total_pages: int,
        model: str = "tiny",
        used_pages: int = 0,
        capacity: Sequence[kvcache_pb2.StreamCapacity] = (),
    ) -> Any:
        return self.stub.RegisterWorker(
            kvcache_pb2.RegisterWorkerRequest(
                worker_id=worker_id,
                address=f"127.0.0.1:{6000 + len(worker_id)}",
                model=model,
                kv=common_pb2.KVUsage(total_pages=total_pages, used_pages=used_pages, page_bytes=4096),
                capacity=capacity,
            ),
            timeout=10,
        )

    def heartbeat(
        self,
        worker_id: str,
        sequence: int,
        used_pages: int = 0,
        total_pages: int = 0,
        capacity: Sequence[kvcache_pb2.StreamCapacity] = (),
    ) -> Any:
        return self.stub.Heartbeat(
            kvcache_pb2.HeartbeatRequest(
                worker_id=worker_id,
                sequence=sequence,
                kv=common_pb2.KVUsage(total_pages=total_pages, used_pages=used_pages),
                capacity=capacity,
            ),
            timeout=10,
        )

    def admit(
        self,
        session_id: str,
        pages: int,
        model: str = "tiny",
        exclude: tuple[str, ...] = (),
        resolution: tuple[int, int] | None = None,
    ) -> str:
        """Admit (at `resolution`, (width, height), when given) and return the chosen worker id."""
        request = kvcache_pb2.AdmitRequest(session_id=session_id, model=model, pages=pages, exclude_workers=exclude)
        if resolution is not None:
            request.resolution.width, request.resolution.height = resolution
        return str(self.stub.Admit(request, timeout=10).worker.worker_id)

    def workers(self) -> dict[str, Any]:
        response = self.stub.ListWorkers(kvcache_pb2.ListWorkersRequest(), timeout=10)
        return {w.worker_id: w for w in response.workers}

    def stop(self) -> int:
        self.channel.close()
        return self.process.stop()


StartKVCache = Callable[..., KVCache]


def expect_status(code: grpc.StatusCode, call: Callable[[], object], *fragments: str) -> str:
    """Run `call`, require it to fail with `code` and a message holding every fragment."""
    with pytest.raises(grpc.RpcError) as info:
        call()
    error: Any = info.value
    details = str(error.details())
    assert error.code() == code, f"expected {code}, got {error.code()}: {details}"
    for fragment in fragments:
        assert fragment in details, f"{fragment!r} not in {details!r}"
    return details


@pytest.fixture
def start_kvcache(tmp_path: Path) -> Iterator[StartKVCache]:
    """Start kvcache_svc processes (extra CLI args as arguments); all are stopped after the test."""
    running: list[KVCache] = []

    def start(*args: str, name: str = "kvcache") -> KVCache:
        process = start_service(f"{name}{len(running)}", "kvcache_svc", list(args), tmp_path, metrics=True)
        channel = grpc.insecure_channel(process.address)
        kvcache = KVCache(process, channel, kvcache_pb2_grpc.KVCacheServiceStub(channel), list(args))
        running.append(kvcache)
        return kvcache

    yield start
    for kvcache in running:
        kvcache.stop()


@pytest.fixture(params=["memory", "redis"])
def store_url(request: pytest.FixtureRequest) -> str:
    """Each store backend in turn: "memory://" (explicit, so an INFERIX_REDIS_URL in the
    environment is ignored) and the test redis-server (flushed first)."""
    if request.param == "memory":
        return "memory://"
    server: RedisServer = request.getfixturevalue("redis_server")
    server.flush()
    return server.url()


@pytest.fixture
def store_args(store_url: str) -> list[str]:
    """kvcache_svc arguments selecting each store backend in turn."""
    return ["--redis-url", store_url]
