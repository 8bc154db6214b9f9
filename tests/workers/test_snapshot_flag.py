"""`python -m workers --snapshot-every`: a family without KV snapshots refuses N > 0 at start with one line,
before loading anything; a value that is not a number of blocks or `auto` is a usage error."""

from __future__ import annotations

import subprocess
import sys


def start_worker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers", "--kvcache", "127.0.0.1:1", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_family_without_snapshots_refuses_the_flag_with_one_line() -> None:
    result = start_worker("--model", "matrixgame2-tiny", "--snapshot-every", "4")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "python -m workers: error: --snapshot-every: Matrix-Game 2.0 has no KV snapshots yet (it recovers by "
        "replay); use --snapshot-every 0"
    )


def test_the_flag_takes_auto_or_a_number_of_blocks() -> None:
    result = start_worker("--snapshot-every", "often")
    assert result.returncode == 2
    assert "--snapshot-every must be 'auto' or a number of blocks >= 0, got 'often'" in result.stderr
