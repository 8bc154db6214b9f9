"""LongLive through the mesh: prompt switches re-cache the KV cache as the model says, and a session
whose worker dies between two switches continues bit-identically on another worker (its committed
blocks say where a re-cache ran, and the new worker's replay runs it there too)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from inferix.client import BlockDone, Client, PromptChange
from inferix_cli.mesh import Mesh, start_mesh
from tests.engine.wan.longlive_folder import write_longlive_folder
from tests.mesh.conftest import KEY_A, generate_digest, kill_worker, mesh_config, replace_worker, stream_info

BLOCKS = 8
# Switches at block 3 (frame 9: the window of 9 frames is just full, so the whole window is re-encoded)
# and block 6 (frame 18: the window rolled, the sink keeps the first prompt's K/V).
SCHEDULE = (PromptChange(0, "w5 w6 w7"), PromptChange(3, "w20 w21"), PromptChange(6, "w40 w41 w42 w43"))
FRAMES = 1 + 4 * 2 + (BLOCKS - 1) * 12  # the Wan VAE: 9 frames from the first block of 3 latent frames, then 12


@pytest.fixture(scope="module")
def longlive_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_longlive_folder(tmp_path_factory.mktemp("longlive") / "model")


@pytest.fixture(scope="module")
def longlive_mesh(tmp_path_factory: pytest.TempPathFactory, longlive_model: Path) -> Iterator[Mesh]:
    config = mesh_config(tmp_path_factory.mktemp("longlive-mesh"), workers=2, model=longlive_model, capacity_probe=0)
    running = start_mesh(config)
    yield running
    running.stop()


@pytest.mark.parametrize("kill", [False, True], ids=["uninterrupted", "worker_killed_between_switches"])
def test_a_longlive_session_equals_generate(longlive_mesh: Mesh, longlive_model: Path, kill: bool) -> None:
    seed = 21
    with Client(longlive_mesh.address, api_key=KEY_A, timeout=120) as client:
        info = client.create_session(list(SCHEDULE), model="longlive-tiny", num_blocks=BLOCKS, seed=seed)
        killed = ""
        blocks: list[BlockDone] = []
        for event in client.events(info.session_id):
            if isinstance(event, BlockDone):
                blocks.append(event)
                if kill and event.block_index == 3 and not killed:  # after the first switch's re-cache
                    killed = kill_worker(longlive_mesh, event.worker_id)
        final = client.get_session(info.session_id)
    assert final.state == "completed" and [b.block_index for b in blocks] == list(range(BLOCKS))
    if kill:
        assert killed and killed not in {b.worker_id for b in blocks[5:]}
        replace_worker(longlive_mesh, killed)
    streamed = stream_info(longlive_mesh, info.session_id)
    assert streamed.frames == FRAMES
    assert streamed.frames_sha256 == generate_digest(SCHEDULE, BLOCKS, seed, ("--model", str(longlive_model)))


def test_the_switches_recache(longlive_model: Path) -> None:
    """The schedule above does re-cache (so the test above compares what it means to): the same
    session without re-caching (the model's prompt_switch turned off) makes other frames."""
    folder = longlive_model.parent / "no-recache"
    if not folder.exists():
        folder.mkdir()
        for path in longlive_model.rglob("*"):
            target = folder / path.relative_to(longlive_model)
            if path.is_dir():
                target.mkdir(exist_ok=True)
            else:
                target.symlink_to(path)
        config = yaml.safe_load((longlive_model / "model.yaml").read_text())
        (folder / "model.yaml").unlink()
        (folder / "model.yaml").write_text(
            yaml.safe_dump({**config, "pipeline": {"prompt_switch": {"recache": False}}})
        )
    recached = generate_digest(SCHEDULE, BLOCKS, 21, ("--model", str(longlive_model)))
    assert generate_digest(SCHEDULE, BLOCKS, 21, ("--model", str(folder))) != recached
