"""The streamer restarts (SIGKILL, or SIGTERM) in the middle of a session.

The worker's frames wait while it is away. A streamer killed mid-session kept its recording up to
the last closed segment (4 s, 64 toyworld frames); the restarted one asks for the frames after that
(OUT_OF_RANGE) and the worker re-sends them from memory, nothing decoded again. A drained streamer
(SIGTERM) journaled every frame, so nothing is re-sent. Either way the recording ends up complete and
identical to `inferix generate`: no frame missing, none twice; the live outputs join with the first
new frame. A worker that took the session over does not hold the frames its predecessor pushed: it
decodes them again from the committed latents and sends those from the journal's point on.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from inferix.client import BlockDone, Client, PromptChange, StateChanged
from inferix_cli.mesh import Mesh, start_mesh
from tests.mesh.conftest import KEY_A, generate_digest, kill_worker, mesh_config, replace_worker, stream_info
from tests.streamer.live import wait_until
from tests.streamer.media import ffprobe

BLOCKS = 32  # ~6 s at toyworld's real-time pace: the session outlives the restart
FRAME_BYTES = 64 * 64 * 3  # toyworld's RGB frames
RESTART_AT = 24  # frame 74: past the first recording segment (frames 0..63)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    running = start_mesh(mesh_config(tmp_path_factory.mktemp("streamer-restart"), workers=2, rtmp="off"))
    yield running
    running.stop()


@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
def test_a_session_survives_a_streamer_restart(mesh: Mesh, how: str, tmp_path: Path) -> None:
    schedule = (PromptChange(0, "a red ball"), PromptChange(10, "a yellow ball"))
    with Client(mesh.address, api_key=KEY_A, timeout=60) as client:
        info = client.create_session(list(schedule), num_blocks=BLOCKS, seed=21)
        events: list[object] = []
        restarted = False
        for event in client.events(info.session_id):
            events.append(event)
            if isinstance(event, BlockDone) and event.block_index == RESTART_AT and not restarted:
                restarted = True
                journal = mesh.config.workdir / "recordings" / f"{info.session_id}.journal.json"
                wait_until(journal.is_file, 10, "the first recording segment")
                maker = event.worker_id
                # the worker keeps only what the streamer has not made durable (once a push has told it
                # so): frames from 63 on, not the 75 and more since frame 0
                wait_until(partial(kept_since_durable, mesh, maker), 10, "frames kept trimmed")
                code = mesh.streamer.kill() if how == "sigkill" else mesh.streamer.stop()
                assert code == (-9 if how == "sigkill" else 0), mesh.streamer.log_tail()
                mesh.replace(mesh.relaunch(mesh.streamer).wait())  # type: ignore[union-attr]
        final = client.get_session(info.session_id)
        assert [e.block_index for e in events if isinstance(e, BlockDone)] == list(range(BLOCKS))
        assert [e.state for e in events if isinstance(e, StateChanged)][-1] == "completed"
        assert final.state == "completed"
        streamed = stream_info(mesh, info.session_id)
        assert streamed.finished and streamed.frames == BLOCKS * 3  # toyworld: 3 video frames per block
        assert streamed.frames_sha256 == generate_digest(schedule, BLOCKS, 21)
        recording = client.download_recording(final, tmp_path / "session.mp4")
    assert ffprobe(recording)["nb_read_frames"] == str(BLOCKS * 3)
    wait_until(lambda: resend_bytes(mesh, maker) == 0, 10, "the closed session's frames forgotten")
    log = worker_logs(mesh)
    assert "decoded again" not in log
    resent = re.findall(rf"re-sent frames (\d+)\.\.\d+ of {info.session_id} to a restarted streamer from memory", log)
    # SIGKILL: the frames after the first segment; SIGTERM: none, the drain journaled every frame
    assert resent == (["64"] if how == "sigkill" else []), log[-3000:]


def kept_since_durable(mesh: Mesh, worker_id: str) -> bool:
    """Whether the worker keeps some frames, but not more than 16 blocks' worth."""
    return 0 < resend_bytes(mesh, worker_id) <= FRAME_BYTES * 48


def resend_bytes(mesh: Mesh, worker_id: str) -> float:
    """The worker's `inferix_worker_resend_bytes` gauge."""
    port = next(w for w in mesh.workers if w.name == worker_id).metrics_port
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    match = re.search(r"^inferix_worker_resend_bytes (\S+)$", text, re.M)
    assert match, "the worker exports inferix_worker_resend_bytes"
    return float(match.group(1))


def worker_logs(mesh: Mesh) -> str:
    return "".join(path.read_text() for path in sorted(mesh.config.workdir.glob("worker*.log")))


def test_a_worker_that_took_the_session_over_decodes_what_a_restarted_streamer_lacks(mesh: Mesh) -> None:
    schedule = (PromptChange(0, "a green ball"),)
    with Client(mesh.address, api_key=KEY_A, timeout=60) as client:
        info = client.create_session(list(schedule), num_blocks=BLOCKS, seed=22)
        journal = mesh.config.workdir / "recordings" / f"{info.session_id}.journal.json"
        first_worker = ""
        restarted = False
        blocks = []
        for event in client.events(info.session_id):
            if not isinstance(event, BlockDone):
                continue
            blocks.append(event.block_index)
            if not first_worker and event.block_index == RESTART_AT:
                wait_until(journal.is_file, 10, "the first recording segment")
                first_worker = kill_worker(mesh, event.worker_id)
            elif first_worker and event.worker_id != first_worker and not restarted:
                restarted = True  # the successor has pushed a block: the streamer's journal ends before it
                assert mesh.streamer.kill() == -9, mesh.streamer.log_tail()
                mesh.replace(mesh.relaunch(mesh.streamer).wait())  # type: ignore[union-attr]
        assert restarted and blocks == list(range(BLOCKS))
        streamed = stream_info(mesh, info.session_id)
        assert streamed.finished and streamed.frames == BLOCKS * 3
        assert streamed.frames_sha256 == generate_digest(schedule, BLOCKS, 22)
    replace_worker(mesh, first_worker)
    pattern = rf"re-sent frames (\d+)\.\.\d+ of {info.session_id} to a restarted streamer, decoded again"
    assert re.findall(pattern, worker_logs(mesh)) == ["64"], worker_logs(mesh)[-3000:]
