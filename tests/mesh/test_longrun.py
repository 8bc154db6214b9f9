"""Short versions of issue 41's soak and chaos run (`make soak`, `make chaos`: bench/longrun.py), so that
their paths stay covered: `inferix serve` on a real redis-server, real processes killed by pid.

- soak: one session of 15 s of video, watched by its viewer page in headless Chromium and over the
  SDK; its worker SIGKILLed at half time and the scheduler at three quarters; it completes with every
  block once, the frames of a solo `inferix generate`, a downloadable recording of as many frames,
  the page plays the video to its end (90% of its frames: it joins a moment after the start), and
  both recoveries are timed;
- chaos: 6 sessions while random services and Redis get SIGKILL / SIGTERM every 3-6 s (seeded; the
  real run waits 10-20 s); every session completes with every block once and its solo frames,
  recordings downloadable.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run(tmp_path: Path, *args: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "longrun.py"), *args, "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=ROOT,
    )
    assert result.stdout.strip(), result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["ok"], json.dumps(report, indent=1) + result.stderr[-3000:]
    return report


def test_a_short_soak_survives_a_worker_and_a_scheduler_sigkill(tmp_path: Path) -> None:
    report = run(tmp_path, "soak", "--minutes", "0.25")
    assert [k["service"] == "scheduler" for k in report["kills"]] == [False, True]
    assert all(k["recovery_s"] is not None for k in report["kills"])
    assert set(report["rss"]) >= {"scheduler", "kvcache", "streamer", "worker0", "worker1", "redis"}
    page = report["page"]
    assert page["ended"] and not page["error"], page
    assert page["frames_decoded"] + page["frames_dropped"] >= 0.9 * page["frames_of_video"], page


def test_a_short_chaos_run_loses_and_repeats_nothing(tmp_path: Path) -> None:
    report = run(tmp_path, "chaos", "--minutes", "1", "--blocks", "90", "--interval", "3,6", "--seed", "3")
    assert len([k for k in report["kills"] if k["pid"] is not None]) >= 2  # processes really killed
    assert len(report["sessions"]) == 6
