"""The scheduler restarts in the middle of a session (SIGKILL, or SIGTERM as in a rolling update).

With a Redis store the new scheduler resumes the session from its record; the SDK's event stream and
`inferix session watch` re-attach by themselves and see every block exactly once; the video is
bit-identical to `inferix generate`. With the in-memory store sessions cannot survive: they end as
failed, never as completed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from inferix.api.v1 import worker_pb2, worker_pb2_grpc
from inferix.client import BlockDone, Client, PromptChange, StateChanged
from inferix.server import INTERNAL_TOKEN_ENV, INTERNAL_TOKEN_HEADER
from inferix_cli.mesh import Mesh, start_mesh
from tests.mesh.conftest import KEY_A, generate_digest, mesh_config, stream_info
from tests.store.redis_server import RedisServer

BLOCKS = 32  # ~6 s of video at toyworld's 16 fps: the session is still running after the restart


def restart_scheduler(mesh: Mesh, how: str) -> None:
    code = mesh.scheduler.kill() if how == "sigkill" else mesh.scheduler.stop()
    assert code == (-9 if how == "sigkill" else 0), mesh.scheduler.log_tail()
    mesh.replace(mesh.relaunch(mesh.scheduler).wait())  # type: ignore[union-attr]


def watch_cli(mesh: Mesh, session_id: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "inferix_cli", "session", "--server", mesh.address, "--api-key", KEY_A]
    return subprocess.Popen([*command, "watch", session_id], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def redis_mesh(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer) -> Iterator[Mesh]:
    redis_server.flush(db=4)
    running = start_mesh(
        mesh_config(tmp_path_factory.mktemp("restart-mesh"), workers=1, redis_url=redis_server.url(db=4))
    )
    yield running
    running.stop()


@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
def test_a_session_survives_a_scheduler_restart(redis_mesh: Mesh, how: str) -> None:
    schedule = (PromptChange(0, "a red ball"), PromptChange(8, "a green ball"))
    with Client(redis_mesh.address, api_key=KEY_A, timeout=60) as client:
        info = client.create_session(list(schedule), num_blocks=BLOCKS, seed=7)
        watcher = watch_cli(redis_mesh, info.session_id)
        events: list[object] = []
        restarted = False
        for event in client.events(info.session_id):
            events.append(event)
            if isinstance(event, BlockDone) and event.block_index == 3 and not restarted:
                restarted = True
                restart_scheduler(redis_mesh, how)
        final = client.get_session(info.session_id)
    out, err = watcher.communicate(timeout=120)
    assert watcher.returncode == 0, err
    assert [int(b) for b in re.findall(r"^block\s+(\d+)", out, re.MULTILINE)] == list(range(BLOCKS)), out
    assert [e.block_index for e in events if isinstance(e, BlockDone)] == list(range(BLOCKS))
    states = [e for e in events if isinstance(e, StateChanged)]
    assert any("restarted scheduler" in s.reason for s in states)
    assert states[-1].state == "completed" and final.state == "completed" and final.blocks_done == BLOCKS
    streamed = stream_info(redis_mesh, info.session_id)
    assert streamed.frames == BLOCKS * 3  # toyworld: 3 video frames per block
    assert streamed.frames_sha256 == generate_digest(schedule, BLOCKS, 7)


def test_a_corrupt_stored_record_is_reported_and_skipped(redis_mesh: Mesh, redis_server: RedisServer) -> None:
    import redis

    with Client(redis_mesh.address, api_key=KEY_A, timeout=60) as client:
        before = client.create_session("a red ball", num_blocks=1)
        list(client.events(before.session_id))
    store = redis.Redis.from_url(redis_server.url(db=4))
    stored = next(k.decode() for k in store.keys("*scheduler/sessions/*") if k.decode().endswith(before.session_id))
    corrupt = stored.replace(before.session_id, "not-json")
    store.set(corrupt, b"\x00garbage")
    try:
        restart_scheduler(redis_mesh, "sigkill")
        with Client(redis_mesh.address, api_key=KEY_A, timeout=60) as client:
            assert client.get_session(before.session_id).state == "completed"  # the others are back
            info = client.create_session("a red ball", num_blocks=2)
            assert [e.block_index for e in client.events(info.session_id) if isinstance(e, BlockDone)] == [0, 1]
        log = Path(redis_mesh.scheduler.log_path).read_text()
        assert "session not-json: stored record is unreadable" in log
    finally:
        store.delete(corrupt)


def test_without_a_persistent_store_sessions_end_failed_never_completed(tmp_path: Path) -> None:
    mesh = start_mesh(mesh_config(tmp_path / "mesh", workers=1))
    try:
        with Client(mesh.address, api_key=KEY_A, timeout=60) as client:
            # SIGTERM: the session ends as failed, its outputs finalized.
            info = client.create_session("a red ball", num_blocks=BLOCKS)
            events = []
            for event in client.events(info.session_id):
                events.append(event)
                if isinstance(event, BlockDone) and event.block_index == 2 and mesh.scheduler.alive():
                    assert mesh.scheduler.stop() == 0
            final = [e for e in events if isinstance(e, StateChanged)][-1]
            assert final.state == "failed" and "without a persistent store" in final.reason
            done = max(e.block_index for e in events if isinstance(e, BlockDone)) + 1
            assert stream_info(mesh, info.session_id).frames == done * 3 and done < BLOCKS
            mesh.replace(mesh.relaunch(mesh.scheduler).wait())  # type: ignore[union-attr]

            # SIGKILL: the new scheduler closes what workers still run for it and answers for the session.
            info = client.create_session("a red ball", num_blocks=BLOCKS)
            with pytest.raises(grpc.RpcError) as caught:
                for event in client.events(info.session_id):
                    if isinstance(event, BlockDone) and event.block_index == 2 and mesh.scheduler.alive():
                        assert mesh.scheduler.kill() == -9
                        mesh.replace(mesh.relaunch(mesh.scheduler).wait())  # type: ignore[union-attr]
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
            assert "failed: scheduler restarted without a persistent store" in str(caught.value.details())
        token = ((INTERNAL_TOKEN_HEADER, mesh.config.env[INTERNAL_TOKEN_ENV]),)
        with grpc.insecure_channel(mesh.workers[0].address) as channel:
            status = worker_pb2_grpc.WorkerServiceStub(channel).GetStatus(
                worker_pb2.GetStatusRequest(), timeout=10, metadata=token
            )
        assert info.session_id not in status.session_ids  # closed, its recording finalized
        assert stream_info(mesh, info.session_id).frames > 0
    finally:
        mesh.stop()
