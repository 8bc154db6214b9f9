"""Live outputs end to end on a real mesh: the viewer page in headless Chromium, RTMP via the mesh's nginx.

Chromium is the Debian package, driven by Playwright without downloading a browser; every session
comes from the scheduler (its playback URLs, its viewer token), commands typed into the page travel
page -> streamer -> scheduler and are checked through the SDK's event stream.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from inferix.api.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from inferix.client import BlockDone, Client, CommandAccepted, SessionError, StateChanged
from inferix.spec.presets import load_preset
from inferix.viewer_token import METADATA_KEY, ViewerTokens
from inferix_cli.mesh import Mesh
from scheduler.validation import InvalidRequest, validate_spec
from tests.mesh.conftest import KEY_A, KEY_B
from tests.streamer.live import pull_rtmp

Stub = scheduler_pb2_grpc.SchedulerServiceStub
CHROMIUM = "/usr/bin/chromium"
RESULT = "document.getElementById('command-result').textContent"  # the page's answer to the last command
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"{CHROMIUM} is missing: the viewer test needs Debian's chromium (make system-deps)")
    with sync_playwright() as playwright:
        # headless=True adds --headless; Playwright gives every launch a fresh --user-data-dir.
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def scheduler(mesh: Mesh) -> Iterator[Stub]:
    with grpc.insecure_channel(mesh.address) as channel:
        yield scheduler_pb2_grpc.SchedulerServiceStub(channel)


def create(stub: Stub, prompt: str, num_blocks: int = 2, **outputs: bool) -> common_pb2.Session:
    """A session with the outputs asked for (the SDK's create_session asks for mp4 only)."""
    spec = common_pb2.SessionSpec(
        model="toyworld",
        seed=3,
        prompts=[common_pb2.PromptChange(at_block=0, text=prompt)],
        num_blocks=num_blocks,
        lookahead=1,
        outputs=common_pb2.OutputOptions(mp4=True, **outputs),
        wait_for_capacity=True,  # sessions of earlier tests may still hold the KV pages
    )
    request = scheduler_pb2.CreateSessionRequest(spec=spec)
    return stub.CreateSession(request, metadata=(("authorization", f"Bearer {KEY_A}"),), timeout=60).session


def wait_for(page: Page, expression: str, timeout: int = 20_000) -> None:
    """Poll a JavaScript expression on the page until it is true (Playwright's wait_for_function compiles
    its predicate with eval, which the page's Content-Security-Policy rightly forbids)."""
    deadline = time.monotonic() + timeout / 1e3
    while not page.evaluate(expression):
        assert time.monotonic() < deadline, f"timed out waiting for {expression}"
        time.sleep(0.1)


def viewer(page: Page) -> dict[str, Any]:
    return page.evaluate(
        "() => ({decoded: inferixViewer.framesDecoded, codec: inferixViewer.codec, error: inferixViewer.error})"
    )


def test_viewer_page_plays_the_session_and_steers_it(
    browser: Browser, scheduler: Stub, client: Client, tmp_path: Path
) -> None:
    session = create(scheduler, "a red ball", num_blocks=40, webrtc=True)
    page_url = session.urls.webrtc_page
    assert re.fullmatch(rf"http://127\.0\.0\.1:\d+/watch/{session.session_id}#token=\d+\.[\w-]+", page_url), page_url
    events: list[object] = []
    with client.interact(session.session_id) as interaction:
        stream = interaction.events()
        page = browser.new_page()
        try:
            page.goto(page_url)
            wait_for(page, "inferixViewer.framesDecoded >= 8", timeout=30_000)
            first = viewer(page)
            assert first["codec"] in ("video/H264", "video/VP8"), first  # H.264 here: no second encode
            wait_for(page, f"inferixViewer.framesDecoded >= {int(first['decoded']) + 8}", timeout=30_000)
            wait_for(page, "document.getElementById('current-prompt').textContent === 'a red ball'")

            page.fill("#prompt-input", "a blue square")
            page.click("#prompt-send")
            wait_for(page, f"{RESULT}.includes('prompt: applies at block')")
            applies_at = int(re.findall(r"\d+", page.inner_text("#command-result"))[-1])
            for event in stream:
                events.append(event)
                if isinstance(event, BlockDone) and event.block_index == applies_at:
                    break
            accepted = [e for e in events if isinstance(e, CommandAccepted) and e.command == "set_prompt"]
            assert [e.applies_at_block for e in accepted] == [applies_at]
            blocks = [e for e in events if isinstance(e, BlockDone)]
            assert blocks[-1].prompt == "a blue square" and all(b.prompt == "a red ball" for b in blocks[:-1])
            wait_for(page, "document.getElementById('current-prompt').textContent === 'a blue square'")
            stats = page.inner_text("#stats")
            assert re.search(r"Time to first frame \(session\)\s+\d+ ms", stats), stats
            assert re.search(r"Block latency \(last / p50\)\s+\d+ ms / \d+ ms", stats), stats

            page.click("#pause")
            for event in stream:
                events.append(event)
                if isinstance(event, StateChanged) and event.state == "paused":
                    break
            page.click("#resume")
            wait_for(page, f"{RESULT}.includes('resume: applies at block')")
            page.click("#stop")
            events.extend(stream)  # until the session ends
        finally:
            page.close()
    states = [e.state for e in events if isinstance(e, StateChanged)]
    assert states[-3:] == ["paused", "running", "completed"], states
    blocks = [e for e in events if isinstance(e, BlockDone)]
    info = client.get_session(session.session_id)
    assert info.state == "completed" and info.blocks_done == blocks[-1].block_index + 1 < 40

    mp4 = client.download_recording(info, tmp_path / "watched.mp4")
    probe = subprocess.run(
        [shutil.which("ffprobe") or "ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0"]
        + ["-show_entries", "stream=codec_name,nb_read_frames", "-of", "csv=p=0", str(mp4)],
        capture_output=True,
        text=True,
        check=True,
    )
    replayed = list(client.events(session.session_id))  # every block event, from block 0
    generated = sum(e.num_frames for e in replayed if isinstance(e, BlockDone))
    assert probe.stdout.strip() == f"h264,{generated}"  # the recording has exactly the frames generated


def test_rtmp_url_plays_and_a_lost_server_is_reported_in_the_session_events(
    mesh: Mesh, scheduler: Stub, client: Client
) -> None:
    assert mesh.rtmp_server is not None, f"the mesh has no RTMP server: {mesh.rtmp_note}"
    session = create(scheduler, "a red ball", num_blocks=160, rtmp=True)  # 30 s of video at real-time pace
    try:
        check_rtmp_session(mesh, session, client)
    finally:
        client.cancel_session(session.session_id)


def check_rtmp_session(mesh: Mesh, session: common_pb2.Session, client: Client) -> None:
    assert mesh.rtmp_server is not None
    assert session.urls.rtmp == f"{mesh.rtmp_url}/{session.session_id}"
    events: list[object] = []
    stream = client.events(session.session_id)
    for event in stream:
        events.append(event)
        if isinstance(event, BlockDone):
            break
    played = pull_rtmp(session.urls.rtmp, 1.5)
    assert (played.stream["codec_name"], played.stream["width"], played.stream["height"]) == ("h264", "64", "64")
    assert played.stream["r_frame_rate"] == "16/1" and played.frames >= 4, played

    mesh.rtmp_server.kill()
    try:
        for event in stream:
            events.append(event)
            if isinstance(event, SessionError):
                break
        error = events[-1]
        assert isinstance(error, SessionError) and error.code == grpc.StatusCode.UNAVAILABLE.value[0], error
        assert error.message.startswith("rtmp output: ") and "the session continues" in error.message
        done_before = max(e.block_index for e in events if isinstance(e, BlockDone))
        for event in stream:  # generation carries on while the server is away
            events.append(event)
            if isinstance(event, BlockDone) and event.block_index >= done_before + 1:
                break
    finally:
        mesh.rtmp_server.restart()
    for event in stream:
        events.append(event)
        if isinstance(event, StateChanged) and "reconnected" in event.reason:
            break
    assert isinstance(events[-1], StateChanged) and events[-1].state == "running"


def test_a_viewer_token_is_scoped_to_its_session(scheduler: Stub) -> None:
    mine = create(scheduler, "a red ball")
    other = create(scheduler, "a green ball")
    token = mine.urls.webrtc_page.partition("#token=")[2]
    as_viewer = ((METADATA_KEY, token),)
    got = scheduler.GetSession(scheduler_pb2.GetSessionRequest(session_id=mine.session_id), metadata=as_viewer)
    assert got.session.session_id == mine.session_id  # the token acts as the owner, for this session
    refused = {
        "another session": lambda: scheduler.GetSession(
            scheduler_pb2.GetSessionRequest(session_id=other.session_id), metadata=as_viewer
        ),
        "create": lambda: scheduler.CreateSession(scheduler_pb2.CreateSessionRequest(), metadata=as_viewer),
        "list": lambda: scheduler.ListSessions(scheduler_pb2.ListSessionsRequest(), metadata=as_viewer),
        "cancel": lambda: scheduler.CancelSession(
            scheduler_pb2.CancelSessionRequest(session_id=mine.session_id), metadata=as_viewer
        ),
        "forged": lambda: scheduler.GetSession(
            scheduler_pb2.GetSessionRequest(session_id=mine.session_id),
            metadata=((METADATA_KEY, ViewerTokens(b"not-the-secret-0123456789").mint(mine.session_id)),),
        ),
        "another key's session": lambda: scheduler.GetSession(
            scheduler_pb2.GetSessionRequest(session_id=mine.session_id),
            metadata=(("authorization", f"Bearer {KEY_B}"),),
        ),
    }
    for name, call in refused.items():
        with pytest.raises(grpc.RpcError) as caught:
            call()
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED, (name, caught.value)
    # the page API with the other session's token is refused by the streamer itself
    status_url = mine.urls.webrtc_page.partition("#")[0].replace("/watch/", "/api/sessions/")
    other_token = other.urls.webrtc_page.partition("#token=")[2]
    with pytest.raises(urllib.error.HTTPError) as refused_http:
        urllib.request.urlopen(
            urllib.request.Request(status_url, headers={"Authorization": f"Bearer {other_token}"}), timeout=10
        )
    assert refused_http.value.code == 403 and "not valid for this session" in refused_http.value.read().decode()
    for session in (mine, other):
        scheduler.CancelSession(
            scheduler_pb2.CancelSessionRequest(session_id=session.session_id),
            metadata=(("authorization", f"Bearer {KEY_A}"),),
        )


def test_outputs_the_server_does_not_have_are_invalid() -> None:
    spec = common_pb2.SessionSpec(
        model="tiny",
        prompts=[common_pb2.PromptChange(at_block=0, text="a red ball")],
        num_blocks=2,
        outputs=common_pb2.OutputOptions(rtmp=True),
    )
    presets = {"tiny": load_preset("tiny")}
    with pytest.raises(InvalidRequest, match=r"spec\.outputs\.rtmp: not enabled on this server .*--rtmp-play-url"):
        validate_spec(spec, presets, 2, frozenset({"mp4", "webrtc"}))
    assert validate_spec(spec, presets, 2, frozenset({"mp4", "rtmp"})).spec.outputs.rtmp


def test_the_cli_creates_an_rtmp_session_that_plays(mesh: Mesh) -> None:
    """`inferix session create --rtmp` (the CLI itself): the id on stdout, the URLs on stderr, and the
    RTMP URL plays; `session get` shows it too."""
    assert mesh.rtmp_server is not None, f"the mesh has no RTMP server: {mesh.rtmp_note}"
    cli = [sys.executable, "-m", "inferix_cli", "session", "--server", mesh.address, "--api-key", KEY_A]
    create = subprocess.run(
        [*cli, "create", "--prompt", "a red ball", "--blocks", "96", "--rtmp"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    session_id = create.stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{32}", session_id), create.stdout
    rtmp_url = f"{mesh.rtmp_url}/{session_id}"
    assert f"rtmp: {rtmp_url}\n" in create.stderr and f"/watch/{session_id}#token=" in create.stderr
    try:
        got = subprocess.run([*cli, "get", session_id], capture_output=True, text=True, timeout=60, check=True)
        assert f"rtmp: {rtmp_url}" in got.stdout
        played = pull_rtmp(rtmp_url, 1.5)
        assert played.stream["codec_name"] == "h264" and played.frames >= 4, played
    finally:
        subprocess.run([*cli, "cancel", session_id], capture_output=True, timeout=60, check=False)
