"""A worker's and the CLI's OpenMP threads spin only briefly before they sleep (GOMP_SPINCOUNT, set before
torch loads its runtime) unless the environment already says how they wait (inferix/openmp.py): a long
spin collapses on a shared machine, sleeping at once slows small models at several threads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from inferix.openmp import SPIN_COUNT

SHOW = "print(os.environ.get('OMP_WAIT_POLICY', '-'), os.environ.get('GOMP_SPINCOUNT', '-'), 'torch' in sys.modules)"
WORKER = f"import os, sys; import workers.__main__; {SHOW}"
# The CLI applies it in main(), before any command imports torch (`--help` exits before a command runs).
CLI = f"import os, sys\nfrom inferix_cli.main import main\ntry: main(['generate', '--help'])\nexcept SystemExit: {SHOW}"

CASES = [
    ({}, ["-", str(SPIN_COUNT)]),
    ({"OMP_WAIT_POLICY": "PASSIVE"}, ["PASSIVE", "-"]),
    ({"GOMP_SPINCOUNT": "500"}, ["-", "500"]),
]


@pytest.mark.parametrize(("given", "expected"), CASES)
def test_the_worker_bounds_the_openmp_spin_before_torch_loads(given: dict[str, str], expected: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")} | given
    out = subprocess.run([sys.executable, "-c", WORKER], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [*expected, "True"]  # torch is loaded by then, after the wait was set


@pytest.mark.parametrize(("given", "expected"), CASES)
def test_the_cli_bounds_the_openmp_spin_before_a_command_loads_torch(
    given: dict[str, str], expected: list[str]
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")} | given
    out = subprocess.run([sys.executable, "-c", CLI], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[-1].split() == [*expected, "False"]
