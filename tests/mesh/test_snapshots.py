"""KV snapshots in the mesh: a worker SIGKILLed after a snapshot loses its session to another worker, which
loads the snapshot, replays only the blocks committed after it, and finishes the session with the frames
of an uninterrupted `inferix generate`, bit for bit (fp32 pages and 8-bit pages alike).

Once the recording holds a snapshot's first frame, that snapshot is the session's anchor and kvcache_svc
drops the committed blocks before it; a streamer restarted after a takeover then gets its missing frames
decoded again from the anchor, and the recording is still the one `inferix generate` makes.

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
from tests.mesh.conftest import KEY_A, generate_digest, kill_worker, mesh_config, replace_worker, stream_info
from tests.store.redis_server import RedisServer

EVERY = 4
BLOCKS = 24


def first_kept(mesh: Mesh, session_id: str) -> int:
    """The first committed block of the session kvcache_svc still holds (0: none dropped yet)."""
    token = ((INTERNAL_TOKEN_HEADER, mesh.config.env[INTERNAL_TOKEN_ENV]),)
    with grpc.insecure_channel(mesh.kvcache.address) as channel:
        stub = kvcache_pb2_grpc.KVCacheServiceStub(channel)
        request = kvcache_pb2.GetCommittedBlocksRequest(session_id=session_id, from_block=0)
        try:
            next(iter(stub.GetCommittedBlocks(request, timeout=10, metadata=token)))
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION, exc
            dropped = re.search(r"before block (\d+) were dropped", exc.details() or "")
            assert dropped is not None, exc.details()
            return int(dropped.group(1))
    return 0


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


ANCHORED_BLOCKS = 44  # past the first recording segment (frames 0..63, block 21) by enough to anchor


def test_blocks_before_the_anchor_are_dropped_and_a_restarted_streamer_gets_its_frames_from_it(
    snapshot_mesh: Mesh,
) -> None:
    schedule = (PromptChange(0, "a purple ball"),)
    kv_dtype = snapshot_mesh.config.kv_dtype
    with Client(snapshot_mesh.address, api_key=KEY_A, timeout=120) as client:
        info = client.create_session(list(schedule), num_blocks=ANCHORED_BLOCKS, seed=23)
        blocks: list[int] = []
        dropped = 0
        killed = ""
        restarted = False
        for event in client.events(info.session_id):
            if not isinstance(event, BlockDone):
                continue
            blocks.append(event.block_index)
            if not killed and event.block_index >= 24:
                dropped = first_kept(snapshot_mesh, info.session_id)
                if dropped:  # the anchor is set: the worker making the session goes
                    killed = kill_worker(snapshot_mesh, event.worker_id)
            elif killed and event.worker_id != killed and not restarted:
                restarted = True  # the successor pushed a block; the streamer's journal ends at frame 64
                assert snapshot_mesh.streamer.kill() == -9, snapshot_mesh.streamer.log_tail()
                snapshot_mesh.replace(snapshot_mesh.relaunch(snapshot_mesh.streamer).wait())  # type: ignore[union-attr]
        assert blocks == list(range(ANCHORED_BLOCKS)) and killed and restarted
        assert 4 <= dropped <= 24  # the anchor trails the recording's durable end (frame 64, block 21)
        streamed = stream_info(snapshot_mesh, info.session_id)
        assert streamed.finished and streamed.frames == ANCHORED_BLOCKS * 3
        extra = () if kv_dtype == "auto" else ("--kv-dtype", kv_dtype)
        assert streamed.frames_sha256 == generate_digest(schedule, ANCHORED_BLOCKS, 23, extra)
    log = "".join(path.read_text() for path in sorted(snapshot_mesh.config.workdir.glob("worker*.log")))
    anchored = re.findall(rf"decoding {info.session_id} again from its anchor at block (\d+) \(frame (\d+)\)", log)
    assert len(anchored) == 1 and 0 < int(anchored[0][1]) <= 64, log[-3000:]
    resent = re.findall(rf"re-sent frames (\d+)\.\.\d+ of {info.session_id} to a restarted streamer, decoded", log)
    assert resent == ["64"], log[-3000:]
    replace_worker(snapshot_mesh, killed)
