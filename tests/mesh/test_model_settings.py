"""A worker serving a model folder whose model.yaml changes its preset (here toyworld at 160x96 and
12 fps) registers those settings, and the scheduler sizes and defaults sessions by them: a session
created without a size gets the folder's size, not the shipped preset's, and its frames equal
`inferix generate --model FOLDER`, also across a scheduler restart (whose stored sessions are checked
against the preset the workers run: 160x96 is not a size the shipped preset's KV pages divide). A
worker of the same model with other settings is kept out of placement until the first one is gone."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.families.wan.loader import MODEL_YAML, TOYWORLD_WEIGHTS
from inferix.client import BlockDone, Client, PromptChange
from inferix.server import INTERNAL_TOKEN_ENV
from inferix.spec.served import model_settings
from inferix_cli.mesh import Mesh, start_mesh
from tests.mesh.conftest import KEY_A, generate_digest, mesh_config, stream_info
from tests.mesh.test_cluster_status import cluster_status
from tests.mesh.test_scheduler_restart import restart_scheduler
from tests.store.redis_server import RedisServer

BLOCKS = 3
SEED = 5
WIDTH, HEIGHT, FPS = 160, 96, 12


@pytest.fixture(scope="module")
def small_toyworld(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """toyworld's trained weights in a folder whose model.yaml makes 160x96 video at 12 fps."""
    folder = tmp_path_factory.mktemp("small-toyworld")
    for item in TOYWORLD_WEIGHTS.iterdir():
        if item.name != MODEL_YAML:
            (folder / item.name).symlink_to(item)
    shipped = (TOYWORLD_WEIGHTS / MODEL_YAML).read_text()
    (folder / MODEL_YAML).write_text(f"{shipped}video: {{width: {WIDTH}, height: {HEIGHT}, fps: {FPS}}}\n")
    return folder


@pytest.fixture(scope="module")
def folder_mesh(
    tmp_path_factory: pytest.TempPathFactory, small_toyworld: Path, redis_server: RedisServer
) -> Iterator[Mesh]:
    redis_server.flush(db=11)
    workdir = tmp_path_factory.mktemp("settings-mesh")
    running = start_mesh(mesh_config(workdir, workers=1, model=small_toyworld, redis_url=redis_server.url(db=11)))
    yield running
    running.stop()


def _workers(mesh: Mesh, *args: str) -> list[str]:
    """`inferix cluster status` lines (one JSON object per worker with --json)."""
    result = cluster_status(mesh, *args, token=mesh.config.env[INTERNAL_TOKEN_ENV])
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_sessions_are_sized_by_the_preset_the_worker_runs(folder_mesh: Mesh, small_toyworld: Path) -> None:
    [worker] = map(json.loads, _workers(folder_mesh, "--json"))
    assert worker["model"] == "toyworld" and worker["model_settings"] == model_settings(small_toyworld) != ""
    assert _workers(folder_mesh)[1].split()[2:4] == ["toyworld", "(model.yaml)"]
    schedule = (PromptChange(0, "a red ball"),)
    with Client(folder_mesh.address, api_key=KEY_A, timeout=120) as client:
        info = client.create_session(list(schedule), num_blocks=BLOCKS, seed=SEED)  # no size: the model's
        assert (info.width, info.height) == (WIDTH, HEIGHT)
        done = [e.block_index for e in client.events(info.session_id) if isinstance(e, BlockDone)]
        assert client.get_session(info.session_id).state == "completed"
    assert done == list(range(BLOCKS))
    stream = stream_info(folder_mesh, info.session_id)
    assert (stream.width, stream.height, stream.fps) == (WIDTH, HEIGHT, FPS)
    flags = ("--model", str(small_toyworld))
    assert stream.frames_sha256 == generate_digest(schedule, BLOCKS, SEED, flags)


def test_a_restarted_scheduler_resumes_sessions_by_the_workers_preset(folder_mesh: Mesh, small_toyworld: Path) -> None:
    schedule = (PromptChange(0, "a green ball"),)
    blocks = 12
    with Client(folder_mesh.address, api_key=KEY_A, timeout=120) as client:
        info = client.create_session(list(schedule), num_blocks=blocks, seed=SEED + 1)
        done = []
        for event in client.events(info.session_id):
            if isinstance(event, BlockDone):
                done.append(event.block_index)
                if event.block_index == 1:
                    restart_scheduler(folder_mesh, "sigkill")
        final = client.get_session(info.session_id)
    assert done == list(range(blocks)) and final.state == "completed", (done, final)
    assert "stored record is unreadable" not in folder_mesh.scheduler.log_tail()
    flags = ("--model", str(small_toyworld))
    digest = generate_digest(schedule, blocks, SEED + 1, flags)
    assert stream_info(folder_mesh, info.session_id).frames_sha256 == digest


def test_a_worker_with_other_settings_for_the_same_model_is_kept_out(folder_mesh: Mesh) -> None:
    started = folder_mesh.config
    folder_mesh.config = dataclasses.replace(started, model=None)  # the shipped toyworld
    try:
        other = folder_mesh.add_worker("shipped-toyworld")
    finally:
        folder_mesh.config = started
    try:
        deadline = time.monotonic() + 60
        while "another model.yaml" not in other.log_tail() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "serves model 'toyworld' with another model.yaml than live worker" in other.log_tail()
        listed = [json.loads(line)["worker"] for line in _workers(folder_mesh, "--json")]
        assert listed == [folder_mesh.workers[0].name]
    finally:
        folder_mesh.workers.remove(other)
        other.kill()
