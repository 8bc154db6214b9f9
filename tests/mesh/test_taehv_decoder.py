"""A mesh whose workers decode with TAEHV (`inferix serve --decoder taehv:PATH`): a worker SIGKILLed
mid-session, the session finishes on the other, and its frames equal `inferix generate` with the same
decoder bit for bit (the resuming worker rebuilds the decoder's memory from the committed latents)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from inferix.client import BlockDone, Client, PromptChange, StateChanged
from inferix_cli.mesh import Mesh
from tests.mesh.conftest import KEY_A, generate_digest, kill_worker, replace_worker, stream_info
from tests.mesh.taehv_mesh import MODEL, running_taehv_mesh, write_taehv_weights
from tests.store.redis_server import RedisServer

BLOCKS = 4
SEED = 21


@pytest.fixture(scope="module")
def taehv_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_taehv_weights(tmp_path_factory.mktemp("taehv"), seed=5)


@pytest.fixture(scope="module")
def taehv_mesh(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer, taehv_weights: Path
) -> Iterator[Mesh]:
    workdir = tmp_path_factory.mktemp("taehv-mesh")
    with running_taehv_mesh(workdir, redis_server, taehv_weights, workers=2, db=5) as running:
        yield running


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
