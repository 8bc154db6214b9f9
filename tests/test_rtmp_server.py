"""The local nginx RTMP relay starts from a relative work directory (as `make demo` passes one)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from inferix_cli.mesh.rtmp_relay import start_nginx_rtmp


def test_nginx_rtmp_starts_from_a_relative_workdir(tmp_path: Path) -> None:
    cwd = Path.cwd()
    os.chdir(tmp_path)
    try:
        server = start_nginx_rtmp(Path("out/serve"))
    finally:
        os.chdir(cwd)
    try:
        assert (tmp_path / "out/serve/rtmp").is_dir()
        with socket.create_connection(("127.0.0.1", server.port), timeout=5):
            pass  # accepts RTMP connections
    finally:
        server.stop()
