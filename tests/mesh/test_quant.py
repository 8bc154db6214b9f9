"""A quantized mesh: workers started with --quant / --kv-dtype make the frames `inferix generate` makes
with the same flags, alone and batched with another session."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from inferix.client import Client, PromptChange, StateChanged
from inferix_cli.mesh import Mesh, start_mesh
from tests.mesh.conftest import KEY_A, generate_digest, mesh_config, stream_info

BLOCKS = 4
SESSIONS = [("a red ball bouncing", 5), ("two blue cubes", 6)]
FLAGS = ("--quant", "int8", "--kv-dtype", "fp8")


@pytest.fixture(scope="module")
def quantized_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    config = mesh_config(tmp_path_factory.mktemp("quant"), workers=1, quant="int8", kv_dtype="fp8", capacity_probe=0)
    running = start_mesh(config)
    yield running
    codes = running.stop()
    assert all(code == 0 for code in codes.values()), codes


def run_session(mesh: Mesh, prompt: str, seed: int) -> str:
    with Client(mesh.address, api_key=KEY_A, timeout=120) as client:
        info = client.create_session(prompt, num_blocks=BLOCKS, seed=seed)
        states = [e.state for e in client.events(info.session_id) if isinstance(e, StateChanged)]
        assert states[-1] == "completed", states
        return info.session_id


def test_quantized_sessions_equal_generate_with_the_same_flags(quantized_worker: Mesh) -> None:
    with ThreadPoolExecutor(len(SESSIONS)) as pool:  # at once: their blocks share batched forwards
        ids = list(pool.map(lambda s: run_session(quantized_worker, *s), SESSIONS))
    for session_id, (prompt, seed) in zip(ids, SESSIONS, strict=True):
        streamed = stream_info(quantized_worker, session_id)
        assert streamed.finished and streamed.frames == BLOCKS * 3
        schedule = (PromptChange(0, prompt),)
        assert streamed.frames_sha256 == generate_digest(schedule, BLOCKS, seed, FLAGS)
        # The flags reached the worker: unquantized frames differ.
        assert streamed.frames_sha256 != generate_digest(schedule, BLOCKS, seed)
