"""The restart policy of `inferix serve` (backoff, crash loop) as pure functions.

The supervisor loop itself is tested on real processes: tests/mesh/test_supervisor.py runs the CLI
and kills real services (restart after a backoff, a failing restart counted to a crash loop, nothing
restarted once a stop is requested).
"""

from __future__ import annotations

import pytest

from inferix_cli.mesh.supervisor import RestartHistory, RestartPolicy


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
