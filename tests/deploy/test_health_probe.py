"""`python -m inferix.health`, the HEALTHCHECK of the images, against a real service process."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferix.health import check
from inferix_cli.mesh.launch import ServiceProcess, start_service

KVCACHE_SERVICE = "inferix.v1.KVCacheService"


@pytest.fixture(scope="module")
def kvcache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    process = start_service("kvcache", "kvcache_svc", [], tmp_path_factory.mktemp("health"))
    yield process
    process.stop()


def probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inferix.health", *args], capture_output=True, text=True, timeout=30)


def test_serving_service_is_healthy(kvcache: ServiceProcess) -> None:
    result = probe(kvcache.address)  # exactly what the Dockerfiles' HEALTHCHECK runs
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{kvcache.address}: SERVING"
    assert check(kvcache.address, KVCACHE_SERVICE) == (True, "SERVING")


def test_unknown_service_is_unhealthy(kvcache: ServiceProcess) -> None:
    result = probe(kvcache.address, "inferix.v1.NoSuchService")
    assert result.returncode == 1
    assert "NOT_FOUND" in result.stderr


def test_nothing_listening_is_unhealthy(tmp_path: Path) -> None:
    process = start_service("kvcache", "kvcache_svc", [], tmp_path)
    address = process.address
    assert check(address)[0]
    process.stop()
    serving, status = check(address, timeout=2.0)
    assert not serving and status.startswith("UNAVAILABLE"), status
    assert probe(address, "--timeout", "2").returncode == 1
