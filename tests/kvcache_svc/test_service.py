"""kvcache_svc end to end: real processes, real gRPC over 127.0.0.1, a real redis-server."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inferix.api.v1 import kvcache_pb2
from kvcache_svc.__main__ import main as kvcache_main
from kvcache_svc.service import SERVICE_NAME
from tests.kvcache_svc.conftest import KVCache, StartKVCache, expect_status, stream_capacity
from tests.store.redis_server import RedisServer

MEMORY = ("--redis-url", "memory://")
CODE = grpc.StatusCode


def _block(
    index: int, frames: int = 3, channels: int = 4, height: int = 6, width: int = 10
) -> kvcache_pb2.CommittedBlock:
    shape = [frames, channels, height, width]
    return kvcache_pb2.CommittedBlock(
        block_index=index,
        start_frame=index * frames,
        shape=shape,
        latents=os.urandom(4 * math.prod(shape)),
        prompt=f"prompt {index}",
    )


def _commit(kvcache: KVCache, session_id: str, block: kvcache_pb2.CommittedBlock) -> None:
    kvcache.stub.CommitBlock(kvcache_pb2.CommitBlockRequest(session_id=session_id, block=block), timeout=10)


def _blocks(kvcache: KVCache, session_id: str) -> list[kvcache_pb2.CommittedBlock]:
    request = kvcache_pb2.GetCommittedBlocksRequest(session_id=session_id)
    return [block for reply in kvcache.stub.GetCommittedBlocks(request, timeout=10) for block in reply.blocks]


def _metrics(kvcache: KVCache) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{kvcache.process.metrics_port}/metrics", timeout=5).read()
    samples = {}
    for line in text.decode().splitlines():
        if line.startswith("inferix_kvcache_"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def _wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


def test_health_serving_and_sigterm_exits_zero(start_kvcache: StartKVCache) -> None:
    kvcache = start_kvcache(*MEMORY)
    health = health_pb2_grpc.HealthStub(kvcache.channel)
    for service in ("", SERVICE_NAME):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    assert kvcache.stop() == 0
    assert "stopped" in kvcache.process.log_tail()


def test_register_list_and_heartbeat_sequences(start_kvcache: StartKVCache, store_args: list[str]) -> None:
    kvcache = start_kvcache(*store_args, "--heartbeat-timeout", "6")
    assert kvcache.register("w1", total_pages=16).heartbeat_interval_s == 2.0
    kvcache.register("w2", total_pages=8, used_pages=1)
    workers = kvcache.workers()
    assert sorted(workers) == ["w1", "w2"]
    assert workers["w2"].kv.total_pages == 8 and workers["w2"].kv.used_pages == 1
    assert workers["w1"].alive and workers["w1"].address == "127.0.0.1:6002"

    kvcache.heartbeat("w1", sequence=1, used_pages=3)
    expect_status(CODE.FAILED_PRECONDITION, lambda: kvcache.heartbeat("w1", 1), "sequence 1", "last seen 1")
    kvcache.heartbeat("w1", sequence=5, used_pages=4)
    expect_status(CODE.FAILED_PRECONDITION, lambda: kvcache.heartbeat("w1", 3), "sequence 3", "last seen 5")
    expect_status(CODE.FAILED_PRECONDITION, lambda: kvcache.heartbeat("w2", 0), "last seen 0")
    expect_status(CODE.INVALID_ARGUMENT, lambda: kvcache.heartbeat("w1", 6, used_pages=17), "17 used pages", "16")
    expect_status(CODE.INVALID_ARGUMENT, lambda: kvcache.heartbeat("w1", 6, total_pages=32), "re-register")
    expect_status(CODE.NOT_FOUND, lambda: kvcache.heartbeat("ghost", 1), "'ghost'", "RegisterWorker")
    assert kvcache.workers()["w1"].kv.used_pages == 4  # rejected reports changed nothing

    kvcache.register("w1", total_pages=16)  # a restarted worker starts its sequence again
    kvcache.heartbeat("w1", sequence=1)


def test_admission_best_fit_never_overcommits_and_release_frees(
    start_kvcache: StartKVCache, store_args: list[str]
) -> None:
    kvcache = start_kvcache(*store_args)
    kvcache.register("w1", total_pages=16)
    kvcache.register("w2", total_pages=12)
    kvcache.heartbeat("w1", 1, used_pages=10)
    assert kvcache.admit("s0", pages=4) == "w2"  # most free pages: w2 has 12, w1 has 6
    kvcache.heartbeat("w1", 2, used_pages=0)
    assert kvcache.admit("s0", pages=4) == "w2"  # a retried admission keeps its worker
    assert kvcache.admit("s1", pages=4, exclude=("w2",)) == "w1"

    # 16 + 12 pages hold 7 sessions of 4 pages: s0, s1 and five more; the next one must be refused.
    chosen = [kvcache.admit(f"s{i}", pages=4) for i in range(2, 7)]
    assert sorted(chosen + ["w2", "w1"]) == ["w1"] * 4 + ["w2"] * 3
    workers = kvcache.workers()
    assert (workers["w1"].reserved_pages, workers["w2"].reserved_pages) == (16, 12)
    expect_status(
        CODE.RESOURCE_EXHAUSTED,
        lambda: kvcache.admit("s7", pages=4),
        "4 KV pages",
        "w1: 0 free of 16",
        "w2: 0 free of 12",
    )
    expect_status(CODE.RESOURCE_EXHAUSTED, lambda: kvcache.admit("big", pages=17), "17 KV pages", "fewer pages")

    kvcache.stub.Release(kvcache_pb2.ReleaseRequest(session_id="s1"), timeout=10)
    assert kvcache.workers()["w1"].reserved_pages == 12
    assert kvcache.admit("s7", pages=4) == "w1"
    expect_status(CODE.NOT_FOUND, lambda: kvcache.stub.Release(kvcache_pb2.ReleaseRequest(session_id="s1")), "'s1'")

    # Moving a session off its worker (e.g. after a failure) frees its old reservation.
    kvcache.stub.Release(kvcache_pb2.ReleaseRequest(session_id="s2"), timeout=10)
    holder = "w1" if kvcache.workers()["w1"].reserved_pages < 16 else "w2"
    other = "w2" if holder == "w1" else "w1"
    mover = next(f"s{i}" for i in (0, 3, 4, 5, 6, 7) if kvcache.admit(f"s{i}", pages=4) == other)
    assert kvcache.admit(mover, pages=4, exclude=(other,)) == holder
    workers = kvcache.workers()
    assert workers[holder].reserved_pages == workers[holder].kv.total_pages
    assert workers[other].reserved_pages == workers[other].kv.total_pages - 4


def test_concurrent_admissions_never_overcommit(start_kvcache: StartKVCache, store_args: list[str]) -> None:
    kvcache = start_kvcache(*store_args)
    kvcache.register("w1", total_pages=10)
    kvcache.register("w2", total_pages=10)
    outcomes: dict[str, str] = {}

    def admit(session_id: str) -> None:
        try:
            outcomes[session_id] = kvcache.admit(session_id, pages=2)
        except grpc.RpcError as error:
            outcomes[session_id] = error.code().name

    threads = [threading.Thread(target=admit, args=(f"s{i}",)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes.values()) == ["RESOURCE_EXHAUSTED"] * 6 + ["w1"] * 5 + ["w2"] * 5
    assert all(w.reserved_pages == 10 for w in kvcache.workers().values())
    metrics = _metrics(kvcache)
    assert metrics['inferix_kvcache_admissions_total{outcome="accepted"}'] == 10
    assert metrics['inferix_kvcache_admissions_total{outcome="rejected"}'] == 6


def test_admission_counts_real_time_streams(start_kvcache: StartKVCache, store_args: list[str]) -> None:
    kvcache = start_kvcache(*store_args)
    kvcache.register("w1", total_pages=64, capacity=[stream_capacity(64, 64, 2, block_ms=150.0, budget_ms=187.5)])
    kvcache.register("w2", total_pages=64)  # not measured yet
    workers = kvcache.workers()
    [measured] = workers["w1"].capacity
    assert (measured.resolution.width, measured.resolution.height, measured.streams) == (64, 64, 2)
    assert (measured.block_ms, measured.budget_ms, measured.measured_up_to) == (150.0, 187.5, 8)
    assert not workers["w2"].capacity and workers["w1"].stream_load == 0.0

    assert kvcache.admit("s1", pages=4, resolution=(64, 64), exclude=("w2",)) == "w1"
    assert kvcache.admit("s2", pages=4, resolution=(64, 64), exclude=("w2",)) == "w1"
    assert kvcache.workers()["w1"].stream_load == 1.0
    details = expect_status(
        CODE.RESOURCE_EXHAUSTED,
        lambda: kvcache.admit("s3", pages=4, resolution=(64, 64), exclude=("w2",)),
        "no worker has room for session 's3' (model 'tiny' at 64x64, 4 KV pages)",
        "w1: 2 of 2 real-time streams at 64x64 in use (block 150 ms at 2 streams, budget 188 ms), 56 free of 64 pages",
        "w2: excluded",
        "ask for a lower resolution",
    )
    assert "127.0.0.1" not in details  # no internal address reaches a client
    assert kvcache.admit("s3", pages=4, resolution=(64, 64)) == "w2"  # unmeasured: pages only, and unloaded
    expect_status(
        CODE.INVALID_ARGUMENT, lambda: kvcache.admit("s4", pages=4, resolution=(64, 0)), "set both width and height"
    )

    # A heartbeat's capacity replaces the last one; sessions keep their shares; an empty list changes nothing.
    kvcache.heartbeat("w1", 1, capacity=[stream_capacity(64, 64, 4), stream_capacity(128, 128, 1)])
    kvcache.heartbeat("w1", 2)
    workers = kvcache.workers()
    assert [(c.resolution.width, c.streams) for c in workers["w1"].capacity] == [(64, 4), (128, 1)]
    assert workers["w1"].stream_load == 1.0
    kvcache.stub.Release(kvcache_pb2.ReleaseRequest(session_id="s1"), timeout=10)
    assert kvcache.workers()["w1"].stream_load == 0.5
    assert kvcache.admit("s5", pages=4, resolution=(64, 64), exclude=("w2",)) == "w1"  # now a quarter
    assert kvcache.workers()["w1"].stream_load == 0.75
    expect_status(
        CODE.INVALID_ARGUMENT,
        lambda: kvcache.heartbeat("w1", 3, capacity=[stream_capacity(64, 64, 1), stream_capacity(64, 64, 2)]),
        "reported twice",
    )
    metrics = _metrics(kvcache)
    assert metrics['inferix_kvcache_refusals_total{reason="realtime"}'] == 1
    assert metrics['inferix_kvcache_refusals_total{reason="pages"}'] == 0
    _wait_for(lambda: _metrics(kvcache).get("inferix_kvcache_stream_load") == 0.75)


def test_silent_worker_is_dead_and_never_chosen(start_kvcache: StartKVCache) -> None:
    kvcache = start_kvcache(*MEMORY, "--heartbeat-timeout", "1")
    kvcache.register("w1", total_pages=8)
    kvcache.register("w2", total_pages=64)  # more room, but it will stop reporting
    sequence = 0
    deadline = time.monotonic() + 1.6
    while time.monotonic() < deadline:
        sequence += 1
        kvcache.heartbeat("w1", sequence, used_pages=2)
        time.sleep(0.2)
    workers = kvcache.workers()
    assert workers["w1"].alive and not workers["w2"].alive
    assert kvcache.admit("s1", pages=4, model="tiny") == "w1"
    expect_status(CODE.RESOURCE_EXHAUSTED, lambda: kvcache.admit("s2", pages=8), "w2: unavailable", "w1: 4 free of 8")
    gauges = ("workers_alive", "workers_registered", "pages_total", "pages_used", "pages_reserved")
    expected = dict(zip(gauges, (1, 2, 8, 2, 4), strict=True))
    _wait_for(lambda: {g: _metrics(kvcache).get(f"inferix_kvcache_{g}") for g in gauges} == expected)

    kvcache.heartbeat("w2", 1)  # a report brings a worker back
    assert kvcache.workers()["w2"].alive
    assert kvcache.admit("s2", pages=8) == "w2"


def test_commit_and_get_blocks_round_trip(start_kvcache: StartKVCache, store_args: list[str]) -> None:
    kvcache = start_kvcache(*store_args)
    blocks = [_block(i) for i in range(3)]
    for block in (blocks[2], blocks[0], blocks[1]):
        _commit(kvcache, "s1", block)
    _commit(kvcache, "s1", blocks[1])  # a retried commit is a no-op
    changed = kvcache_pb2.CommittedBlock()
    changed.CopyFrom(blocks[1])
    changed.latents = os.urandom(len(blocks[1].latents))
    expect_status(CODE.ALREADY_EXISTS, lambda: _commit(kvcache, "s1", changed), "block 1", "already committed")
    assert _blocks(kvcache, "s1") == blocks  # ordered, exact bytes, nothing duplicated or replaced

    _commit(kvcache, "s2", _block(0, frames=1))
    assert [b.shape for b in _blocks(kvcache, "s2")] == [[1, 4, 6, 10]]
    expect_status(CODE.NOT_FOUND, lambda: _blocks(kvcache, "never"), "'never'", "no committed blocks")
    kvcache.register("w1", total_pages=4)
    kvcache.admit("fresh", pages=1)
    assert _blocks(kvcache, "fresh") == []  # admitted, nothing committed yet

    bad_shape = _block(3)
    del bad_shape.shape[:]
    bad_shape.shape.extend([3, 4, 0, 10])
    expect_status(CODE.INVALID_ARGUMENT, lambda: _commit(kvcache, "s1", bad_shape), "[frames, channels, height, width]")
    short = _block(3)
    short.latents = short.latents[:-4]
    expect_status(CODE.INVALID_ARGUMENT, lambda: _commit(kvcache, "s1", short), "needs 2880")
    expect_status(
        CODE.INVALID_ARGUMENT,
        lambda: kvcache.stub.CommitBlock(kvcache_pb2.CommitBlockRequest(session_id="s1")),
        "carries no block",
    )
    expect_status(CODE.INVALID_ARGUMENT, lambda: _commit(kvcache, "", _block(0)), "session_id is required")
    assert len(_blocks(kvcache, "s1")) == 3


def test_committed_blocks_of_a_long_session_stream_past_the_message_cap(
    start_kvcache: StartKVCache, redis_server: RedisServer
) -> None:
    """More committed latents than one gRPC message may carry (64 MiB) come back whole, in order,
    in bounded messages; `from_block` skips what a caller already has."""
    redis_server.flush(db=6)
    kvcache = start_kvcache("--redis-url", redis_server.url(db=6))
    blocks = [_block(i, frames=3, channels=16, height=128, width=128) for i in range(23)]  # 3 MiB each
    for block in blocks:
        _commit(kvcache, "long", block)
    total = sum(len(b.latents) for b in blocks)
    assert total > 64 * 2**20
    request = kvcache_pb2.GetCommittedBlocksRequest(session_id="long")
    replies = list(kvcache.stub.GetCommittedBlocks(request, timeout=60))
    assert len(replies) > 1 and max(r.ByteSize() for r in replies) <= 8 * 2**20
    assert [b for r in replies for b in r.blocks] == blocks
    later = kvcache_pb2.GetCommittedBlocksRequest(session_id="long", from_block=20)
    assert [b.block_index for r in kvcache.stub.GetCommittedBlocks(later, timeout=60) for b in r.blocks] == [20, 21, 22]


def test_deregistered_and_reported_workers_leave_placement(start_kvcache: StartKVCache) -> None:
    kvcache = start_kvcache(*MEMORY)
    kvcache.register("w1", total_pages=64)
    kvcache.register("w2", total_pages=8)
    kvcache.stub.DeregisterWorker(kvcache_pb2.DeregisterWorkerRequest(worker_id="w1"), timeout=10)
    workers = kvcache.workers()
    assert workers["w1"].departed and not workers["w1"].alive and workers["w2"].alive
    assert kvcache.admit("s1", pages=4) == "w2"
    kvcache.stub.ReportWorkerFailure(kvcache_pb2.ReportWorkerFailureRequest(worker_id="w2", reason="test"), timeout=10)
    assert kvcache.workers()["w2"].suspect
    expect_status(CODE.RESOURCE_EXHAUSTED, lambda: kvcache.admit("s2", pages=1), "w1: unavailable", "w2: unavailable")
    time.sleep(0.01)
    kvcache.heartbeat("w2", 1)  # a fresh report clears the suspicion
    assert kvcache.admit("s2", pages=1) == "w2"
    kvcache.register("w1", total_pages=64)  # back after a restart
    assert kvcache.admit("s3", pages=4) == "w1"
    expect_status(
        CODE.NOT_FOUND,
        lambda: kvcache.stub.DeregisterWorker(kvcache_pb2.DeregisterWorkerRequest(worker_id="nobody"), timeout=10),
        "not registered",
    )


def test_bad_input_gets_clear_statuses(start_kvcache: StartKVCache) -> None:
    kvcache = start_kvcache(*MEMORY)
    expect_status(CODE.INVALID_ARGUMENT, lambda: kvcache.register("", 8), "worker_id is required")
    expect_status(CODE.INVALID_ARGUMENT, lambda: kvcache.register("bad id", 8), "'bad id' is not valid")
    expect_status(CODE.INVALID_ARGUMENT, lambda: kvcache.register("w1", 0), "total_pages is 0")
    expect_status(CODE.INVALID_ARGUMENT, lambda: kvcache.register("w1", 8, model=""), "model of worker")
    expect_status(CODE.INVALID_ARGUMENT, lambda: kvcache.register("w1", 8, used_pages=9), "9 used pages")
    expect_status(CODE.INVALID_ARGUMENT, lambda: kvcache.heartbeat("", 1), "worker_id is required")

    expect_status(CODE.NOT_FOUND, lambda: kvcache.admit("s1", 1), "no worker serves model 'tiny'", "none")
    kvcache.register("w1", total_pages=8, model="wan-1.3b")
    kvcache.register("w2", total_pages=8, model="causvid")
    expect_status(CODE.NOT_FOUND, lambda: kvcache.admit("s1", 1, model="magi"), "'causvid', 'wan-1.3b'")
    expect_status(CODE.INVALID_ARGUMENT, lambda: kvcache.admit("s1", 0, model="causvid"), "at least 1 page")
    expect_status(CODE.INVALID_ARGUMENT, lambda: kvcache.admit("", 1, model="causvid"), "session_id is required")
    expect_status(CODE.INVALID_ARGUMENT, lambda: kvcache.admit("s1", 1, model=""), "model is required")
    expect_status(CODE.NOT_FOUND, lambda: kvcache.stub.Release(kvcache_pb2.ReleaseRequest(session_id="s9")), "'s9'")
    expect_status(
        CODE.INVALID_ARGUMENT, lambda: kvcache.stub.Release(kvcache_pb2.ReleaseRequest()), "session_id is required"
    )
    assert kvcache.admit("s1", 8, model="causvid") == "w2"
    expect_status(CODE.FAILED_PRECONDITION, lambda: kvcache.register("w2", 8, model="wan-1.3b"), "release them")
    expect_status(CODE.FAILED_PRECONDITION, lambda: kvcache.register("w2", 4, model="causvid"), "reserve 8")


def test_redis_state_survives_a_restart(start_kvcache: StartKVCache, redis_server: RedisServer) -> None:
    redis_server.flush()
    first = start_kvcache("--redis-url", redis_server.url())
    first.register("w1", total_pages=16)
    assert first.admit("s1", pages=6) == "w1"
    blocks = [_block(i, height=60, width=104) for i in range(2)]  # real Wan latent frame size
    for block in blocks:
        _commit(first, "s1", block)
    first.process.kill()  # no graceful shutdown: nothing may depend on it
    assert first.process.process.returncode == -9

    second = start_kvcache("--redis-url", redis_server.url())
    assert _blocks(second, "s1") == blocks
    assert second.workers()["w1"].reserved_pages == 6
    assert second.admit("s1", pages=6) == "w1"  # the same reservation, not a second one
    assert second.workers()["w1"].reserved_pages == 6


def test_released_session_blocks_expire(start_kvcache: StartKVCache, redis_server: RedisServer) -> None:
    redis_server.flush()
    kvcache = start_kvcache("--redis-url", redis_server.url(), "--finished-ttl", "0.5")
    kvcache.register("w1", total_pages=4)
    kvcache.admit("s1", pages=2)
    _commit(kvcache, "s1", _block(0))
    kvcache.stub.Release(kvcache_pb2.ReleaseRequest(session_id="s1"), timeout=10)
    assert len(_blocks(kvcache, "s1")) == 1  # kept for the TTL after release
    time.sleep(0.8)
    expect_status(CODE.NOT_FOUND, lambda: _blocks(kvcache, "s1"), "expired")


def test_cli_help_and_unusable_stores_fail_fast(capsys: pytest.CaptureFixture[str]) -> None:
    help_run = subprocess.run(
        [sys.executable, "-m", "kvcache_svc", "--help"], capture_output=True, text=True, timeout=60
    )
    assert help_run.returncode == 0
    for flag in ("--redis-url", "--heartbeat-timeout", "--finished-ttl", "--port-file", "--metrics-port"):
        assert flag in help_run.stdout

    # The rest fails before serving, so it runs in-process.
    with pytest.raises(SystemExit, match="unsupported store URL 'postgres://db/0'"):
        kvcache_main(["--redis-url", "postgres://db/0", "--port", "0"])
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(SystemExit, match=f"127.0.0.1:{port}/0 is unreachable"):
        kvcache_main(["--redis-url", f"redis://127.0.0.1:{port}/0", "--port", "0"])
    with pytest.raises(SystemExit) as info:
        kvcache_main(["--heartbeat-timeout", "0"])
    assert info.value.code == 2 and "must be > 0 seconds" in capsys.readouterr().err
