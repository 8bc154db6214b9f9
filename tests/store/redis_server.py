"""A real `redis-server` for the test suite, started once per session and stopped by pid.

Reuse from any test folder by importing the fixture into that folder's conftest.py:

    from tests.store.redis_server import redis_server  # noqa: F401

then ask for `redis_server` (a `RedisServer`): `redis_server.url(db)` for a client URL,
`redis_server.flush(db)` to start a test from an empty database. The server runs in a temp dir,
binds 127.0.0.1 on a free port, persists nothing, and is stopped (SIGTERM, then SIGKILL) by its
pid when the session ends. A missing binary fails the tests with the install command: the
Redis backend is part of the product, so its tests never skip.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

START_TIMEOUT_S = 10.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _commands(port: int, commands: list[str], timeout: float = 2.0) -> list[bytes]:
    """Send inline commands over a raw socket and return one reply line each (no client
    library: the fixture must not depend on the code under test)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall("".join(f"{command}\r\n" for command in commands).encode())
        data = b""
        while data.count(b"\r\n") < len(commands):
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    return data.split(b"\r\n")[: len(commands)]


@dataclass
class RedisServer:
    process: subprocess.Popen[bytes]
    port: int
    workdir: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def flush(self, db: int = 0) -> None:
        """Empty database `db` (tests share the server, not the data)."""
        replies = _commands(self.port, [f"SELECT {db}", "FLUSHDB"])
        if replies != [b"+OK", b"+OK"]:
            raise RuntimeError(f"FLUSHDB of db {db} on redis-server pid {self.pid} failed: {replies!r}")

    def log_tail(self) -> str:
        log = self.workdir / "redis.log"
        return log.read_text(errors="replace")[-2000:] if log.is_file() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_redis_server(workdir: Path, port: int | None = None, persistent: bool = False) -> RedisServer:
    """Start redis-server on 127.0.0.1 (a free port unless given) and wait until it answers PING.

    `persistent` writes every command to an append-only file in `workdir`, so a server restarted
    on the same folder comes back with all the data.
    """
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail(
            "redis-server is not installed, and the Redis store tests need a real one: "
            "run `apt-get install -y redis-server` (Debian/Ubuntu) or `brew install redis`, then rerun.",
            pytrace=False,
        )
    last_error = ""
    persistence = ["--appendonly", "yes", "--appendfsync", "always"] if persistent else ["--appendonly", "no"]
    fixed_port = port
    for _ in range(3):  # the port was free when picked; another process may take it before Redis binds
        port = fixed_port or _free_port()
        process = subprocess.Popen(
            [
                binary,
                "--bind", "127.0.0.1",
                "--port", str(port),
                "--dir", str(workdir),
                "--logfile", str(workdir / "redis.log"),
                "--save", "",
                *persistence,
                "--daemonize", "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        server = RedisServer(process, port, workdir)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if _commands(port, ["PING"], timeout=1.0) == [b"+PONG"]:
                    return server
            except OSError as exc:
                last_error = str(exc)
            time.sleep(0.05)
        last_error = f"{last_error}\n{server.log_tail()}"
        server.stop()
    pytest.fail(f"redis-server did not start on 127.0.0.1:\n{last_error}", pytrace=False)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for the whole test session."""
    with tempfile.TemporaryDirectory(prefix="inferix-redis-") as tmp:
        server = start_redis_server(Path(tmp))
        try:
            yield server
        finally:
            server.stop()
