"""Playing from the browser: the viewer page sends held keys as actions, and they reach the blocks it announces.

Headless Chromium (Debian's, via Playwright, as in test_viewer.py) plays an action model's session on a
real mesh; the test focuses the video and holds keys. Every action the page announces ("applies at
block N") must be the action block N's event says it was made under, in the SDK's event stream.
`PLAY_CASES` holds one case per model (each gets a mesh serving its model); `press_keys_and_collect`
is the driver a case uses.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
from PIL import Image
from playwright.sync_api import Browser, Page

from inferix.client import BlockDone, Client
from inferix_cli.mesh import Mesh, start_mesh
from tests.mesh.conftest import KEY_A, mesh_config
from tests.mesh.test_viewer import browser, wait_for
from toyworld_lab.measure import read_frame
from toyworld_lab.play_eval import PASS_MOVE, along

__all__ = ["browser"]  # the module-scoped Chromium fixture, shared with test_viewer.py

RESOLVED = ("applied", "superseded", "refused")  # an announced action whose block event has come (or a refusal)


@dataclass(frozen=True)
class Step:
    """One keyboard event on the focused video: `down` or `up` of a key (Playwright's key names)."""

    kind: str
    key: str


@dataclass(frozen=True)
class Announced:
    """An action the page sent and what it showed about it."""

    keys: tuple[str, ...]
    mouse: tuple[float, ...]
    applies_at: int | None
    state: str  # applied | superseded | refused
    shown: str  # the page's "Block" line right after it resolved
    error: str


@dataclass(frozen=True)
class PlayCase:
    model: str
    steps: tuple[Step, ...]
    # The keys held after each step, as the page sends them (the schema's keys, in schema order).
    held: tuple[tuple[str, ...], ...]
    image: bool = False  # image-to-world: the session starts from a start image
    prompt: str = ""  # text-conditioned: the session's prompt
    mouse: bool = False  # the model takes the mouse: also play with pointer lock
    block_s: float = 0.75  # playback time of a block


HOLD_W_THEN_A = (Step("down", "w"), Step("down", "a"), Step("up", "w"), Step("up", "a"))
PLAY_CASES = [
    pytest.param(
        PlayCase("matrixgame2-tiny", HOLD_W_THEN_A, (("W",), ("W", "A"), ("A",), ()), image=True, mouse=True),
        id="matrixgame2",
    ),
]


@pytest.fixture(scope="module")
def mesh_for(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Mesh]]:
    """A mesh serving one model, started on first use and shared by the module's cases of that model."""
    meshes: dict[str, Mesh] = {}

    def get(model: str) -> Mesh:
        if model not in meshes:
            workdir = tmp_path_factory.mktemp(f"play-{model}")
            meshes[model] = start_mesh(mesh_config(workdir, workers=1, model=Path(model), capacity_probe=0))
        return meshes[model]

    yield get
    for running in meshes.values():
        running.stop()


@pytest.fixture(scope="module")
def start_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    y, x = np.mgrid[0:32, 0:48]
    pixels = np.stack([x * 5, y * 7, (x + y) * 3], axis=-1).astype(np.uint8)
    path = tmp_path_factory.mktemp("image") / "start.png"
    Image.fromarray(pixels).save(path)
    return path


def announced(page: Page) -> list[dict[str, Any]]:
    return page.evaluate(
        "() => inferixViewer.play.sent.map((e) => ({keys: e.keys, mouse: e.mouse, appliesAt: e.appliesAt,"
        " state: e.state, error: e.error}))"
    )


def focus_play(page: Page, timeout: int = 30_000) -> None:
    """Wait for the play panel and the first video frames, then focus the video (keyboard only: no pointer lock)."""
    wait_for(page, "inferixViewer.play !== null && inferixViewer.framesDecoded > 0", timeout=timeout)
    page.focus("#screen")


def press_keys_and_collect(page: Page, steps: Sequence[Step], timeout: int = 20_000) -> list[Announced]:
    """Send each step's key event to the focused video, then wait until the action it changed is resolved
    (its block's event reached the page, or it was refused). Returns the action each step made the page send."""
    results = []
    for step in steps:
        before = len(announced(page))
        (page.keyboard.down if step.kind == "down" else page.keyboard.up)(step.key)
        wait_for(
            page,
            f"inferixViewer.play.sent.length > {before} &&"
            f" {list(RESOLVED)!r}.includes(inferixViewer.play.sent.at(-1).state)",
            timeout=timeout,
        )
        entries = announced(page)
        assert len(entries) == before + 1, entries[before:]  # one send per key change: coalesced, nothing lost
        entry = entries[-1]
        results.append(
            Announced(
                tuple(entry["keys"]),
                tuple(entry["mouse"]),
                entry["appliesAt"],
                entry["state"],
                page.inner_text("#play-block"),
                entry["error"] or "",
            )
        )
    return results


def move_mouse_right(page: Page, seconds: float, pixels_per_s: float = 200.0) -> None:
    """Lock the pointer on the video and move it right at a steady pace (the page samples it every 50 ms)."""
    page.click("#screen")
    wait_for(page, "document.pointerLockElement === document.getElementById('screen')")
    box = page.locator("#screen").bounding_box()
    assert box is not None
    x, y = box["x"] + 10, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < seconds:
        page.mouse.move(x + elapsed * pixels_per_s, y)
        time.sleep(0.02)  # paces the movement; nothing waits on it
    page.evaluate("document.exitPointerLock()")  # the page releases the mouse: a still camera
    wait_for(page, "inferixViewer.play.sent.at(-1).mouse.every((v) => v === 0)")
    wait_for(page, f"{list(RESOLVED)!r}.includes(inferixViewer.play.sent.at(-1).state)")


def check_blocks(entries: list[dict[str, Any]], blocks: dict[int, tuple[tuple[str, ...], tuple[float, ...]]]) -> None:
    """Each block an action was announced for was made under the latest action announced for it;
    the page marked exactly those applied and the earlier ones superseded."""
    latest: dict[int, dict[str, Any]] = {}
    for entry in entries:
        if entry["appliesAt"] is not None:
            latest[entry["appliesAt"]] = entry
    for block, entry in latest.items():
        keys, mouse = blocks[block]
        made = (sorted(k.lower() for k in keys), list(mouse))
        assert made == (sorted(k.lower() for k in entry["keys"]), entry["mouse"]), (block, entry, blocks[block])
    for entry in entries:
        if entry["appliesAt"] is not None:
            expected = "applied" if latest[entry["appliesAt"]] is entry else "superseded"
            assert entry["state"] == expected, (entry, latest[entry["appliesAt"]])


def block_actions(client: Client, session_id: str, last: int) -> dict[int, tuple[tuple[str, ...], tuple[float, ...]]]:
    """The action each block up to `last` was made under, from the SDK's event stream."""
    actions = {}
    with client.interact(session_id) as session:
        for event in session.events():
            if isinstance(event, BlockDone):
                actions[event.block_index] = (tuple(event.keys), tuple(event.mouse))
                if event.block_index >= last:
                    break
    return actions


def create_play_session(client: Client, case: PlayCase, image: Path) -> tuple[str, str]:
    info = client.create_session(
        case.prompt or None,
        model=case.model,
        image=image if case.image else None,
        num_blocks=80,
        seed=4,
        lookahead=1,
    )
    assert info.action_schema is not None and info.viewer_url, info
    return info.session_id, info.viewer_url


@pytest.mark.parametrize("case", PLAY_CASES)
def test_the_page_sends_held_keys_and_they_apply_at_the_announced_blocks(
    case: PlayCase, mesh_for: Callable[[str], Mesh], browser: Browser, start_image: Path
) -> None:
    with Client(mesh_for(case.model).address, api_key=KEY_A, timeout=60) as client:
        session_id, url = create_play_session(client, case, start_image)
        page = browser.new_page()
        try:
            page.goto(url)
            focus_play(page)
            hint = page.inner_text("#play-hint")
            assert hint.startswith("Click the video, then use ") and page.is_visible("#play"), hint
            sent = press_keys_and_collect(page, case.steps)
            assert [a.keys for a in sent] == list(case.held), sent
            assert all(a.state == "applied" for a in sent), sent
            assert [a.shown for a in sent] == [f"applied at block {a.applies_at}" for a in sent]
            if case.mouse:
                move_mouse_right(page, seconds=3 * case.block_s)
            # Refused actions are shown and play goes on.
            page.evaluate("inferixViewer.play.request({keys: ['Q']})")
            wait_for(page, "document.getElementById('play-refused').textContent.includes(\"unknown key 'Q'\")")
            assert press_keys_and_collect(page, [Step("down", case.steps[0].key)])[0].state == "applied"
            entries = announced(page)
            blocks = block_actions(client, session_id, max(e["appliesAt"] or 0 for e in entries))
        finally:
            page.close()
            client.cancel_session(session_id)
    check_blocks(entries, blocks)
    for action in sent:
        assert action.applies_at is not None
        # The block before was made under something else: each key change took effect exactly there.
        assert blocks[action.applies_at - 1] != blocks[action.applies_at], (action, blocks)
    if case.mouse:
        turned = [e for e in entries if e["state"] == "applied" and e["mouse"][-1] > 0]
        assert turned and all(e["mouse"][-1] <= 0.1 for e in entries), entries  # yaw, clamped to its range
    refused = [e for e in entries if e["state"] == "refused"]
    assert [e["keys"] for e in refused] == [["Q"]] and "unknown key 'Q'" in refused[0]["error"], refused


def test_a_text_model_page_has_no_play_panel(mesh: Mesh, browser: Browser) -> None:
    with Client(mesh.address, api_key=KEY_A, timeout=60) as client:
        info = client.create_session("a red ball", num_blocks=160, wait_for_capacity=True)
        page = browser.new_page()
        try:
            page.goto(info.viewer_url)
            wait_for(page, "inferixViewer.status !== null && inferixViewer.framesDecoded > 0", timeout=30_000)
            assert page.evaluate("inferixViewer.status.session.action_schema") is None
            assert page.evaluate("inferixViewer.play") is None and not page.is_visible("#play")
            assert page.get_attribute("#screen", "tabindex") is None
        finally:
            page.close()
            client.cancel_session(info.session_id)


def recorded_frames(client: Client, session_id: str, folder: Path) -> np.ndarray:
    """uint8 [T, H, W, 3]: the session's recording, decoded, once the session has ended."""
    list(client.events(session_id))  # until the session's end
    mp4 = client.download_recording(client.get_session(session_id), folder / f"{session_id}.mp4")
    with av.open(str(mp4)) as container:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])


def hold_for_blocks(client: Client, session_id: str, page: Page, key: str, blocks: int) -> int:
    """Hold `key` on the focused video until `blocks` blocks were made under it; returns the block it applied at."""
    (pressed,) = press_keys_and_collect(page, [Step("down", key)])
    assert pressed.state == "applied" and pressed.applies_at is not None, pressed
    block_actions(client, session_id, pressed.applies_at + blocks - 1)  # wait until those blocks are made
    press_keys_and_collect(page, [Step("up", key)])
    return pressed.applies_at


def test_the_toyworld_play_object_moves_the_way_the_page_presses(
    mesh_for: Callable[[str], Mesh], browser: Browser, tmp_path: Path
) -> None:
    """The world answers the keys: held ArrowRight pushes the object right on screen, then ArrowLeft left
    (measured in the recording against the last frame before each key's block, as `toyworld_lab.play_eval`).
    Seed 1's object starts at rest in the upper left, with room both ways whenever the keys land."""
    held_blocks = 3
    with Client(mesh_for("toyworld-play").address, api_key=KEY_A, timeout=60) as client:
        info = client.create_session(
            "a red ball steered by the arrow keys", model="toyworld-play", num_blocks=200, seed=1, lookahead=1
        )
        page = browser.new_page()
        try:
            page.goto(info.viewer_url)
            focus_play(page)
            right = hold_for_blocks(client, info.session_id, page, "ArrowRight", held_blocks)
            left = hold_for_blocks(client, info.session_id, page, "ArrowLeft", held_blocks)
        finally:
            page.close()
            client.cancel_session(info.session_id)
        frames = recorded_frames(client, info.session_id, tmp_path)
    per_block = 3  # toyworld-play: 3 video frames a block, the first block too

    def moved(key: str, block: int) -> float:
        start = read_frame(frames[block * per_block - 1]).centroid
        end = read_frame(frames[(block + held_blocks) * per_block - 1]).centroid
        assert start is not None and end is not None, f"no object around blocks {block}..{block + held_blocks}"
        return along(key.removeprefix("Arrow").lower(), start, end)

    assert moved("ArrowRight", right) >= PASS_MOVE
    assert moved("ArrowLeft", left) >= PASS_MOVE
