"""Fixtures: a real `python -m streamer` process and gRPC stubs to it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from inferix.api.v1 import streamer_pb2_grpc
from inferix.server import MAX_MESSAGE_BYTES
from inferix_cli.mesh.launch import ServiceProcess, start_service
from tests.streamer.media import ffprobe_path


@pytest.fixture(scope="session", autouse=True)
def _ffprobe_installed() -> None:
    try:
        ffprobe_path()
    except RuntimeError as exc:
        pytest.fail(str(exc))


def start_streamer(workdir: Path, env: dict[str, str] | None = None) -> ServiceProcess:
    """`python -m streamer` writing its recordings to `workdir/recordings`, with metrics on."""
    args = ["--data-dir", str(workdir / "recordings")]
    return start_service("streamer", "streamer", args, workdir=workdir, env=env, metrics=True)


@pytest.fixture(scope="module")
def streamer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """One streamer process shared by a test module; it must exit 0 on SIGTERM afterwards."""
    process = start_streamer(tmp_path_factory.mktemp("streamer"))
    yield process
    code = process.stop()
    assert code == 0, f"streamer exited with {code} on SIGTERM:\n{process.log_tail()}"


@pytest.fixture(scope="module")
def channel(streamer: ServiceProcess) -> Iterator[grpc.Channel]:
    options = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
    with grpc.insecure_channel(streamer.address, options=options) as chan:
        grpc.channel_ready_future(chan).result(timeout=10)
        yield chan


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> streamer_pb2_grpc.StreamerServiceStub:
    return streamer_pb2_grpc.StreamerServiceStub(channel)
