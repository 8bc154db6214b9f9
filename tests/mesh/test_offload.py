"""Paused sessions cost no device pages: kvcache_svc has the worker move them to host memory,
resuming brings them back, and the video is unchanged."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from inferix.api.v1 import worker_pb2, worker_pb2_grpc
from inferix.client import BlockDone, Client, PromptChange, StateChanged
from inferix.server import INTERNAL_TOKEN_ENV, INTERNAL_TOKEN_HEADER
from inferix.spec.presets import load_preset
from inferix_cli.mesh import Mesh, start_mesh
from tests.mesh.conftest import KEY_A, generate_digest, mesh_config, stream_info

SEEDS = (21, 22)
# Long enough that a pause sent at the first block lands before the end on a loaded machine: the client
# may read that block's event late, and the scheduler has sent the next one ahead meanwhile.
BLOCKS = 8
# toyworld: one page per latent frame, 3 latent frames a block, a window of 6 frames.
BLOCK = load_preset("toyworld").pipeline.block


@pytest.fixture(scope="module")
def small_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    # Heartbeats every 0.5 s (timeout / 3), so offload decisions arrive quickly.
    config = mesh_config(
        tmp_path_factory.mktemp("offload-mesh"), workers=1, kv_pages=2 * 3 * BLOCKS, heartbeat_timeout_s=1.5
    )
    running = start_mesh(config)
    yield running
    running.stop()


def worker_kv(mesh: Mesh) -> tuple[int, int]:
    token = ((INTERNAL_TOKEN_HEADER, mesh.config.env[INTERNAL_TOKEN_ENV]),)
    with grpc.insecure_channel(mesh.workers[0].address) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        status = stub.GetStatus(worker_pb2.GetStatusRequest(), timeout=10, metadata=token)
    return status.kv.used_pages, status.kv.host_pages_used


def test_paused_sessions_move_to_host_and_resume_unchanged(small_mesh: Mesh) -> None:
    with Client(small_mesh.address, api_key=KEY_A, timeout=60) as client:
        sessions, interactions = [], []
        for seed in SEEDS:  # one at a time: a session paused at its first block cannot finish early
            sessions.append(client.create_session("a red ball", num_blocks=BLOCKS, seed=seed, lookahead=64))
            interaction = client.interact(sessions[-1].session_id)
            interactions.append(interaction)
            for event in interaction.events():
                if isinstance(event, BlockDone) and event.block_index == 0:
                    interaction.pause()
                if isinstance(event, StateChanged) and event.state == "paused":
                    break
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and worker_kv(small_mesh)[0] > 0:
            time.sleep(0.2)
        used, host = worker_kv(small_mesh)
        now = [client.get_session(s.session_id) for s in sessions]
        assert [s.state for s in now] == ["paused", "paused"], now
        done = [s.blocks_done for s in now]
        assert used == 0, "paused sessions still hold device pages"
        # A pause takes effect after the blocks already at the worker (the one in flight, and the next one
        # the scheduler sent ahead), so a session may hold a full window by then.
        held = [min(n * BLOCK.num_frame_per_block, BLOCK.local_attn_size) for n in done]
        assert host == sum(held)
        for interaction in interactions:
            interaction.resume()
        for interaction in interactions:
            states = [e.state for e in interaction.events() if isinstance(e, StateChanged)]
            assert states[-1] == "completed"
            interaction.close()
    assert worker_kv(small_mesh)[1] == 0  # nothing left on the host tier
    for session, seed in zip(sessions, SEEDS, strict=True):
        streamed = stream_info(small_mesh, session.session_id)
        assert streamed.frames == 3 * BLOCKS  # toyworld: 3 video frames per block
        assert streamed.frames_sha256 == generate_digest((PromptChange(0, "a red ball"),), BLOCKS, seed)
