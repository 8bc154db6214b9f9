"""A whole mesh of real processes (kvcache_svc, streamer, workers, scheduler) on 127.0.0.1."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import grpc
import pytest

from inferix.api.v1 import streamer_pb2, streamer_pb2_grpc
from inferix.client import Client, PromptChange
from inferix_cli.mesh import Mesh, MeshConfig, start_mesh
from tests.otlp import SpanCollector

KEY_A = "key-a-0123456789abcdef"
KEY_B = "key-b-0123456789abcdef"


@pytest.fixture(scope="session")
def collector() -> Iterator[SpanCollector]:
    spans = SpanCollector().start()
    yield spans
    spans.stop()


def mesh_config(workdir: Path, **kwargs: object) -> MeshConfig:
    keys = workdir / "api-keys"
    workdir.mkdir(parents=True, exist_ok=True)
    keys.write_text(f"{KEY_A} alice\n{KEY_B} bob\n")
    # One torch thread per worker: the same numerics as `generate --threads 1` and no oversubscription.
    kwargs.setdefault("worker_threads", 1)
    # Place sessions by KV pages, whatever this machine's speed: a worker of a slow or busy CI box
    # measures less than one real-time stream and would take one session at a time. Real-time
    # admission is tested on its own (tests/mesh/test_batching.py, tests/kvcache_svc).
    kwargs.setdefault("realtime_streams", 64)
    return MeshConfig(workdir=workdir, api_keys_file=keys, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def mesh(tmp_path_factory: pytest.TempPathFactory, collector: SpanCollector) -> Iterator[Mesh]:
    running = start_mesh(mesh_config(tmp_path_factory.mktemp("mesh"), workers=2, env=collector.env))
    yield running
    codes = running.stop()
    assert all(code == 0 for code in codes.values()), codes


@pytest.fixture
def client(mesh: Mesh) -> Iterator[Client]:
    with Client(mesh.address, api_key=KEY_A, timeout=60) as c:
        yield c


def kill_worker(mesh: Mesh, worker_id: str) -> str:
    """SIGKILL the worker `worker_id` (the one running a session, from its BlockDone); its name."""
    victim = next(w for w in mesh.workers if w.name == worker_id)
    assert victim.kill() == -9, victim.log_tail()
    return victim.name


def replace_worker(mesh: Mesh, name: str) -> None:
    """Drop the killed worker `name` from the mesh and start a fresh one in its place."""
    mesh.workers.remove(next(w for w in mesh.workers if w.name == name))
    mesh.add_worker(f"{name}-replacement")


def stream_info(mesh: Mesh, session_id: str) -> streamer_pb2.GetStreamInfoResponse:
    with grpc.insecure_channel(mesh.streamer.address) as channel:
        stub = streamer_pb2_grpc.StreamerServiceStub(channel)
        return stub.GetStreamInfo(streamer_pb2.GetStreamInfoRequest(session_id=session_id), timeout=30)


@cache
def generate_digest(schedule: tuple[PromptChange, ...], blocks: int, seed: int, extra: tuple[str, ...] = ()) -> str:
    """sha256 of the raw frames `inferix generate` makes for this session (run as a real CLI, with ``extra``
    arguments such as ``--quant int8``)."""
    args = ["--prompt", schedule[0].text]
    for change in schedule[1:]:
        args += ["--prompt-at", f"{change.at_block}:{change.text}"]
    out = Path(f"/tmp/inferix-generate-{seed}-{blocks}-{abs(hash((schedule, extra)))}.mp4")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "inferix_cli",
            "generate",
            *args,
            "--blocks",
            str(blocks),
            "--seed",
            str(seed),
            "--threads",
            "1",
            "--quiet",
            *extra,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out.unlink(missing_ok=True)
    assert result.returncode == 0, result.stderr
    match = re.search(r"frames sha256 ([0-9a-f]{64})", result.stdout)
    assert match, result.stdout
    return match.group(1)


def generate_digests(runs: Sequence[tuple[tuple[PromptChange, ...], int, int]]) -> list[str]:
    """`generate_digest` of each (schedule, blocks, seed), two CLI runs at a time: each is one thread, so two
    side by side halve the wait on a 2-core machine."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda run: generate_digest(*run), runs))
