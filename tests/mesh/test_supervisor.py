"""`inferix serve` supervises its services: the real CLI as a subprocess, real services killed by pid.

- a worker SIGKILLed mid-session is restarted under its worker id (registered again with kvcache_svc
  within 30 s) while its session finishes on the other worker, every block once, frames bit-identical
  to `inferix generate`;
- a service that cannot start again is a crash loop: serve stops with one error line naming it and its
  log, exit code 1;
- SIGTERM / SIGINT stop everything in order (scheduler first), exit 0, no process left, and a restart
  that is still backing off never happens.

Pids come from the port files in the workdir (each service writes its serving pid there) and from
/proc (the descendants of the serve process), never from name patterns.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from inferix.api.v1 import kvcache_pb2, kvcache_pb2_grpc, streamer_pb2, streamer_pb2_grpc
from inferix.client import BlockDone, Client, PromptChange, StateChanged
from inferix.server import INTERNAL_TOKEN_HEADER
from inferix_cli.mesh.rtmp_relay import nginx_rtmp_missing
from tests.mesh.conftest import KEY_A, KEY_B, generate_digest

TOKEN = "supervisor-test-internal-token"


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def running(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def descendants(root: int) -> dict[int, int]:
    """{pid: start time} of every live process under `root` (children of children too)."""
    parents: dict[int, tuple[int, int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            parents[int(entry.name)] = (int(fields[1]), int(fields[19]))
    found: dict[int, int] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, started) in parents.items():
            if ppid == parent and pid not in found:
                found[pid] = started
                frontier.append(pid)
    return found


def left_running(processes: dict[int, int]) -> list[int]:
    """Those of `processes` (pid: start time) still running (the same processes, not recycled pids)."""
    return [pid for pid, started in processes.items() if running(pid) and (_stat(pid) or [""] * 20)[19] == str(started)]


class Serve:
    """`python -m inferix_cli serve ...` in the background, its output collected line by line."""

    def __init__(self, workdir: Path, *args: str, env: dict[str, str] | None = None, wait: bool = True) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        keys = workdir.parent / f"{workdir.name}-api-keys"
        keys.write_text(f"{KEY_A} alice\n{KEY_B} bob\n")
        cmd = [sys.executable, "-m", "inferix_cli", "serve", "--port", "0", "--http-port", "0"]
        # One torch thread per worker: the numerics of `inferix generate --threads 1` (the digests
        # compared below show that the flag reaches every worker).
        cmd += ["--workdir", str(workdir), "--api-keys-file", str(keys), "--worker-threads", "1", *args]
        environ = {**os.environ, "INFERIX_INTERNAL_TOKEN": TOKEN, **(env or {})}
        environ.pop("INFERIX_THREADS", None)
        self.process = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ, start_new_session=True
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._changed = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, self.stdout), daemon=True),
            threading.Thread(target=self._read, args=(self.process.stderr, self.stderr), daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        self.seen: dict[int, int] = {}  # every descendant process seen, for the "nothing left" checks
        if wait:
            self.wait_until_up()

    def wait_until_up(self) -> None:
        self.wait_for_line(r"^Ctrl-C to stop", timeout=240)
        self.address = self.wait_for_line(r"^scheduler\s+(\S+)").group(1)
        self.streamer = self.wait_for_line(r"^streamer\s+(\S+)").group(1)
        self.kvcache = self.wait_for_line(r"^kvcache\s+(\S+)").group(1)
        self.note_children()

    def _read(self, stream: object, into: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            with self._changed:
                into.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def output(self) -> str:
        return "\n".join(self.stdout) + "\n--- stderr ---\n" + "\n".join(self.stderr)

    def wait_for_line(self, pattern: str, timeout: float = 60.0, start: int = 0) -> re.Match[str]:
        """The first stdout line from index `start` on that matches `pattern`."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.stdout[start:]:
                    if match := regex.search(line):
                        return match
                left = deadline - time.monotonic()
                if left <= 0 or (self.process.poll() is not None and not any(r.is_alive() for r in self._readers)):
                    raise AssertionError(f"no line matching {pattern!r} within {timeout:g}s:\n{self.output()}")
                self._changed.wait(min(left, 0.5))

    def note_children(self) -> None:
        self.seen.update(descendants(self.process.pid))

    def port_file(self, name: str) -> dict[str, int]:
        return json.loads((self.workdir / f"{name}.port.json").read_text())

    def pid_of(self, name: str) -> int:
        """The serving process of a service, from the port file it wrote."""
        return self.port_file(name)["pid"]

    def finish(self, sig: int | None = None, timeout: float = 90.0) -> int:
        """Send `sig` (if any) and wait for the exit code; every reader has drained the output then."""
        self.note_children()
        if sig is not None:
            self.process.send_signal(sig)
        code = self.process.wait(timeout)
        for reader in self._readers:
            reader.join(10)
        return code

    def close(self) -> None:
        """Stop whatever is left (a failed test must not leave services behind)."""
        if self.process.poll() is None:
            self.note_children()
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pid in left_running(self.seen):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Serve]]:
    started: list[Serve] = []

    def start(*args: str, env: dict[str, str] | None = None, wait: bool = True) -> Serve:
        started.append(Serve(tmp_path / f"serve{len(started)}", *args, env=env, wait=wait))
        return started[-1]

    yield start
    for process in started:
        process.close()


def assert_stopped_cleanly(serve: Serve, code: int) -> None:
    assert code == 0, serve.output()
    assert serve.stdout[-2] == "stopping ...", serve.output()
    stopped = serve.stdout[-1]
    assert stopped.startswith("stopped: scheduler="), serve.output()  # the scheduler first
    assert left_running(serve.seen) == [], f"left running: {left_running(serve.seen)}\n{serve.output()}"


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:g}s: {what}"
        time.sleep(0.2)


def list_workers(kvcache: str) -> dict[str, kvcache_pb2.WorkerInfo]:
    with grpc.insecure_channel(kvcache) as channel:
        stub = kvcache_pb2_grpc.KVCacheServiceStub(channel)
        reply = stub.ListWorkers(
            kvcache_pb2.ListWorkersRequest(), timeout=10, metadata=[(INTERNAL_TOKEN_HEADER, TOKEN)]
        )
    return {w.worker_id: w for w in reply.workers}


def stream_info(streamer: str, session_id: str) -> streamer_pb2.GetStreamInfoResponse:
    with grpc.insecure_channel(streamer) as channel:
        stub = streamer_pb2_grpc.StreamerServiceStub(channel)
        return stub.GetStreamInfo(streamer_pb2.GetStreamInfoRequest(session_id=session_id), timeout=30)


def test_a_killed_worker_restarts_and_its_session_completes_on_the_other(serve: Callable[..., Serve]) -> None:
    schedule = (PromptChange(0, "a red ball"), PromptChange(20, "a green ball"))
    blocks_total, seed = 48, 7
    with ThreadPoolExecutor(1) as pool:
        # the uninterrupted run of the same session (a CLI subprocess), made while the mesh starts
        expected: Future[str] = pool.submit(generate_digest, schedule, blocks_total, seed)
        mesh = serve("--workers", "2", "--rtmp", "off", "--lookahead", "64")
        wait_until(lambda: set(list_workers(mesh.kvcache)) == {"worker0", "worker1"}, 30, "workers registered")
        events: list[object] = []
        victim, victim_pid, killed_at = "", 0, 0.0
        with Client(mesh.address, api_key=KEY_A, timeout=120) as client:
            info = client.create_session(list(schedule), num_blocks=blocks_total, seed=seed)
            for event in client.events(info.session_id):
                events.append(event)
                if isinstance(event, BlockDone) and event.block_index == 10 and not victim:
                    victim = event.worker_id
                    victim_pid = mesh.pid_of(victim)
                    mesh.note_children()
                    os.kill(victim_pid, signal.SIGKILL)
                    killed_at = time.monotonic()
            final = client.get_session(info.session_id)
        blocks = [e for e in events if isinstance(e, BlockDone)]
        assert [b.block_index for b in blocks] == list(range(blocks_total)), mesh.output()  # every block once
        survivor = ({"worker0", "worker1"} - {victim}).pop()
        # block 11 may have been in flight on the killed worker; every later block ran on the other one
        assert {b.worker_id for b in blocks[12:]} == {survivor}, [(b.block_index, b.worker_id) for b in blocks]
        assert [e.state for e in events if isinstance(e, StateChanged)][-1] == "completed"
        assert final.state == "completed" and final.blocks_done == blocks_total, final
        streamed = stream_info(mesh.streamer, info.session_id)
        assert streamed.frames == blocks_total * 3  # toyworld: 3 video frames per block
        assert streamed.frames_sha256 == expected.result(timeout=600)  # bit-identical to an uninterrupted run

    # the killed worker is back under its worker id: a new live process, registered again (its new address)
    mesh.wait_for_line(rf"^{victim} exited \(signal 9\); restarting in 0\.5s \(restart 1\)$", timeout=5)
    back = mesh.wait_for_line(rf"^{victim} restarted: (\S+) \(pid (\d+)\)$", timeout=30)
    new_pid = int(back.group(2))
    assert new_pid != victim_pid and running(new_pid) and not running(victim_pid)
    assert mesh.pid_of(victim) == new_pid
    deadline = killed_at + 30
    while True:
        workers = list_workers(mesh.kvcache)
        if workers[victim].alive and workers[victim].address == back.group(1):
            break
        assert time.monotonic() < deadline, f"{victim} not registered again within 30 s: {workers}"
        time.sleep(0.2)
    assert workers[survivor].alive
    assert time.monotonic() - killed_at < 30
    # its log kept the first run's output, then the restart. The worker logs its registration once
    # kvcache_svc has answered, so the line may come a moment after the record shows it alive.
    log_path = mesh.workdir / f"{victim}.log"
    wait_until(lambda: log_path.read_text().count("registered with kvcache_svc") >= 2, 10, "the second registration")
    log = log_path.read_text()
    assert f"{victim} exited (signal 9); restarting in 0.5s (restart 1)" in log
    # only the victim was restarted; its relaunch keeps its metrics port, which another connection's
    # ephemeral port can hold for a moment (EADDRINUSE before it listens): the supervisor tries again
    exits = [line for line in mesh.stdout if re.match(r"^\S+ exited \(", line)]
    assert exits[0] == f"{victim} exited (signal 9); restarting in 0.5s (restart 1)", mesh.output()
    assert all(line.startswith(f"{victim} exited (exit code 1 before listening)") for line in exits[1:]), mesh.output()
    assert_stopped_cleanly(mesh, mesh.finish(signal.SIGTERM))


def test_the_only_worker_restarts_and_takes_its_session_back(serve: Callable[..., Serve]) -> None:
    """One worker, killed: the session waits for it to restart under the same worker id (a dead worker
    is suspect, not excluded for good) and finishes on it, every block once, frames bit-identical."""
    schedule = (PromptChange(0, "a blue square"),)
    blocks_total, seed = 16, 9
    with ThreadPoolExecutor(1) as pool:
        expected: Future[str] = pool.submit(generate_digest, schedule, blocks_total, seed)
        mesh = serve("--workers", "1", "--rtmp", "off", "--lookahead", "64")
        wait_until(lambda: set(list_workers(mesh.kvcache)) == {"worker0"}, 30, "worker registered")
        events: list[object] = []
        killed = 0
        with Client(mesh.address, api_key=KEY_A, timeout=120) as client:
            info = client.create_session(list(schedule), num_blocks=blocks_total, seed=seed)
            for event in client.events(info.session_id):
                events.append(event)
                if isinstance(event, BlockDone) and event.block_index == 4 and not killed:
                    killed = mesh.pid_of("worker0")
                    mesh.note_children()
                    os.kill(killed, signal.SIGKILL)
            final = client.get_session(info.session_id)
        assert [e.block_index for e in events if isinstance(e, BlockDone)] == list(range(blocks_total))
        assert final.state == "completed" and mesh.pid_of("worker0") != killed, mesh.output()
        streamed = stream_info(mesh.streamer, info.session_id)
        assert streamed.frames == blocks_total * 3
        assert streamed.frames_sha256 == expected.result(timeout=600)


def test_a_service_that_cannot_start_again_is_a_crash_loop(serve: Callable[..., Serve]) -> None:
    # short backoff to keep the test fast; the crash-loop rule is the default one (5 restarts within 60 s)
    env = {"INFERIX_SERVE_BACKOFF_S": "0.1", "INFERIX_SERVE_BACKOFF_MAX_S": "0.4"}
    mesh = serve("--workers", "1", "--rtmp", "off", env=env)
    # The streamer cannot start again: its recordings folder is now a file (it exits at start-up).
    recordings = mesh.workdir / "recordings"
    recordings.rmdir()  # empty: no session ran
    recordings.write_text("not a folder")
    os.kill(mesh.pid_of("streamer"), signal.SIGKILL)
    code = mesh.finish(timeout=120)
    assert code == 1, mesh.output()
    log = mesh.workdir / "streamer.log"
    assert mesh.stderr == [
        f"inferix serve: error: streamer exited (exit code 1 before listening) after 5 restart(s) within 60s: "
        f"crash loop, stopping; its log: {log}"
    ], mesh.output()
    restarts = [line for line in mesh.stdout if line.startswith("streamer exited")]
    assert restarts == [
        "streamer exited (signal 9); restarting in 0.1s (restart 1)",
        "streamer exited (exit code 1 before listening); restarting in 0.2s (restart 2)",
        "streamer exited (exit code 1 before listening); restarting in 0.4s (restart 3)",
        "streamer exited (exit code 1 before listening); restarting in 0.4s (restart 4)",
        "streamer exited (exit code 1 before listening); restarting in 0.4s (restart 5)",
    ], mesh.output()
    assert "streamer restarted" not in mesh.output()
    # the log says why, run after run
    text = log.read_text()
    assert text.count("FileExistsError") == 5, text[-3000:]
    assert "serving on" in text  # the first run's output is still there
    assert mesh.stdout[-2] == "stopping ..."
    assert left_running(mesh.seen) == [], mesh.output()


def test_sigterm_stops_everything_in_order(serve: Callable[..., Serve]) -> None:
    rtmp = nginx_rtmp_missing() is None
    mesh = serve("--workers", "1", "--rtmp", "auto" if rtmp else "off")
    if rtmp:  # nginx (RTMP) comes back on its port when it dies
        port = int(mesh.wait_for_line(r"^rtmp\s+rtmp://127\.0\.0\.1:(\d+)/").group(1))
        nginx = next(pid for pid in mesh.seen if Path(f"/proc/{pid}/exe").resolve().name == "nginx")
        os.kill(nginx, signal.SIGKILL)
        mesh.wait_for_line(r"^rtmp exited \(signal 9\); restarting in 0\.5s \(restart 1\)$", timeout=10)
        mesh.wait_for_line(rf"^rtmp restarted: 127\.0\.0\.1:{port} ", timeout=15)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    code = mesh.finish(signal.SIGTERM)
    assert_stopped_cleanly(mesh, code)
    names = ["scheduler", "worker0", "streamer", *(["rtmp"] if rtmp else []), "kvcache"]
    assert mesh.stdout[-1] == "stopped: " + ", ".join(f"{name}=0" for name in names), mesh.output()


def test_sigterm_while_starting_leaves_nothing_behind(serve: Callable[..., Serve]) -> None:
    mesh = serve("--workers", "1", "--rtmp", "off", wait=False)
    # kvcache_svc and the streamer listen; the worker is starting (importing torch, loading its model)
    wait_until(lambda: (mesh.workdir / "streamer.port.json").is_file(), 120, "the streamer listens")
    wait_until(lambda: len(descendants(mesh.process.pid)) >= 3, 30, "the worker process runs")
    assert mesh.finish(signal.SIGTERM) == 0, mesh.output()
    assert mesh.stdout[-1] == "stopped while starting (SIGTERM)", mesh.output()
    assert len(mesh.seen) >= 3 and left_running(mesh.seen) == [], mesh.output()


def test_a_sigkilled_serve_leaves_no_service_behind(serve: Callable[..., Serve]) -> None:
    """Killed outright, `inferix serve` stops nothing itself: each service sees its launcher gone and
    drains and stops on its own (inferix/server.py, INFERIX_PARENT_PID)."""
    mesh = serve("--workers", "1", "--rtmp", "off")
    names = ["scheduler", "worker0", "streamer", "kvcache"]
    services = {name: mesh.pid_of(name) for name in names}
    assert set(services.values()) <= set(mesh.seen), (services, mesh.seen)
    assert mesh.finish(signal.SIGKILL) == -signal.SIGKILL
    wait_until(lambda: left_running(mesh.seen) == [], 60, "every service stopped")
    for name in names:
        log = (mesh.workdir / f"{name}.log").read_text()
        assert "the local mesh that launched this service" in log and "is gone: stopping" in log, (name, log[-2000:])


def test_sigint_while_a_restart_backs_off_restarts_nothing(serve: Callable[..., Serve]) -> None:
    mesh = serve("--workers", "1", "--rtmp", "off", env={"INFERIX_SERVE_BACKOFF_S": "5"})
    os.kill(mesh.pid_of("kvcache"), signal.SIGKILL)
    mesh.wait_for_line(r"^kvcache exited \(signal 9\); restarting in 5s \(restart 1\)$", timeout=10)
    code = mesh.finish(signal.SIGINT)
    assert_stopped_cleanly(mesh, code)
    assert "kvcache restarted" not in mesh.output()
    assert mesh.stdout[-1] == "stopped: scheduler=0, worker0=0, streamer=0, kvcache=-9", mesh.output()


def parent_of(pid: int) -> int:
    fields = _stat(pid)
    assert fields is not None, f"process {pid} is gone"
    return int(fields[1])


def test_a_worker_pod_restarts_as_a_whole(serve: Callable[..., Serve]) -> None:
    mesh = serve("--workers", "1", "--ranks-per-worker", "2", "--rtmp", "off")
    # rank 0 dies: torchrun and the other rank go too, and a whole new pod starts
    rank0 = mesh.pid_of("worker0")
    torchrun = parent_of(rank0)
    pod = {torchrun, *descendants(torchrun)}
    assert len(pod) == 3 and parent_of(torchrun) == mesh.process.pid
    mesh.note_children()
    os.kill(rank0, signal.SIGKILL)
    # (torchrun notices too, and may exit 1 first)
    how = r"(rank 0 exited; rest of the pod killed|exit code 1)"
    mesh.wait_for_line(rf"^worker0 exited \({how}\); restarting in 0\.5s \(restart 1\)$")
    back = mesh.wait_for_line(r"^worker0 restarted: (\S+) \(pid (\d+)\)$", timeout=120)
    assert not any(running(pid) for pid in pod)
    # torchrun is SIGKILLed: its ranks (each in a session of its own) would outlive it; they are killed
    rank0 = int(back.group(2))
    torchrun = parent_of(rank0)
    pod = {torchrun, *descendants(torchrun)}
    assert len(pod) == 3 and not {torchrun, rank0} & set(mesh.seen)
    mesh.note_children()
    os.kill(torchrun, signal.SIGKILL)
    line = len(mesh.stdout)
    mesh.wait_for_line(r"^worker0 exited \(signal 9\); restarting in 1s \(restart 2\)$", start=line)
    time.sleep(0.3)  # a poll of the supervisor
    assert not any(running(pid) for pid in pod), {pid: running(pid) for pid in pod}  # during the backoff already
    back = mesh.wait_for_line(r"^worker0 restarted: (\S+) \(pid (\d+)\)$", timeout=120, start=line)
    deadline = time.monotonic() + 30
    while list_workers(mesh.kvcache)["worker0"].address != back.group(1):
        assert time.monotonic() < deadline, list_workers(mesh.kvcache)
        time.sleep(0.2)
    assert_stopped_cleanly(mesh, mesh.finish(signal.SIGTERM))
    assert mesh.stdout[-1] == "stopped: scheduler=0, worker0=0, streamer=0, kvcache=0", mesh.output()
