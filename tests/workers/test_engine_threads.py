"""The worker's engine thread is its only thread with several torch CPU threads (workers/engine_host.py):
libgomp throttles its threads' spinning once a process holds more OpenMP threads than cores, and every
thread that runs a parallel region keeps a team of its own, so a second team made the engine's blocks
several times slower. Checked in a fresh process (the OpenMP runtime is per process): the engine thread
runs at the configured count, and a large op on the main thread or on a thread started later adds no
OpenMP thread to the process."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import asyncio, json, os, threading
import torch
torch.set_num_threads(1)  # as `python -m workers` does before it loads the model
from engine.registry import LoadOptions, load_model
from workers.config import WorkerConfig
from workers.engine_host import EngineHost

def tasks():
    return len(os.listdir("/proc/self/task"))

def big_op():
    torch.ones(1 << 22).mul_(2).sum()  # far above torch's grain size: parallel at any count above one

host = EngineHost(load_model("toyworld", LoadOptions()), WorkerConfig("w", "127.0.0.1:1", 64, threads=2))
engine_threads = asyncio.run(host.in_thread(torch.get_num_threads))
asyncio.run(host.in_thread(big_op))
with_engine_team = tasks()
big_op()
after_main = tasks()
in_other = []  # counted while that thread runs: a joined thread may linger in /proc for a moment
other = threading.Thread(target=lambda: (big_op(), in_other.append(tasks())))
other.start()
other.join()
print(json.dumps({"engine": engine_threads, "main": torch.get_num_threads(), "engine_team": with_engine_team,
                  "after_main": after_main, "in_other": in_other[0]}))
"""


def test_only_the_engine_thread_runs_torch_on_several_threads() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=300)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert (seen["engine"], seen["main"]) == (2, 1), seen
    # the engine thread's team exists; the main thread's op and another thread's made no team of their own
    assert seen["after_main"] == seen["engine_team"], seen
    assert seen["in_other"] == seen["engine_team"] + 1, seen  # that thread itself, and no team of its own
