"""A mesh whose workers decode with TAEHV (`inferix serve --decoder taehv:PATH`): a worker SIGKILLed
mid-session, the session finishes on the other, and its frames equal `inferix generate` with the same
decoder bit for bit (the resuming worker rebuilds the decoder's memory from the committed latents)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from safetensors.torch import save_file

from engine.decoders.taehv import TAEHVLayout, random_taehv_state
from inferix.client import BlockDone, Client, PromptChange, StateChanged
from inferix_cli.mesh import Mesh, start_mesh
from tests.mesh.conftest import KEY_A, generate_digest, kill_worker, mesh_config, replace_worker, stream_info
from tests.store.redis_server import RedisServer

BLOCKS = 4
SEED = 21
MODEL = "tiny"  # Wan VAE latents (16 channels, 8x space, 4x time): what taew2_1 decodes; toyworld's are not


@pytest.fixture(scope="module")
def taehv_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # TAEHV's widths are fixed: these are full-size random weights in the released layout.
    path = tmp_path_factory.mktemp("taehv") / "taew2_1.safetensors"
    save_file(random_taehv_state(TAEHVLayout(), seed=5), str(path))
    return path


@pytest.fixture(scope="module")
def taehv_mesh(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer, taehv_weights: Path
) -> Iterator[Mesh]:
    redis_server.flush(db=5)
    config = mesh_config(
        tmp_path_factory.mktemp("taehv-mesh"),
        workers=2,
        model=Path(MODEL),
        decoder=f"taehv:{taehv_weights}",
        redis_url=redis_server.url(db=5),
        lookahead=64,
    )
    running = start_mesh(config)
    yield running
    running.stop()


def test_a_killed_workers_session_decodes_with_taehv_as_generate_does(taehv_mesh: Mesh, taehv_weights: Path) -> None:
    schedule = (PromptChange(0, "a red ball"), PromptChange(2, "a green ball"))
    with Client(taehv_mesh.address, api_key=KEY_A, timeout=120) as client:
        info = client.create_session(list(schedule), model=MODEL, num_blocks=BLOCKS, seed=SEED)
        events: list[object] = []
        killed = ""
        for event in client.events(info.session_id):
            events.append(event)
            if isinstance(event, BlockDone) and event.block_index == 1 and not killed:
                killed = kill_worker(taehv_mesh, event.worker_id)
        final = client.get_session(info.session_id)
    blocks = [e for e in events if isinstance(e, BlockDone)]
    assert [b.block_index for b in blocks] == list(range(BLOCKS))
    assert killed not in {b.worker_id for b in blocks[3:]}
    assert [e.state for e in events if isinstance(e, StateChanged)][-1] == "completed"
    assert final.state == "completed" and final.blocks_done == BLOCKS
    streamed = stream_info(taehv_mesh, info.session_id)
    assert streamed.frames == 1 + 4 * (3 * BLOCKS - 1)  # TAEHV: 9 frames, then 12 per block
    flags = ("--model", MODEL, "--decoder", f"taehv:{taehv_weights}")
    assert streamed.frames_sha256 == generate_digest(schedule, BLOCKS, SEED, flags)
    assert streamed.frames_sha256 != generate_digest(schedule, BLOCKS, SEED, ("--model", MODEL))  # it reached them
    replace_worker(taehv_mesh, killed)
