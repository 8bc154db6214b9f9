"""Starting a mesh: services that do not need each other start side by side, and a service that cannot
start takes down everything started or starting beside it (no process is left behind)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from inferix_cli.mesh import start_mesh
from inferix_cli.mesh.launch import ServiceStartError
from tests.mesh.conftest import mesh_config
from tests.mesh.test_supervisor import descendants


def test_a_streamer_that_cannot_start_stops_the_services_started_beside_it(tmp_path: Path) -> None:
    before = set(descendants(os.getpid()))
    with socket.socket() as taken:  # the streamer's HTTP port is in use: it exits before listening
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = mesh_config(tmp_path, workers=2, http_port=taken.getsockname()[1], capacity_probe=0, rtmp="off")
        with pytest.raises(ServiceStartError, match="streamer exited"):
            start_mesh(config)
    # kvcache_svc had started and both workers were starting beside the streamer: all are gone
    assert (tmp_path / "kvcache.port.json").is_file()
    assert (tmp_path / "worker0.log").is_file() and (tmp_path / "worker1.log").is_file()
    assert set(descendants(os.getpid())) <= before
