"""Start service processes and find their ports (used by `inferix serve` and the tests).

A child is started with `--port 0 --port-file F`; it writes F once it listens, so the parent
never races for a port. Children are stopped by pid: SIGTERM (graceful drain), then SIGKILL.

A child may be a launcher whose own child serves: a worker pod is `python -m torch.distributed.run
... -m workers`, and its rank 0 writes the port file (with its pid). Such a child is stopped through
the serving process: SIGTERM to rank 0, which drains and releases the other ranks, so every rank
exits 0 and torchrun with them. (SIGTERM to torchrun itself also drains, but torchrun then exits 1
whatever its ranks did.) Its SIGKILL goes to the ranks as well (torchrun starts each rank in a
session of its own, so they would outlive it).
"""

from __future__ import annotations

import contextlib
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
    # The process that serves, when it is not `process` itself but its child (rank 0 of a torchrun pod).
    serving_pid: int | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM (to the serving process), wait up to `timeout`, then SIGKILL. Returns the exit code."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._serving_child() or self.pid, signal.SIGTERM)
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        return self.kill()

    def kill(self) -> int:
        if self.alive():
            if self.serving_pid is not None:  # a launcher: its children (the ranks) first
                for pid in self.children():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            self.process.kill()
        return self.process.wait()

    def children(self) -> list[int]:
        """Pids of the live child processes of this service's process (e.g. the ranks under torchrun).

        Read from /proc; where there is none (macOS), the serving process alone.
        """
        proc = Path("/proc")
        if not proc.is_dir():
            return [self.serving_pid] if self.serving_pid is not None else []
        found = []
        for entry in proc.iterdir():
            if entry.name.isdigit() and _parent_pid(int(entry.name)) == self.pid:
                found.append(int(entry.name))
        return sorted(found)

    def _serving_child(self) -> int | None:
        """`serving_pid` while it is still a live child of ours (not a recycled pid), else None."""
        if self.serving_pid is None:
            return None
        if not Path("/proc").is_dir():
            return self.serving_pid  # no /proc (macOS): trust the port file
        return self.serving_pid if _parent_pid(self.serving_pid) == self.pid else None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _parent_pid(pid: int) -> int | None:
    """The parent of `pid` from /proc/PID/stat (None when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # field 4, after the parenthesised command name


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
    """Run `python -m module args --port PORT --port-file ...` and wait until it listens (0 = any port).

    `module` may be a launcher of the service, e.g. "torch.distributed.run" with args "... -m workers ...".
    """
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
            pid = ports.get("pid")
            serving = int(pid) if pid is not None and int(pid) != process.pid else None
            return ServiceProcess(
                name, process, int(ports["grpc"]), ports.get("metrics"), log_path, serving_pid=serving
            )
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise ServiceStartError(f"{name} exited with code {process.returncode} before listening:\n{tail}")
        time.sleep(0.05)
    process.kill()
    raise ServiceStartError(f"{name} did not start listening within {timeout:.0f}s (log: {log_path})")
