"""Matrix-Game 2.0 through the mesh: sessions start from an image, SDK actions steer them at block
boundaries, and the frames equal `inferix generate --image --actions` with the equivalent track --
also after the worker running the session is killed mid-session."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from PIL import Image

from inferix.client import AsyncClient, BlockDone, Client, CommandAccepted, SessionError, StateChanged
from inferix_cli.mesh import Mesh, start_mesh
from scheduler.sessions import ACTION_BURST
from tests.mesh.conftest import KEY_A, kill_worker, mesh_config, replace_worker, stream_info

MODEL = "matrixgame2-tiny"
BLOCKS = 6
CANONICAL = {"forward": "W", "a": "A", "d": "D", "s": "S", "w": "W"}  # PLAN's key names as the events give them
INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT.value[0]
RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
# (after block, keys, mouse): sent when that block is announced; two at once flood one boundary.
PLAN = [
    (0, ["W"], [0.0, 0.05]),
    (1, ["forward", "a"], [0.1, -0.02]),
    (2, ["S"], []),
    (2, ["D"], [-0.1, 0.0]),  # same boundary as the one before (or the next): the latest wins
]
# Each answered INVALID_ARGUMENT naming the field; the session goes on.
BAD_ACTIONS = [(["Q"], [], "action: keys: unknown key 'Q'"), (["W"], [0.3, 0.0], "action: mouse pitch: 0.3")]


@pytest.fixture(scope="module")
def world_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    config = mesh_config(tmp_path_factory.mktemp("matrixgame"), workers=2, model=Path(MODEL), capacity_probe=0)
    running = start_mesh(config)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def start_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 60x40 gradient (not the model's 48x32: the worker crops and resizes it as generate does)."""
    y, x = np.mgrid[0:40, 0:60]
    pixels = np.stack([x * 4, y * 6, (x + y) * 2], axis=-1).astype(np.uint8)
    path = tmp_path_factory.mktemp("image") / "start.png"
    Image.fromarray(pixels).save(path)
    return path


def generate_digest(image: Path, track: list[dict[str, object]], seed: int, workdir: Path) -> str:
    """sha256 of the frames `inferix generate --model matrixgame2-tiny --image --actions` makes."""
    actions = workdir / f"track-{seed}.json"
    actions.write_text(json.dumps(track))
    command = [sys.executable, "-m", "inferix_cli", "generate", "--model", MODEL, "--image", str(image)]
    command += ["--actions", str(actions), "--blocks", str(BLOCKS), "--seed", str(seed), "--threads", "1"]
    command += ["--quiet", "--out", str(workdir / f"generate-{seed}.mp4")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr
    match = re.search(r"frames sha256 ([0-9a-f]{64})", result.stdout)
    assert match, result.stdout
    return match.group(1)


def drive(mesh: Mesh, image: Path, seed: int, kill_after: int | None = None) -> tuple[str, list[dict[str, object]]]:
    """Run a session steered by PLAN (and BAD_ACTIONS after block 0); kill the worker running it once
    block `kill_after` is announced. Returns its id and the equivalent action track."""
    answers: list[CommandAccepted | SessionError] = []
    sent: list[tuple[list[str], list[float]]] = []
    made_under: dict[int, tuple[list[str], list[float]]] = {}
    killed = ""
    with Client(mesh.address, api_key=KEY_A, timeout=120) as client:
        info = client.create_session(model=MODEL, image=image, num_blocks=BLOCKS, seed=seed)
        schema = info.action_schema
        assert schema is not None and not schema.one_hot
        assert [k.key for k in schema.keys] == ["W", "S", "A", "D"]
        assert [(a.name, a.minimum, a.maximum) for a in schema.mouse] == [("pitch", -0.1, 0.1), ("yaw", -0.1, 0.1)]
        states = []
        with client.interact(info.session_id) as session:
            for event in session.events():
                if isinstance(event, CommandAccepted | SessionError):
                    answers.append(event)
                elif isinstance(event, StateChanged):
                    states.append(event.state)
                elif isinstance(event, BlockDone):
                    made_under[event.block_index] = (list(event.keys), list(event.mouse))
                    for after, keys, mouse in PLAN:
                        if after == event.block_index:
                            session.act(keys=keys, mouse=mouse)
                            sent.append((keys, mouse))
                    if event.block_index == 0:
                        for keys, mouse, _ in BAD_ACTIONS:
                            session.act(keys=keys, mouse=mouse)
                    if event.block_index == kill_after and not killed:
                        killed = kill_worker(mesh, event.worker_id)
        final = client.get_session(info.session_id)
    assert states[-1] == "completed", states
    assert final.blocks_done == BLOCKS
    errors = [a for a in answers if isinstance(a, SessionError)]
    assert [e.code for e in errors] == [INVALID_ARGUMENT] * len(BAD_ACTIONS)
    for error, (_, _, message) in zip(errors, BAD_ACTIONS, strict=True):
        assert message in error.message, error.message
    accepted = [a for a in answers if isinstance(a, CommandAccepted)]
    assert [a.command for a in accepted] == ["action"] * len(PLAN)
    held: dict[int, tuple[list[str], list[float]]] = {}
    for answer, action in zip(accepted, sent, strict=True):
        held[answer.applies_at_block] = action  # in order: the latest before a boundary wins
    if killed:
        replace_worker(mesh, killed)
    track = [{"block": b, "keys": k, "mouse": m or [0.0, 0.0]} for b, (k, m) in sorted(held.items()) if b < BLOCKS]
    # Each block's event names the action it was made under: the latest applied at or before it.
    expected, now = {}, ([], [0.0, 0.0])
    for block in range(BLOCKS):
        keys, mouse = held.get(block, now)
        now = (sorted(CANONICAL.get(k.lower(), k) for k in keys), mouse or [0.0, 0.0])
        expected[block] = now
    assert {b: (sorted(k), m) for b, (k, m) in made_under.items()} == expected
    assert len(track) >= 2, held  # the session was steered while it ran
    return info.session_id, track


def test_sdk_actions_give_the_frames_of_generate_with_the_same_track(
    world_mesh: Mesh, start_image: Path, tmp_path: Path
) -> None:
    session_id, track = drive(world_mesh, start_image, seed=5)
    streamed = stream_info(world_mesh, session_id)
    assert streamed.finished and streamed.frames == 9 + 12 * (BLOCKS - 1)
    assert streamed.frames_sha256 == generate_digest(start_image, track, 5, tmp_path)
    # The actions reached the model: without them the frames differ.
    assert streamed.frames_sha256 != generate_digest(start_image, [], 5, tmp_path)


def test_frames_are_the_same_after_the_worker_is_killed_mid_session(
    world_mesh: Mesh, start_image: Path, tmp_path: Path
) -> None:
    session_id, track = drive(world_mesh, start_image, seed=6, kill_after=1)
    streamed = stream_info(world_mesh, session_id)
    assert streamed.finished and streamed.frames == 9 + 12 * (BLOCKS - 1)
    assert streamed.frames_sha256 == generate_digest(start_image, track, 6, tmp_path)


def test_a_session_of_an_image_model_needs_an_image_and_no_prompt(world_mesh: Mesh, start_image: Path) -> None:
    with Client(world_mesh.address, api_key=KEY_A, timeout=60) as client:
        cases: list[tuple[dict[str, Any], str]] = [
            ({}, "spec.image: model 'matrixgame2-tiny' is image-to-world"),
            ({"image": b"GIF89a not an image"}, "spec.image: not a PNG or JPEG"),
            ({"image": start_image, "prompt": "a street"}, "spec.prompts: model 'matrixgame2-tiny' has no text"),
            ({"image": start_image, "num_blocks": 0}, "spec.num_blocks: a Matrix-Game session needs"),
            ({"image": start_image, "width": 64, "height": 32}, "spec.resolution: resolution 64x32"),
        ]
        for kwargs, field in cases:
            with pytest.raises(grpc.RpcError) as refused:
                client.create_session(model=MODEL, **{"num_blocks": 2, **kwargs})
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert field in (refused.value.details() or ""), refused.value.details()


def test_cli_session_act(world_mesh: Mesh, start_image: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "inferix_cli", "session", "--server", world_mesh.address, "--api-key", KEY_A]
        return subprocess.run([*command, *args], capture_output=True, text=True, timeout=120, check=False)

    created = cli("create", "--model", MODEL, "--image", str(start_image), "--blocks", "12")
    assert created.returncode == 0, created.stderr
    session_id = created.stdout.strip()
    acted = cli("act", session_id, "--keys", "W,A", "--mouse", "0.1,0")
    assert acted.returncode == 0, acted.stderr
    assert re.fullmatch(r"action applies at block \d+\n", acted.stdout), acted.stdout
    refused = cli("act", session_id, "--keys", "W", "--mouse", "0.1")
    assert refused.returncode != 0
    assert "action: mouse: expected 2 value(s) (pitch, yaw), got 1" in refused.stderr, refused.stderr
    shown = cli("get", session_id)
    assert "actions: keys W, S, A, D; mouse pitch [-0.1, 0.1], yaw [-0.1, 0.1]" in shown.stdout, shown.stdout
    assert cli("cancel", session_id).returncode == 0


def test_an_action_to_a_text_model_is_refused(mesh: Mesh) -> None:
    with Client(mesh.address, api_key=KEY_A, timeout=60) as client:
        info = client.create_session("a red ball", num_blocks=4)
        assert info.action_schema is None
        with client.interact(info.session_id) as session:
            session.act(keys=["W"])
            answers = [e for e in session.events() if isinstance(e, CommandAccepted | SessionError)]
    assert len(answers) == 1 and isinstance(answers[0], SessionError), answers
    assert answers[0].code == INVALID_ARGUMENT
    assert "action: model 'toyworld' takes no actions" in answers[0].message


def test_async_client_act(world_mesh: Mesh, start_image: Path) -> None:
    async def steer() -> list[CommandAccepted | SessionError]:
        async with AsyncClient(world_mesh.address, api_key=KEY_A, timeout=60) as client:
            info = await client.create_session(model=MODEL, image=start_image.read_bytes(), num_blocks=12)
            assert info.action_schema is not None and info.current_keys == ()
            answers: list[CommandAccepted | SessionError] = []
            async with client.interact(info.session_id) as session:
                await session.act(keys=["d"], mouse=[0.0, -0.1])
                await session.act(keys=["W", "S"], mouse=[0.0, 0.11])
                async for event in session.events():
                    if isinstance(event, CommandAccepted | SessionError):
                        answers.append(event)
                    if len(answers) == 2:
                        break
            assert (await client.get_session(info.session_id)).current_keys in ((), ("D",))
            await client.cancel_session(info.session_id)
            return answers

    accepted, refused = asyncio.run(steer())
    assert isinstance(accepted, CommandAccepted) and accepted.command == "action"
    assert isinstance(refused, SessionError) and refused.code == INVALID_ARGUMENT
    assert "action: mouse yaw: 0.11 is outside [-0.1, 0.1]" in refused.message


def test_an_action_flood_is_refused_and_the_session_goes_on(world_mesh: Mesh, start_image: Path) -> None:
    flood = ACTION_BURST + 40  # sent at once: the burst is accepted, the rest refused
    with Client(world_mesh.address, api_key=KEY_A, timeout=120) as client:
        info = client.create_session(model=MODEL, image=start_image, num_blocks=3, seed=2)
        answers: list[CommandAccepted | SessionError] = []
        states = []
        with client.interact(info.session_id) as session:
            for i in range(flood):
                session.act(keys=["W" if i % 2 else "S"])
            for event in session.events():
                if isinstance(event, CommandAccepted | SessionError):
                    answers.append(event)
                elif isinstance(event, StateChanged):
                    states.append(event.state)
        final = client.get_session(info.session_id)
    assert len(answers) == flood
    refused = [a for a in answers if isinstance(a, SessionError)]
    # Refill during the burst may let a few more through; most of the excess is refused.
    assert 20 <= len(refused) <= 40, len(refused)
    assert all(r.code == RESOURCE_EXHAUSTED and "action: too many actions" in r.message for r in refused)
    assert states[-1] == "completed" and final.blocks_done == 3
