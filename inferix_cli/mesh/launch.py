"""Start service processes and find their ports (used by `inferix serve` and the tests).

A child is started with `--port 0 --port-file F`; it writes F once it listens, so the parent
never races for a port. A fixed port may be given instead (`inferix serve` restarts a service
on the port the others already hold). Children are stopped by pid: SIGTERM (graceful drain),
then SIGKILL.

`launch_service` only starts the process and returns a `StartingService` to poll (the supervisor
of `inferix serve` keeps watching the other children meanwhile); `start_service` waits for it.

A child may be a launcher whose own child serves: a worker pod is `python -m torch.distributed.run
... -m workers`, and its rank 0 writes the port file (with its pid). Such a child is stopped through
the serving process: SIGTERM to rank 0, which drains and releases the other ranks, so every rank
exits 0 and torchrun with them. (SIGTERM to torchrun itself also drains, but torchrun then exits 1
whatever its ranks did.) Its SIGKILL goes to the ranks as well (torchrun starts each rank in a
session of its own, so they would outlive it); the ranks are recorded once the pod serves, so that
ranks left running by a launcher that died (SIGKILL to torchrun) are still found and killed.
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

from inferix.server import PARENT_PID_ENV


class ServiceStartError(RuntimeError):
    pass


def describe_exit(code: int | None) -> str:
    """'exit code 1', 'signal 9' (a Popen return code), or 'running'."""
    if code is None:
        return "running"
    return f"signal {-code}" if code < 0 else f"exit code {code}"


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
    # Everything the port file said, e.g. the streamer's "http" port.
    ports: dict[str, int | None] = field(default_factory=dict)
    # A launcher's children when the service came up, as (pid, start time): killed with the launcher.
    ranks: tuple[tuple[int, int], ...] = ()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def serving(self) -> bool:
        """The process runs and, for a launcher, so does the process that serves (rank 0 of a pod)."""
        if not self.alive():
            return False
        if self.serving_pid is None or not Path("/proc").is_dir():
            return True
        return self._serving_child() is not None and _running(self.serving_pid)

    def stop(self, timeout: float = 15.0, sig: signal.Signals = signal.SIGTERM) -> int:
        """`sig` (to the serving process; a worker hands its sessions over on SIGTERM, not on SIGINT),
        wait up to `timeout`, then SIGKILL. Returns the exit code."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._serving_child() or self.pid, sig)
            try:
                code = self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
            else:
                self._kill_strays()
                return code
        return self.kill()

    def kill(self) -> int:
        """SIGKILL (a launcher's ranks too); also reaps an exited process and kills ranks it left behind."""
        if self.alive():
            if self.serving_pid is not None:  # a launcher: its children (the ranks) first
                for pid in self.children():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            self.process.kill()
        code = self.process.wait()
        self._kill_strays()
        return code

    def children(self) -> list[int]:
        """Pids of the live child processes of this service's process (e.g. the ranks under torchrun).

        Read from /proc; where there is none (macOS), the serving process alone.
        """
        if not Path("/proc").is_dir():
            return [self.serving_pid] if self.serving_pid is not None else []
        return _children_of(self.pid)

    def _serving_child(self) -> int | None:
        """`serving_pid` while it is still a live child of ours (not a recycled pid), else None."""
        if self.serving_pid is None:
            return None
        if not Path("/proc").is_dir():
            return self.serving_pid  # no /proc (macOS): trust the port file
        return self.serving_pid if _parent_pid(self.serving_pid) == self.pid else None

    def _kill_strays(self) -> None:
        """SIGKILL the recorded ranks that still run (the same processes: pid and start time match)."""
        for pid, started in self.ranks:
            if _start_time(pid) == started and _running(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 (state) on, or None when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()  # after the parenthesised command name


def _parent_pid(pid: int) -> int | None:
    """The parent of `pid` from /proc/PID/stat (None when it is gone)."""
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None  # field 4


def _start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks after boot; field 22), to tell it from a recycled pid."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def _running(pid: int) -> bool:
    """`pid` exists and is not a zombie."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def _children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _parent_pid(int(entry.name)) == pid:
            found.append(int(entry.name))
    return sorted(found)


@dataclass
class StartingService:
    """A service process that was started and has not written its port file yet."""

    name: str
    process: subprocess.Popen[bytes]
    port_file: Path
    log_path: Path
    timeout: float
    deadline: float
    timed_out: bool = False  # it did not listen within `timeout` and was killed
    host: str = "127.0.0.1"  # the address it binds

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> ServiceProcess | None:
        """The service once it listens, None while it starts; ServiceStartError when it exited or timed out."""
        if self.port_file.is_file():
            ports = json.loads(self.port_file.read_text())
            pid = ports.get("pid")
            serving = int(pid) if pid is not None and int(pid) != self.process.pid else None
            ranks: tuple[tuple[int, int], ...] = ()
            if serving is not None and Path("/proc").is_dir():
                found = ((child, _start_time(child)) for child in _children_of(self.process.pid))
                ranks = tuple((child, started) for child, started in found if started is not None)
            return ServiceProcess(
                self.name,
                self.process,
                int(ports["grpc"]),
                ports.get("metrics"),
                self.log_path,
                host=self.host,
                serving_pid=serving,
                ports=ports,
                ranks=ranks,
            )
        if self.process.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise ServiceStartError(f"{self.name} exited with code {self.process.returncode} before listening:\n{tail}")
        if time.monotonic() > self.deadline:
            self.timed_out = True
            self.kill()
            raise ServiceStartError(
                f"{self.name} did not start listening within {self.timeout:.0f}s (log: {self.log_path})"
            )
        return None

    def wait(self) -> ServiceProcess:
        """Block until the service listens (or raise ServiceStartError); interrupted, it kills the process."""
        try:
            while True:
                service = self.poll()
                if service is not None:
                    return service
                time.sleep(0.05)
        except BaseException:
            self.kill()
            raise

    def kill(self) -> int:
        """SIGKILL the process and its children (the ranks of a launcher). Returns the exit code."""
        if self.process.poll() is None:
            for pid in _children_of(self.process.pid) if Path("/proc").is_dir() else []:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.process.kill()
        return self.process.wait()

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, wait up to `timeout`, then SIGKILL. Returns the exit code."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                return self.process.wait(timeout)
        return self.kill()


def launch_service(
    name: str,
    module: str,
    args: list[str],
    workdir: Path,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
    metrics: bool = False,
    port: int = 0,
    metrics_port: int = 0,
    append_log: bool = False,
    host: str = "127.0.0.1",
) -> StartingService:
    """Start `python -m module args --host HOST --port PORT --port-file ...` (0 = any port) without waiting
    for it.

    Its output goes to `workdir/<name>.log`: a new file, or appended to (`append_log`, a restart:
    the previous run's output stays readable).
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
        host,
        "--port",
        str(port),
        "--port-file",
        str(port_file),
    ]
    if metrics:
        cmd += ["--metrics-port", str(metrics_port)]
    with log_path.open("ab" if append_log else "wb") as log:
        # The service stops once this process is gone (inferix/server.py), even if it is SIGKILLed.
        environ = {**os.environ, PARENT_PID_ENV: str(os.getpid()), **(env or {})}
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=environ, start_new_session=True)
    return StartingService(name, process, port_file, log_path, timeout, time.monotonic() + timeout, host=host)


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
    return launch_service(name, module, args, workdir, env=env, timeout=timeout, metrics=metrics, port=port).wait()
