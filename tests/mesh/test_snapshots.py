"""KV snapshots in the mesh: a worker SIGKILLed after a snapshot loses its session to another worker, which
loads the snapshot, replays only the blocks committed after it, and finishes the session with the frames
of an uninterrupted `inferix generate`, bit for bit (fp32 pages and 8-bit pages alike).

The mesh keeps its state in a real redis-server (`--redis-url`); the workers snapshot every 4 blocks.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from inferix.api.v1 import kvcache_pb2, kvcache_pb2_grpc
from inferix.client import BlockDone, Client, PromptChange, StateChanged
from inferix.server import INTERNAL_TOKEN_ENV, INTERNAL_TOKEN_HEADER
from inferix_cli.mesh import Mesh, start_mesh
from tests.mesh.conftest import KEY_A, generate_digest, mesh_config, stream_info
from tests.store.redis_server import RedisServer

EVERY = 4
BLOCKS = 24


def snapshot_at(mesh: Mesh, session_id: str) -> int:
    """The next_block of the session's latest snapshot in kvcache_svc (0: none yet)."""
    token = ((INTERNAL_TOKEN_HEADER, mesh.config.env[INTERNAL_TOKEN_ENV]),)
    with grpc.insecure_channel(mesh.kvcache.address) as channel:
        stub = kvcache_pb2_grpc.KVCacheServiceStub(channel)
        reply = stub.GetSnapshot(kvcache_pb2.GetSnapshotRequest(session_id=session_id), timeout=10, metadata=token)
    return reply.snapshot.next_block if reply.found else 0


@pytest.fixture(scope="module", params=["auto", "int8"])
def snapshot_mesh(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                  redis_server: RedisServer) -> Iterator[Mesh]:  # fmt: skip
    db = 4 if request.param == "auto" else 5
    redis_server.flush(db=db)
    workdir: Path = tmp_path_factory.mktemp(f"snapshot-mesh-{request.param}")
    running = start_mesh(
        mesh_config(workdir, workers=2, redis_url=redis_server.url(db=db), kv_dtype=request.param, snapshot_every=EVERY)
    )
    yield running
    running.stop()


def test_a_session_continues_from_its_snapshot_on_another_worker_bit_for_bit(snapshot_mesh: Mesh) -> None:
    schedule = (PromptChange(0, "a red ball"), PromptChange(5, "a green ball"), PromptChange(11, "a blue ball"))
    kv_dtype = snapshot_mesh.config.kv_dtype
    with Client(snapshot_mesh.address, api_key=KEY_A, timeout=120) as client:
        info = client.create_session(list(schedule), num_blocks=BLOCKS, seed=21)
        events: list[object] = []
        killed = ""
        for event in client.events(info.session_id):
            events.append(event)
            # Killed at the first block after a snapshot is stored (taken after block EVERY - 1 or a little
            # later), well before the session's last block: its successor has blocks left to make.
            due = isinstance(event, BlockDone) and event.block_index >= EVERY and not killed
            if due and snapshot_at(snapshot_mesh, info.session_id) >= EVERY:
                assert isinstance(event, BlockDone)
                victim = next(w for w in snapshot_mesh.workers if w.name == event.worker_id)
                assert victim.kill() == -9, victim.log_tail()
                killed = victim.name
        final = client.get_session(info.session_id)
    blocks = [e for e in events if isinstance(e, BlockDone)]
    assert [b.block_index for b in blocks] == list(range(BLOCKS))  # every block once, in order
    assert killed and blocks[-1].worker_id != killed
    assert [e.state for e in events if isinstance(e, StateChanged)][-1] == "completed"
    assert final.state == "completed" and final.blocks_done == BLOCKS
    successor = next(w for w in snapshot_mesh.workers if w.name != killed)
    log = (snapshot_mesh.config.workdir / f"{successor.name}.log").read_text()
    assert f"session {info.session_id}: loaded its snapshot at block" in log, log[-3000:]
    # Taken at the first block boundary after a due commit (the session's next block may be computing
    # then), so at block 4 or a little after; the successor replays only the blocks committed after it.
    restored = re.search(rf"session {info.session_id} restored from (\d+) committed blocks after block (\d+)", log)
    assert restored is not None, log[-3000:]
    replayed, loaded = int(restored.group(1)), int(restored.group(2))
    assert loaded >= EVERY and replayed <= 2 * EVERY
    streamed = stream_info(snapshot_mesh, info.session_id)
    assert streamed.frames == BLOCKS * 3  # toyworld: 3 video frames per block
    extra = () if kv_dtype == "auto" else ("--kv-dtype", kv_dtype)
    assert streamed.frames_sha256 == generate_digest(schedule, BLOCKS, 21, extra)
    snapshot_mesh.workers.remove(next(w for w in snapshot_mesh.workers if w.name == killed))
    snapshot_mesh.add_worker(f"{killed}-replacement")
