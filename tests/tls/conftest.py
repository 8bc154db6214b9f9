"""Real TLS for the scheduler's client port: a throwaway PKI, a lone TLS scheduler, and a TLS mesh."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from inferix_cli.mesh import Mesh, start_mesh
from inferix_cli.mesh.launch import ServiceProcess, launch_service
from tests.mesh.conftest import mesh_config
from tests.tls.certs import Authority

Completed = subprocess.CompletedProcess[str]


@dataclass(frozen=True)
class Pki:
    """A CA and what it signed, plus a CA that signed nothing of ours."""

    folder: Path
    ca: Authority
    other_ca: Authority
    cert: Path  # for 127.0.0.1 and localhost
    key: Path

    def issue(self, name: str, **kwargs: object) -> tuple[Path, Path]:
        return self.ca.issue(self.folder, name, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca = Authority.create(folder, "ca")
    cert, key = ca.issue(folder, "server")
    return Pki(folder, ca, Authority.create(folder, "other-ca"), cert, key)


def _closed_port() -> int:
    """A port nothing listens on (the lone scheduler's kvcache_svc and streamer: never reached)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_tls_scheduler(workdir: Path, cert: Path, key: Path) -> ServiceProcess:
    """`python -m scheduler` alone with TLS on an OS-chosen port (its own calls to the mesh just fail)."""
    nowhere = f"127.0.0.1:{_closed_port()}"
    args = ["--kvcache", nowhere, "--streamer", nowhere, "--tls-cert", str(cert), "--tls-key", str(key)]
    return launch_service("scheduler", "scheduler", args, workdir, timeout=60).wait()


@pytest.fixture(scope="module")
def tls_scheduler(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    scheduler = start_tls_scheduler(tmp_path_factory.mktemp("scheduler"), pki.cert, pki.key)
    yield scheduler
    assert scheduler.stop() == 0


@pytest.fixture(scope="module")
def tls_mesh(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    config = mesh_config(
        tmp_path_factory.mktemp("tls-mesh"), workers=1, capacity_probe=0, rtmp="off", tls_cert=pki.cert, tls_key=pki.key
    )
    mesh = start_mesh(config)
    yield mesh
    codes = mesh.stop()
    assert all(code == 0 for code in codes.values()), codes


def inferix_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> Completed:
    """`python -m inferix_cli ARGS` as a user runs it (INFERIX_* from the test's environment removed)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("INFERIX_")}
    return subprocess.run(
        [sys.executable, "-m", "inferix_cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**clean, **(env or {})},
    )
