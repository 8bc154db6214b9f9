"""A worker's OpenMP threads sleep while they wait (OMP_WAIT_POLICY=PASSIVE) unless told otherwise:
spinning threads starve the worker's event loop and the services beside it (bench/served.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = "import sys; import workers.__main__, os; print(os.environ['OMP_WAIT_POLICY'], 'torch' in sys.modules)"


@pytest.mark.parametrize(("given", "expected"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_the_worker_sets_a_sleeping_wait_policy_before_torch_loads(given: str | None, expected: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [expected, "True"]  # torch is loaded by then, after the policy was set
