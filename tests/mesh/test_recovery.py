"""Workers stopped, killed or frozen mid-session: the session finishes elsewhere, nothing lost or duplicated.

This mesh keeps its state in a real redis-server started by the suite (`--redis-url`).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from inferix.client import BlockDone, Client, PromptChange, StateChanged
from inferix_cli.mesh import Mesh, start_mesh
from inferix_cli.mesh.launch import ServiceProcess
from tests.mesh.conftest import KEY_A, generate_digest, mesh_config, stream_info
from tests.store.redis_server import RedisServer


@pytest.fixture(scope="module")
def redis_mesh(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer) -> Iterator[Mesh]:
    redis_server.flush(db=3)
    running = start_mesh(
        mesh_config(tmp_path_factory.mktemp("redis-mesh"), workers=2, redis_url=redis_server.url(db=3), lookahead=64)
    )
    yield running
    running.stop()


def worker_named(mesh: Mesh, worker_id: str) -> ServiceProcess:
    return next(w for w in mesh.workers if w.name == worker_id)


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_session_survives_its_worker(redis_mesh: Mesh, how: str) -> None:
    schedule = (PromptChange(0, "a red ball"), PromptChange(3, "a green ball"))
    with Client(redis_mesh.address, api_key=KEY_A, timeout=120) as client:
        info = client.create_session(list(schedule), num_blocks=6, seed=11)
        events: list[object] = []
        stopped = ""
        for event in client.events(info.session_id):
            events.append(event)
            if isinstance(event, BlockDone) and event.block_index == 1 and not stopped:
                victim = worker_named(redis_mesh, event.worker_id)
                stopped = victim.name
                code = victim.stop() if how == "sigterm" else victim.kill()
                assert code == (0 if how == "sigterm" else -9), victim.log_tail()
        final = client.get_session(info.session_id)
    blocks = [e for e in events if isinstance(e, BlockDone)]
    assert [b.block_index for b in blocks] == [0, 1, 2, 3, 4, 5]  # every block once, in order
    # block 2 may have been in flight on the stopped worker (a SIGTERM lets it finish); later ones moved
    assert stopped not in {b.worker_id for b in blocks[3:]}
    assert [e.state for e in events if isinstance(e, StateChanged)][-1] == "completed"
    assert final.state == "completed" and final.blocks_done == 6
    streamed = stream_info(redis_mesh, info.session_id)
    assert streamed.frames == 6 * 3  # toyworld: 3 video frames per block
    # the recovered video is bit-identical to an uninterrupted run
    assert streamed.frames_sha256 == generate_digest(schedule, 6, 11)
    redis_mesh.workers.remove(worker_named(redis_mesh, stopped))
    redis_mesh.add_worker(f"{stopped}-replacement")


def test_a_worker_that_stops_answering_loses_its_session_to_another(redis_mesh: Mesh) -> None:
    """SIGSTOP: the worker's socket still accepts, nothing answers. Health probes notice it within
    seconds (not the block deadline), and the session finishes elsewhere, nothing lost or repeated."""
    schedule = (PromptChange(0, "a blue square"),)
    with Client(redis_mesh.address, api_key=KEY_A, timeout=120) as client:
        info = client.create_session(list(schedule), num_blocks=6, seed=12)
        events: list[object] = []
        frozen: ServiceProcess | None = None
        started = time.monotonic()
        for event in client.events(info.session_id):
            events.append(event)
            if isinstance(event, BlockDone) and event.block_index == 1 and frozen is None:
                frozen = worker_named(redis_mesh, event.worker_id)
                os.kill(frozen.pid, signal.SIGSTOP)
        elapsed = time.monotonic() - started
        final = client.get_session(info.session_id)
    assert frozen is not None
    os.kill(frozen.pid, signal.SIGCONT)
    frozen.kill()
    blocks = [e for e in events if isinstance(e, BlockDone)]
    assert [b.block_index for b in blocks] == [0, 1, 2, 3, 4, 5]
    assert frozen.name not in {b.worker_id for b in blocks[3:]}
    assert final.state == "completed" and elapsed < 60
    streamed = stream_info(redis_mesh, info.session_id)
    assert streamed.frames == 6 * 3 and streamed.frames_sha256 == generate_digest(schedule, 6, 12)
    redis_mesh.workers.remove(frozen)
    redis_mesh.add_worker(f"{frozen.name}-replacement")
