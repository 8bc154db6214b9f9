"""Keep the children of `inferix serve` running: restart with exponential backoff, stop on a crash loop.

`Supervisor` polls the mesh's children (kvcache_svc, streamer, workers, scheduler, nginx RTMP). A
child that exits without being asked to (any exit code, any signal; for a worker pod, also rank 0
exiting while torchrun lingers) is started again by `Mesh.relaunch`, where the others expect it (same
ports, same worker id), after a backoff that doubles with each recent restart of that child:

    delay = min(backoff_cap_s, backoff_base_s * 2 ** restarts_within_window)

so 0.5 s, 1 s, 2 s, 4 s, ... by default, back to 0.5 s once the child has stayed up for a window.
A child that exits again after `crash_loop_restarts` restarts within `crash_loop_window_s` is in a
crash loop: `run` returns a `CrashLoop` naming it and its log, and the caller stops the mesh.
A restart that fails (the process exits before it listens, or never listens) counts as an exit.

A worker sent SIGTERM on its own (`kill <pid>`: a scale-in or rolling update by hand) drains: it
commits its blocks in flight, the scheduler moves its sessions to the other workers, and it exits 0.
That exit is restarted like any other, with the same backoff and crash-loop count, as Kubernetes
brings a deleted StatefulSet pod back: the new process registers under the same worker id, which
clears its departure, and takes sessions again. Only `request_stop` / `stop` end a child for good.

The restart is opt-in: `start_mesh` alone restarts nothing (the tests kill and replace workers
themselves). While stopping (`request_stop`, e.g. from a signal handler) nothing is restarted, and
`stop` ends the restarts in progress along with every child, in the mesh's stop order.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from inferix_cli.mesh.launch import ServiceProcess, ServiceStartError, StartingService, describe_exit

ENV_BACKOFF_BASE = "INFERIX_SERVE_BACKOFF_S"
ENV_BACKOFF_CAP = "INFERIX_SERVE_BACKOFF_MAX_S"
ENV_CRASH_LOOP_RESTARTS = "INFERIX_SERVE_CRASH_LOOP_RESTARTS"
ENV_CRASH_LOOP_WINDOW = "INFERIX_SERVE_CRASH_LOOP_WINDOW_S"


@dataclass(frozen=True)
class RestartPolicy:
    """When to restart an exited child, and when to give up (a crash loop)."""

    backoff_base_s: float = 0.5  # the delay of a first restart
    backoff_cap_s: float = 30.0  # doubling stops here
    # Restarts within the window after which one more exit stops the mesh (0: never restart).
    crash_loop_restarts: int = 5
    crash_loop_window_s: float = 60.0

    def __post_init__(self) -> None:
        if self.backoff_base_s < 0:
            raise ValueError(f"backoff base must be >= 0 s, got {self.backoff_base_s}")
        if self.backoff_cap_s < self.backoff_base_s:
            raise ValueError(f"backoff cap ({self.backoff_cap_s} s) must be >= its base ({self.backoff_base_s} s)")
        if self.crash_loop_restarts < 0:
            raise ValueError(f"crash-loop restarts must be >= 0, got {self.crash_loop_restarts}")
        if self.crash_loop_window_s <= 0:
            raise ValueError(f"crash-loop window must be > 0 s, got {self.crash_loop_window_s}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RestartPolicy:
        """The defaults, overridden by INFERIX_SERVE_BACKOFF_S, INFERIX_SERVE_BACKOFF_MAX_S,
        INFERIX_SERVE_CRASH_LOOP_RESTARTS and INFERIX_SERVE_CRASH_LOOP_WINDOW_S. Raises ValueError."""
        env = os.environ if environ is None else environ
        default = cls()

        def number(name: str, fallback: float, kind: type[float] | type[int]) -> float:
            value = env.get(name, "").strip()
            if not value:
                return fallback
            try:
                return kind(value)
            except ValueError:
                raise ValueError(f"{name}={value!r} is not {'an integer' if kind is int else 'a number'}") from None

        return cls(
            backoff_base_s=number(ENV_BACKOFF_BASE, default.backoff_base_s, float),
            backoff_cap_s=number(ENV_BACKOFF_CAP, default.backoff_cap_s, float),
            crash_loop_restarts=int(number(ENV_CRASH_LOOP_RESTARTS, default.crash_loop_restarts, int)),
            crash_loop_window_s=number(ENV_CRASH_LOOP_WINDOW, default.crash_loop_window_s, float),
        )

    def delay(self, recent_restarts: int) -> float:
        """Seconds to wait before a restart when the child was restarted `recent_restarts` times within the window."""
        return float(min(self.backoff_cap_s, self.backoff_base_s * 2.0 ** min(recent_restarts, 64)))


@dataclass
class RestartHistory:
    """The restarts of one child (monotonic seconds)."""

    times: list[float] = field(default_factory=list)
    total: int = 0

    def recent(self, now: float, window_s: float) -> int:
        """Restarts within the last `window_s` seconds."""
        return sum(1 for t in self.times if now - t < window_s)

    def on_exit(self, policy: RestartPolicy, now: float) -> float | None:
        """The child exited at `now`: the delay before restarting it (the restart is recorded), or None
        when it is in a crash loop (`policy.crash_loop_restarts` restarts within the window already)."""
        recent = self.recent(now, policy.crash_loop_window_s)
        if recent >= policy.crash_loop_restarts:
            return None
        self.times = [t for t in self.times if now - t < policy.crash_loop_window_s] + [now]
        self.total += 1
        return policy.delay(recent)


@dataclass(frozen=True)
class CrashLoop:
    """A child that kept exiting: the mesh must stop."""

    name: str
    last_exit: str
    restarts: int
    window_s: float
    log_path: Path

    def message(self) -> str:
        return (
            f"{self.name} exited ({self.last_exit}) after {self.restarts} restart(s) within {self.window_s:g}s: "
            f"crash loop, stopping; its log: {self.log_path}"
        )


class Children(Protocol):
    """What the supervisor needs of a mesh (inferix_cli.mesh.Mesh)."""

    def children(self) -> list[ServiceProcess]: ...

    def relaunch(self, child: ServiceProcess) -> StartingService | ServiceProcess: ...

    def replace(self, child: ServiceProcess) -> None: ...

    def stop_signal(self, child: ServiceProcess) -> signal.Signals: ...


class Supervisor:
    def __init__(self, mesh: Children, policy: RestartPolicy | None = None) -> None:
        self.mesh = mesh
        self.policy = policy or RestartPolicy()
        self.history: dict[str, RestartHistory] = {}
        self._due: dict[str, float] = {}  # name -> when to restart it (waiting out its backoff)
        self._starting: dict[str, StartingService] = {}  # name -> its restart, not listening yet
        self._stopping = False

    @property
    def stopping(self) -> bool:
        return self._stopping

    def request_stop(self) -> None:
        """Restart nothing from now on (safe to call from a signal handler); `run` returns soon."""
        self._stopping = True

    def run(self, interval_s: float = 0.2) -> CrashLoop | None:
        """Poll until `request_stop` (None) or a crash loop (returned). Stopping the mesh is the caller's."""
        while not self._stopping:
            crash_loop = self.poll()
            if crash_loop is not None:
                return crash_loop
            time.sleep(interval_s)
        return None

    def restarting(self) -> list[str]:
        """Children that exited and are not back yet."""
        return sorted({*self._due, *self._starting})

    def poll(self) -> CrashLoop | None:
        """One look at every child: notice exits, start the restarts that are due, adopt those that listen."""
        for child in self.mesh.children():
            if self._stopping:
                return None
            name = child.name
            if name in self._starting:
                crash_loop = self._check_start(child)
            elif name in self._due:
                crash_loop = self._relaunch(child) if time.monotonic() >= self._due[name] else None
            elif not child.serving():
                crash_loop = self._exited(child, self._describe(child))
            else:
                crash_loop = None
            if crash_loop is not None:
                return crash_loop
        return None

    def stop(self) -> dict[str, int]:
        """Stop everything in the mesh's order (restarts in progress included); returns exit codes by name."""
        self._stopping = True
        codes: dict[str, int] = {}
        for child in self.mesh.children():
            starting = self._starting.pop(child.name, None)
            if starting is not None:
                child.kill()  # exited already: reap it
                codes[child.name] = starting.stop()
            else:
                codes[child.name] = child.stop(sig=self.mesh.stop_signal(child))
        self._due.clear()
        return codes

    # ---- internals ----------------------------------------------------------------------------
    @staticmethod
    def _describe(child: ServiceProcess) -> str:
        """How `child` (not serving any more) exited; whatever is left of a worker pod is killed now."""
        if child.alive():  # a launcher (torchrun) whose serving process (rank 0) is gone: the pod restarts whole
            child.kill()
            return "rank 0 exited; rest of the pod killed"
        child.kill()  # reap it; the ranks of a launcher that was killed outlive it: kill them
        return describe_exit(child.process.returncode)

    def _exited(self, child: ServiceProcess, how: str) -> CrashLoop | None:
        name = child.name
        history = self.history.setdefault(name, RestartHistory())
        now = time.monotonic()
        delay = history.on_exit(self.policy, now)
        if delay is None:
            restarts = history.recent(now, self.policy.crash_loop_window_s)
            self._mark_log(child.log_path, f"{name} exited ({how}): crash loop, not restarted")
            return CrashLoop(name, how, restarts, self.policy.crash_loop_window_s, child.log_path)
        self._due[name] = now + delay
        line = f"{name} exited ({how}); restarting in {delay:g}s (restart {history.total})"
        self._mark_log(child.log_path, line)
        print(line, flush=True)
        return None

    def _relaunch(self, child: ServiceProcess) -> CrashLoop | None:
        del self._due[child.name]
        try:
            started = self.mesh.relaunch(child)
        except Exception as exc:  # e.g. nginx did not come back, or no process could be started
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return self._exited(child, f"restart failed: {first}")
        if isinstance(started, ServiceProcess):
            self._adopt(started)
        else:
            self._starting[child.name] = started
        return None

    def _check_start(self, child: ServiceProcess) -> CrashLoop | None:
        starting = self._starting[child.name]
        try:
            service = starting.poll()
        except ServiceStartError:
            del self._starting[child.name]
            if starting.timed_out:
                how = f"did not listen within {starting.timeout:g}s"
            else:
                how = f"{describe_exit(starting.process.returncode)} before listening"
            return self._exited(child, how)
        if service is not None:
            del self._starting[child.name]
            self._adopt(service)
        return None

    def _adopt(self, service: ServiceProcess) -> None:
        self.mesh.replace(service)
        pid = service.serving_pid or service.pid
        print(f"{service.name} restarted: {service.address} (pid {pid})", flush=True)

    @staticmethod
    def _mark_log(log_path: Path, line: str) -> None:
        """A line in the child's own log, between the output of its runs."""
        try:
            with log_path.open("a") as log:
                log.write(f"\n--- inferix serve {time.strftime('%Y-%m-%d %H:%M:%S')}: {line} ---\n")
        except OSError:
            pass
