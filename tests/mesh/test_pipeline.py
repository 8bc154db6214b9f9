"""The worker as a pipeline: a session's next block waits at the worker while the current one is made.

Three toyworld sessions with a lookahead of their length (nothing holds them back) on one worker:
the scheduler sends each block after the first while the block before it is still in flight, so
no block waits for a scheduler round trip (the worker's `dispatch` stage is zero for them), the
sessions' blocks meet in the worker's forwards, and every session's frames are still exactly
`inferix generate`'s. A prompt change in the schedule is not sent ahead: the block before it could
be re-run after a failure and must keep its own prompt.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from inferix.client import BlockDone, Client, PromptChange, StateChanged
from inferix_cli.mesh import Mesh, start_mesh
from tests.mesh.conftest import KEY_A, generate_digests, mesh_config, stream_info

BLOCKS = 8
SCHEDULES = [
    (PromptChange(0, "a red ball bouncing"),),
    (PromptChange(0, "a blue ball rolling"),),
    (PromptChange(0, "a ball number 7"), PromptChange(4, "a ball number 9")),
]


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    running = start_mesh(mesh_config(tmp_path_factory.mktemp("pipeline"), workers=1, capacity_probe=0))
    yield running
    codes = running.stop()
    assert all(code == 0 for code in codes.values()), codes


def stage_counts(mesh: Mesh, stage: str) -> dict[str, float]:
    """The worker's `inferix_worker_block_stage_seconds` buckets of one stage (le -> count)."""
    port = mesh.workers[0].metrics_port
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    pattern = rf'^inferix_worker_block_stage_seconds_bucket{{le="([^"]+)",stage="{stage}"}} (\S+)$'
    return {m[1]: float(m[2]) for m in re.finditer(pattern, text, re.M)}


def run_session(mesh: Mesh, schedule: tuple[PromptChange, ...], seed: int) -> str:
    with Client(mesh.address, api_key=KEY_A, timeout=300) as client:
        info = client.create_session(list(schedule), num_blocks=BLOCKS, seed=seed, lookahead=BLOCKS)
        blocks, states = [], []
        for event in client.events(info.session_id):
            if isinstance(event, BlockDone):
                blocks.append(event.block_index)
            elif isinstance(event, StateChanged):
                states.append(event.state)
        assert states[-1] == "completed", states
        assert blocks == list(range(BLOCKS)), blocks  # every block once, in order
        return info.session_id


def test_next_blocks_wait_at_the_worker_and_frames_equal_generate(one_worker: Mesh) -> None:
    with ThreadPoolExecutor(len(SCHEDULES)) as pool:
        futures = [pool.submit(run_session, one_worker, schedule, 20 + i) for i, schedule in enumerate(SCHEDULES)]
        session_ids = [f.result(timeout=600) for f in futures]

    expected = generate_digests([(schedule, BLOCKS, 20 + i) for i, schedule in enumerate(SCHEDULES)])
    for session_id, digest in zip(session_ids, expected, strict=True):
        streamed = stream_info(one_worker, session_id)
        assert streamed.finished and streamed.frames == BLOCKS * 3
        assert streamed.frames_sha256 == digest

    # Every block but a session's first two (the first is not sent ahead; the second is sent on the first's
    # answer) and the one with the prompt change was at the worker before the block before it was answered.
    dispatch = stage_counts(one_worker, "dispatch")
    ahead = dispatch["0.001"]
    expected = len(SCHEDULES) * (BLOCKS - 2) - 1
    assert ahead >= expected, dispatch
    # Every block's frames were handed out to publishing before its job ended (before its context pass).
    assert stage_counts(one_worker, "frames")["+Inf"] == len(SCHEDULES) * BLOCKS
