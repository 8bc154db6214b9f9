"""Start service processes and find their ports (used by `inferix serve` and the tests).

A child is started with `--port 0 --port-file F`; it writes F once it listens, so the parent
never races for a port. Children are stopped by pid: SIGTERM (graceful drain), then SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


class ServiceStartError(RuntimeError):
    pass


@dataclass
class ServiceProcess:
    name: str
    process: subprocess.Popen[bytes]
    port: int
    metrics_port: int | None
    log_path: Path
    host: str = "127.0.0.1"
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, wait up to `timeout`, then SIGKILL. Returns the exit code."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        return self.kill()

    def kill(self) -> int:
        if self.alive():
            self.process.kill()
        return self.process.wait()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def start_service(
    name: str,
    module: str,
    args: list[str],
    workdir: Path,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
    metrics: bool = False,
    port: int = 0,
) -> ServiceProcess:
    """Run `python -m module args --port PORT --port-file ...` and wait until it listens (0 = any port)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port_file = workdir / f"{name}.port.json"
    port_file.unlink(missing_ok=True)
    log_path = workdir / f"{name}.log"
    cmd = [
        sys.executable,
        "-m",
        module,
        *args,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--port-file",
        str(port_file),
    ]
    if metrics:
        cmd += ["--metrics-port", "0"]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, start_new_session=True
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_file.is_file():
            ports = json.loads(port_file.read_text())
            return ServiceProcess(name, process, int(ports["grpc"]), ports.get("metrics"), log_path)
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise ServiceStartError(f"{name} exited with code {process.returncode} before listening:\n{tail}")
        time.sleep(0.05)
    process.kill()
    raise ServiceStartError(f"{name} did not start listening within {timeout:.0f}s (log: {log_path})")
