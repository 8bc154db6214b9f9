"""The restart policy of `inferix serve` (backoff, crash loop) and its supervisor loop, without processes.

The supervisor runs here over fake children and a fake clock; tests/mesh/test_supervisor.py runs the
real CLI and kills real services.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from inferix.supervisor import CrashLoop, RestartHistory, RestartPolicy, Supervisor


def test_backoff_doubles_from_its_base_up_to_its_cap() -> None:
    policy = RestartPolicy(backoff_base_s=0.5, backoff_cap_s=5.0)
    assert [policy.delay(n) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert policy.delay(10_000) == 5.0  # no overflow


def test_defaults() -> None:
    policy = RestartPolicy()
    assert (policy.backoff_base_s, policy.backoff_cap_s) == (0.5, 30.0)
    assert (policy.crash_loop_restarts, policy.crash_loop_window_s) == (5, 60.0)


def test_five_restarts_within_the_window_then_a_crash_loop() -> None:
    policy = RestartPolicy()
    history = RestartHistory()
    now = 100.0
    delays = []
    for _ in range(5):
        delay = history.on_exit(policy, now)
        assert delay is not None
        delays.append(delay)
        now += delay + 1.0  # restarted after its backoff, then ran 1 s
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0]
    assert history.total == 5
    assert history.on_exit(policy, now) is None  # the 6th exit within 60 s: crash loop
    assert history.total == 5  # not restarted


def test_a_child_that_stays_up_for_a_window_starts_over() -> None:
    policy = RestartPolicy(crash_loop_restarts=3, crash_loop_window_s=60.0)
    history = RestartHistory()
    assert [history.on_exit(policy, t) for t in (0.0, 1.0, 2.0)] == [0.5, 1.0, 2.0]
    # 60.5 s after the first restart only two restarts are recent: a 4th exit is restarted (backoff of 2)
    assert history.on_exit(policy, 60.5) == 2.0
    # long after: the backoff is back at its base, and the history forgets old restarts
    assert history.on_exit(policy, 1000.0) == 0.5
    assert history.times == [1000.0]
    assert history.total == 5


def test_a_child_that_crashes_once_a_minute_forever_is_not_a_crash_loop() -> None:
    policy = RestartPolicy()
    history = RestartHistory()
    assert all(history.on_exit(policy, minute * 61.0) == 0.5 for minute in range(100))


def test_zero_restarts_means_the_first_exit_stops_the_mesh() -> None:
    assert RestartHistory().on_exit(RestartPolicy(crash_loop_restarts=0), 0.0) is None


def test_policy_from_the_environment() -> None:
    env = {
        "INFERIX_SERVE_BACKOFF_S": "0.1",
        "INFERIX_SERVE_BACKOFF_MAX_S": "2",
        "INFERIX_SERVE_CRASH_LOOP_RESTARTS": "3",
        "INFERIX_SERVE_CRASH_LOOP_WINDOW_S": "10",
    }
    assert RestartPolicy.from_env(env) == RestartPolicy(0.1, 2.0, 3, 10.0)
    assert RestartPolicy.from_env({}) == RestartPolicy()
    assert RestartPolicy.from_env({"INFERIX_SERVE_BACKOFF_S": " "}) == RestartPolicy()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"INFERIX_SERVE_CRASH_LOOP_RESTARTS": "five"}, "INFERIX_SERVE_CRASH_LOOP_RESTARTS='five' is not an integer"),
        ({"INFERIX_SERVE_BACKOFF_S": "fast"}, "INFERIX_SERVE_BACKOFF_S='fast' is not a number"),
        ({"INFERIX_SERVE_BACKOFF_S": "60"}, "backoff cap (30.0 s) must be >= its base (60.0 s)"),
        ({"INFERIX_SERVE_CRASH_LOOP_WINDOW_S": "0"}, "crash-loop window must be > 0 s"),
        ({"INFERIX_SERVE_CRASH_LOOP_RESTARTS": "-1"}, "crash-loop restarts must be >= 0"),
    ],
)
def test_policy_from_the_environment_refuses_nonsense(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RestartPolicy.from_env(env)


# ---- the supervisor loop over fake children ---------------------------------------------------


@dataclass
class FakePopen:
    returncode: int | None = None


@dataclass
class FakeChild:
    """The part of a ServiceProcess the supervisor uses."""

    name: str
    log_path: Path
    generation: int = 0
    port: int = 1000
    process: FakePopen = field(default_factory=FakePopen)
    serving_pid: int | None = None
    stopped: bool = False

    @property
    def pid(self) -> int:
        return 100 + self.generation

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.process.returncode is None

    def serving(self) -> bool:
        return self.alive()

    def exit(self, code: int) -> None:
        self.process.returncode = code

    def kill(self) -> int:
        if self.alive():
            self.process.returncode = -9
        return self.process.returncode or 0

    def stop(self) -> int:
        self.stopped = True
        if self.alive():
            self.process.returncode = 0
        assert self.process.returncode is not None
        return self.process.returncode


@dataclass
class FakeStart:
    """A restart in progress: listens once `ready` is set, or fails with `fails` (an exit code)."""

    child: FakeChild
    ready: bool = False
    fails: int | None = None
    stopped: bool = False
    timed_out: bool = False
    timeout: float = 60.0

    @property
    def process(self) -> FakePopen:
        return FakePopen(self.fails)

    def poll(self) -> FakeChild | None:
        from inferix.launch import ServiceStartError

        if self.fails is not None:
            raise ServiceStartError(f"{self.child.name} exited with code {self.fails} before listening")
        return self.child if self.ready else None

    def stop(self) -> int:
        self.stopped = True
        return -15


@dataclass
class FakeMesh:
    kids: list[FakeChild]
    starts: list[FakeStart] = field(default_factory=list)
    order: list[str] = field(default_factory=list)

    def children(self) -> list[FakeChild]:
        return list(self.kids)

    def relaunch(self, child: FakeChild) -> FakeStart:
        start = FakeStart(FakeChild(child.name, child.log_path, child.generation + 1))
        self.starts.append(start)
        return start

    def replace(self, child: FakeChild) -> None:
        self.kids = [child if k.name == child.name else k for k in self.kids]

    def child(self, name: str) -> FakeChild:
        return next(k for k in self.kids if k.name == name)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def supervised(tmp_path: Path, policy: RestartPolicy) -> tuple[FakeMesh, Supervisor, Clock, list[str]]:
    mesh = FakeMesh([FakeChild(name, tmp_path / f"{name}.log") for name in ("scheduler", "worker0", "kvcache")])
    clock, said = Clock(), list[str]()
    return mesh, Supervisor(mesh, policy, said.append, clock), clock, said  # type: ignore[arg-type]


def test_an_exited_child_is_restarted_after_its_backoff_and_logged(tmp_path: Path) -> None:
    mesh, supervisor, clock, said = supervised(tmp_path, RestartPolicy())
    assert supervisor.poll() is None and said == []
    mesh.child("worker0").exit(-9)
    assert supervisor.poll() is None
    assert said == ["worker0 exited (signal 9); restarting in 0.5s (restart 1)"]
    assert "worker0 exited (signal 9); restarting in 0.5s (restart 1)" in (tmp_path / "worker0.log").read_text()
    clock.now = 0.4
    supervisor.poll()
    assert mesh.starts == []  # still backing off
    assert supervisor.restarting() == ["worker0"]
    clock.now = 0.5
    supervisor.poll()
    assert len(mesh.starts) == 1 and mesh.child("worker0").generation == 0  # starting, not listening yet
    mesh.starts[0].ready = True
    supervisor.poll()
    assert mesh.child("worker0").generation == 1
    assert said[-1] == "worker0 restarted: 127.0.0.1:1000 (pid 101)"
    assert supervisor.restarting() == []
    # the other children were never touched
    assert not mesh.child("scheduler").stopped and mesh.child("scheduler").generation == 0


def test_a_restart_that_fails_counts_as_an_exit_until_the_crash_loop(tmp_path: Path) -> None:
    policy = RestartPolicy(backoff_base_s=1.0, backoff_cap_s=3.0, crash_loop_restarts=3)
    mesh, supervisor, clock, said = supervised(tmp_path, policy)
    mesh.child("kvcache").exit(1)
    outcome = None
    for _ in range(50):
        outcome = supervisor.poll()
        if outcome is not None:
            break
        for start in mesh.starts:
            start.fails = 1  # every restart exits before it listens
        clock.now += 0.5
    assert isinstance(outcome, CrashLoop)
    assert outcome.name == "kvcache" and outcome.log_path == tmp_path / "kvcache.log"
    assert outcome.message() == (
        f"kvcache exited (exit code 1 before listening) after 3 restart(s) within 60s: crash loop, stopping; "
        f"its log: {tmp_path / 'kvcache.log'}"
    )
    assert said == [
        "kvcache exited (exit code 1); restarting in 1s (restart 1)",
        "kvcache exited (exit code 1 before listening); restarting in 2s (restart 2)",
        "kvcache exited (exit code 1 before listening); restarting in 3s (restart 3)",
    ]
    assert len(mesh.starts) == 3


def test_nothing_restarts_once_a_stop_is_requested_and_stop_ends_restarts_in_progress(tmp_path: Path) -> None:
    mesh, supervisor, clock, said = supervised(tmp_path, RestartPolicy())
    mesh.child("worker0").exit(-9)
    mesh.child("kvcache").exit(-9)
    supervisor.poll()
    clock.now = 10.0
    mesh.kids[2].process.returncode = -9
    supervisor.poll()  # both restarts started
    assert [s.child.name for s in mesh.starts] == ["worker0", "kvcache"]
    mesh.child("scheduler").exit(0)
    supervisor.request_stop()
    assert supervisor.run() is None  # returns at once
    assert supervisor.poll() is None
    assert len(mesh.starts) == 2 and not any("scheduler" in line for line in said)
    codes = supervisor.stop()
    assert list(codes) == ["scheduler", "worker0", "kvcache"]  # the mesh's stop order
    assert codes == {"scheduler": 0, "worker0": -15, "kvcache": -15}
    assert all(start.stopped for start in mesh.starts)
