"""Restarts under `inferix serve`, seen from the client: recordings and CLI commands survive them.

The real CLI as subprocesses, services SIGKILLed by pid and restarted by serve's supervisor (after a
6 s backoff, so the CLI surely starts while the service is away):
- a finished 8-block toyworld session's recording survives a streamer restart: `inferix session
  download` started while the streamer is down waits, says so once on stderr, and gets the same MP4
  (bytes, frame count); GetStreamInfo gives the same frame count and frames SHA-256; a Range request works;
- `inferix session download` and `inferix session create` started while the scheduler is down (Redis:
  the session survives) wait and succeed, and the create makes exactly one session;
- a CreateSession whose connection drops after it was sent (the scheduler SIGSTOPped, then SIGKILLed)
  is reported at once, never retried (it might have created the session), while a GetSession cut off
  the same way is retried and answered by the restarted scheduler; the AsyncClient's download waits
  for a restarting streamer as the CLI's does.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from inferix.client import AsyncClient, Client, StateChanged
from tests.mesh.conftest import KEY_A
from tests.mesh.test_supervisor import Serve, list_workers, stream_info, wait_until
from tests.store.redis_server import RedisServer
from tests.streamer.media import ffprobe

BLOCKS = 8
BACKOFF_S = "6"  # the supervisor's restart delay: the window in which the CLI meets a service that is away
NOTICE = re.compile(r"is not answering \((?:UNAVAILABLE|.*Connection refused.*)\); retrying for up to 30 s")


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer) -> Iterator[Serve]:
    redis_server.flush(db=9)
    env = {"INFERIX_SERVE_BACKOFF_S": BACKOFF_S}
    workdir = tmp_path_factory.mktemp("restart-clients") / "serve"
    running = Serve(workdir, "--workers", "1", "--rtmp", "off", "--redis-url", redis_server.url(9), env=env)
    try:
        yield running
    finally:
        running.close()


def cli(mesh: Serve, *args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "inferix_cli", "session", "--server", mesh.address, "--api-key", KEY_A, *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen[str]) -> tuple[str, str]:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    return out, err


def kill(mesh: Serve, name: str) -> int:
    """SIGKILL a service; the stdout line from which to look for its restart."""
    line = len(mesh.stdout)
    mesh.note_children()
    os.kill(mesh.pid_of(name), signal.SIGKILL)
    return line


def http_range(mp4_url: str, byte_range: str) -> tuple[int, bytes, str]:
    url, _, fragment = mp4_url.partition("#token=")
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {fragment}", "Range": byte_range})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, response.read(), response.headers["Content-Range"]


def test_recordings_and_cli_commands_survive_restarts(mesh: Serve, tmp_path: Path) -> None:
    wait_until(lambda: set(list_workers(mesh.kvcache)) == {"worker0"}, 60, "the worker registered")
    with Client(mesh.address, api_key=KEY_A, timeout=60) as client:
        info = client.create_session("a red ball", num_blocks=BLOCKS, seed=5)
        states = [e.state for e in client.events(info.session_id) if isinstance(e, StateChanged)]
        assert states[-1] == "completed", states
        mp4_url = client.get_session(info.session_id).mp4_url
    before = stream_info(mesh.streamer, info.session_id)
    assert before.finished and before.frames == BLOCKS * 3  # toyworld: 3 frames per block
    first = tmp_path / "first.mp4"
    finish(cli(mesh, "download", info.session_id, str(first)))
    mp4 = first.read_bytes()

    # the streamer dies; a download started while it is away waits for it, then gets the same recording
    line = kill(mesh, "streamer")
    downloading = cli(mesh, "download", info.session_id, str(tmp_path / "after-streamer.mp4"))
    out, err = finish(downloading)
    mesh.wait_for_line(r"^streamer restarted: ", start=line, timeout=5)
    assert len(NOTICE.findall(err)) == 1 and "the streamer at http://" in err, err
    assert (tmp_path / "after-streamer.mp4").read_bytes() == mp4
    assert ffprobe(tmp_path / "after-streamer.mp4")["nb_read_frames"] == str(BLOCKS * 3)
    after = stream_info(mesh.streamer, info.session_id)
    assert (after.finished, after.frames, after.frames_sha256) == (True, before.frames, before.frames_sha256)
    assert http_range(mp4_url, "bytes=1000-1999") == (206, mp4[1000:2000], f"bytes 1000-1999/{len(mp4)}")

    # the scheduler dies; a download and a create started while it is away wait for it and succeed
    line = kill(mesh, "scheduler")
    downloading = cli(mesh, "download", info.session_id, str(tmp_path / "after-scheduler.mp4"))
    creating = cli(mesh, "create", "--prompt", "a blue square", "--blocks", "2", "--seed", "77")
    _, err = finish(downloading)
    assert len(NOTICE.findall(err)) == 1 and f"the scheduler at {mesh.address}" in err, err
    out, err = finish(creating)
    assert len(NOTICE.findall(err)) == 1, err
    mesh.wait_for_line(r"^scheduler restarted: ", start=line, timeout=5)
    assert (tmp_path / "after-scheduler.mp4").read_bytes() == mp4
    created = out.strip()
    with Client(mesh.address, api_key=KEY_A, timeout=60) as client:
        sessions = [s.session_id for s in client.list_sessions() if s.seed == 77]
    assert sessions == [created]  # one session, not one per attempt


def test_a_call_cut_off_mid_way_is_retried_only_when_idempotent(mesh: Serve, tmp_path: Path) -> None:
    wait_until(lambda: set(list_workers(mesh.kvcache)) == {"worker0"}, 60, "the worker registered")
    notices: list[str] = []
    with Client(mesh.address, api_key=KEY_A, timeout=60, on_wait=notices.append) as client:
        info = client.create_session("a green cube", num_blocks=2, seed=88)
        assert [e.state for e in client.events(info.session_id) if isinstance(e, StateChanged)][-1] == "completed"
        # the scheduler stops answering with the calls sent on an open connection, then dies
        scheduler = mesh.pid_of("scheduler")
        line = len(mesh.stdout)
        mesh.note_children()
        os.kill(scheduler, signal.SIGSTOP)
        with ThreadPoolExecutor(2) as pool:
            creating = pool.submit(client.create_session, "a green cube", num_blocks=2, seed=89)
            getting = pool.submit(client.get_session, info.session_id)
            time.sleep(1.0)
            os.kill(scheduler, signal.SIGKILL)
            killed_at = time.monotonic()
            with pytest.raises(grpc.RpcError) as caught:
                creating.result(timeout=60)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert time.monotonic() - killed_at < 5  # reported, not retried for 30 s
            assert getting.result(timeout=60).state == "completed"  # retried: answered after the restart
        mesh.wait_for_line(r"^scheduler restarted: ", start=line, timeout=5)
        assert len(notices) == 1 and "the scheduler at" in notices[0], notices
        assert [s for s in client.list_sessions() if s.seed == 89] == []  # the cut-off create never ran
        final = client.get_session(info.session_id)

    # the AsyncClient's download waits for a restarting streamer too
    line = kill(mesh, "streamer")
    waited: list[str] = []

    async def download() -> Path:
        async with AsyncClient(mesh.address, api_key=KEY_A, timeout=60, on_wait=waited.append) as client:
            return await client.download_recording(final, tmp_path / "async.mp4")

    recording = asyncio.run(download())
    mesh.wait_for_line(r"^streamer restarted: ", start=line, timeout=5)
    assert len(waited) == 1 and "the streamer at http://" in waited[0], waited
    assert ffprobe(recording)["nb_read_frames"] == "6"
