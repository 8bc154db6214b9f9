"""toyworld-play through the mesh: a text prompt starts the session, SDK actions (arrow keys) steer it
at block boundaries, each block's event names the keys it was made under, and the frames equal
`inferix generate --actions` with the equivalent track -- also after the worker running the session
is killed mid-session. The same for toyworld-play-1f, its weights with one-frame blocks (issue 40)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferix.client import BlockDone, Client, CommandAccepted, SessionError, StateChanged
from inferix_cli.mesh import Mesh, start_mesh
from tests.mesh.conftest import KEY_A, kill_worker, mesh_config, replace_worker, stream_info

MODEL = "toyworld-play"
PROMPT = "a yellow square steered by the arrow keys"
BLOCKS = 6
# (after block, keys): sent when that block is announced.
PLAN = [(0, ["right"]), (1, ["ArrowDown", "left"]), (3, [])]


FRAMES_PER_BLOCK = {MODEL: 3, "toyworld-play-1f": 1}


@pytest.fixture(scope="module", params=list(FRAMES_PER_BLOCK))
def play_mesh(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    model = request.param
    config = mesh_config(tmp_path_factory.mktemp("play"), workers=2, model=Path(model), capacity_probe=0)
    running = start_mesh(config)
    yield running
    running.stop()


def served(mesh: Mesh) -> str:
    return str(mesh.config.model)


def generate_digest(track: list[dict[str, object]], seed: int, workdir: Path, model: str = MODEL) -> str:
    """sha256 of the frames `inferix generate --model MODEL --actions` makes."""
    actions = workdir / f"track-{seed}.json"
    actions.write_text(json.dumps(track))
    command = [sys.executable, "-m", "inferix_cli", "generate", "--model", model, "--prompt", PROMPT]
    command += ["--actions", str(actions), "--blocks", str(BLOCKS), "--seed", str(seed), "--threads", "1"]
    command += ["--quiet", "--out", str(workdir / f"generate-{seed}.mp4")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr
    match = re.search(r"frames sha256 ([0-9a-f]{64})", result.stdout)
    assert match, result.stdout
    return match.group(1)


def drive(mesh: Mesh, seed: int, kill_after: int | None = None) -> tuple[str, list[dict[str, object]]]:
    """Run a session steered by PLAN; kill its worker once block `kill_after` is announced. Returns
    its id and the equivalent action track (each action from the block it was applied at)."""
    answers: list[CommandAccepted | SessionError] = []
    made_under: dict[int, list[str]] = {}
    killed = ""
    with Client(mesh.address, api_key=KEY_A, timeout=120) as client:
        info = client.create_session(PROMPT, model=served(mesh), num_blocks=BLOCKS, seed=seed)
        assert info.action_schema is not None
        assert [(k.name, k.key) for k in info.action_schema.keys][:2] == [("up", "ArrowUp"), ("down", "ArrowDown")]
        states = []
        with client.interact(info.session_id) as session:
            for event in session.events():
                if isinstance(event, CommandAccepted | SessionError):
                    answers.append(event)
                elif isinstance(event, StateChanged):
                    states.append(event.state)
                elif isinstance(event, BlockDone):
                    made_under[event.block_index] = sorted(event.keys)
                    for after, keys in PLAN:
                        if after == event.block_index:
                            session.act(keys=keys)
                    if event.block_index == kill_after and not killed:
                        killed = kill_worker(mesh, event.worker_id)
    assert states[-1] == "completed", states
    assert all(isinstance(a, CommandAccepted) for a in answers), answers
    applies = [a.applies_at_block for a in answers if isinstance(a, CommandAccepted)]
    canonical = [sorted({"ArrowDown": "ArrowDown", "left": "ArrowLeft", "right": "ArrowRight"}[k] for k in keys)
                 for _, keys in PLAN]  # fmt: skip
    held, expected = [], {}
    for block in range(BLOCKS):
        for at, keys in zip(applies, canonical, strict=True):
            if at == block:
                held = keys
        expected[block] = held
    assert made_under == expected  # each block's event names the keys it was made under
    if killed:
        replace_worker(mesh, killed)
    track = [{"block": at, "keys": keys} for at, keys in zip(applies, canonical, strict=True) if at < BLOCKS]
    assert len(track) >= 2, applies
    return info.session_id, track


def test_sdk_actions_give_the_frames_of_generate_with_the_same_track(play_mesh: Mesh, tmp_path: Path) -> None:
    session_id, track = drive(play_mesh, seed=3)
    streamed, model = stream_info(play_mesh, session_id), served(play_mesh)
    assert streamed.finished and streamed.frames == FRAMES_PER_BLOCK[model] * BLOCKS
    assert streamed.frames_sha256 == generate_digest(track, 3, tmp_path, model)
    assert streamed.frames_sha256 != generate_digest([], 3, tmp_path, model)  # the actions reached the model


def test_frames_are_the_same_after_the_worker_is_killed_mid_session(play_mesh: Mesh, tmp_path: Path) -> None:
    session_id, track = drive(play_mesh, seed=4, kill_after=1)
    streamed, model = stream_info(play_mesh, session_id), served(play_mesh)
    assert streamed.finished and streamed.frames == FRAMES_PER_BLOCK[model] * BLOCKS
    assert streamed.frames_sha256 == generate_digest(track, 4, tmp_path, model)
