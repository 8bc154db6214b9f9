"""Two kvcache_svc replicas sharing one redis-server, each putting snapshots of the same session at
once, as a failover's two workers do (the old one retrying its last snapshot, the new one putting the
next): whatever the interleaving, the session's latest snapshot and its anchor can always be read
whole, pieces included."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc

from inferix.api.v1 import kvcache_pb2
from tests.kvcache_svc.conftest import KVCache, StartKVCache
from tests.store.redis_server import RedisServer

SESSION = "failover"
ROUNDS = 300
EVERY = 8  # blocks between snapshots
FRAMES_PER_BLOCK = 3


def put(kvcache: KVCache, next_block: int, durable_frames: int) -> None:
    """One worker's put of a one-piece snapshot, piece first."""
    piece = kvcache_pb2.PutSnapshotPieceRequest(
        session_id=SESSION, next_block=next_block, index=0, data=next_block.to_bytes(4, "big")
    )
    kvcache.stub.PutSnapshotPiece(piece, timeout=10)
    snapshot = kvcache_pb2.KVSnapshot(next_block=next_block, next_frame=FRAMES_PER_BLOCK * next_block, pieces=1)
    request = kvcache_pb2.PutSnapshotRequest(session_id=SESSION, snapshot=snapshot, durable_frames=durable_frames)
    kvcache.stub.PutSnapshot(request, timeout=10)


def unreadable(kvcache: KVCache) -> list[str]:
    """The kept snapshots (latest, anchor) whose piece cannot be read."""
    missing = []
    for anchor in (False, True):
        reply = kvcache.stub.GetSnapshot(kvcache_pb2.GetSnapshotRequest(session_id=SESSION, anchor=anchor), timeout=10)
        if not reply.found:
            continue
        block = reply.snapshot.next_block
        request = kvcache_pb2.GetSnapshotPieceRequest(session_id=SESSION, next_block=block, index=0)
        try:
            if kvcache.stub.GetSnapshotPiece(request, timeout=10).data != block.to_bytes(4, "big"):
                missing.append(f"{'anchor' if anchor else 'latest'} at block {block}: another piece")
        except grpc.RpcError as error:
            missing.append(f"{'anchor' if anchor else 'latest'} at block {block}: {error.details()}")
    return missing


def test_two_replicas_putting_one_session_at_once_keep_its_snapshots_whole(
    start_kvcache: StartKVCache, redis_server: RedisServer
) -> None:
    redis_server.flush()
    replicas = [start_kvcache("--redis-url", redis_server.url()) for _ in range(2)]
    with ThreadPoolExecutor(2) as pool:
        for round_ in range(1, ROUNDS + 1):
            new, old = EVERY * round_, EVERY * (round_ - 1)
            # The recording holds all but the last two snapshots' frames: each put promotes an anchor.
            durable = FRAMES_PER_BLOCK * EVERY * max(0, round_ - 2)
            calls = [pool.submit(put, replicas[round_ % 2], new, durable)]
            if old:  # the old worker's retry, through the other replica
                calls.append(pool.submit(put, replicas[(round_ + 1) % 2], old, durable))
            for call in calls:
                call.result()
            assert unreadable(replicas[0]) == [], f"after round {round_} (snapshot at block {new})"
    latest = replicas[1].stub.GetSnapshot(kvcache_pb2.GetSnapshotRequest(session_id=SESSION), timeout=10)
    assert latest.snapshot.next_block == EVERY * ROUNDS
    for replica in replicas:
        assert replica.stop() == 0
