"""How torch's OpenMP threads should wait, measured: toyworld's in-engine throughput (bench/batching.py, 1
and 8 sessions batched) under each wait setting, on an idle machine and beside busy processes, in one run.

Settings (each in its own process: the OpenMP runtime reads them once, when torch loads it):
- `spin`: the runtime's default (libgomp spins ~300,000 times before a waiting thread sleeps);
- `passive`: OMP_WAIT_POLICY=PASSIVE (sleep at once; what workers did before inferix/openmp.py);
- `bounded`: GOMP_SPINCOUNT=10000 (what workers and the CLI now set);
- `1 thread`: no OpenMP wait at all (the reference for what a second thread is worth).

"Busy": `--hogs` processes (default: one per core) that spin in pure Python beside the bench, as other
tenants of a shared machine or the mesh's other services do.

Then, idle, where a worker's blocks run (`--threads` torch threads, bounded spin, ms per toyworld block
after 5): on the thread that loaded the model (as `inferix generate`); on a second thread after a load
at the same count on the main thread (a worker before workers/engine_host.py kept its other threads at
one: two OpenMP teams); on a second thread after a load at one thread (a worker now: one team).

    python -P bench/openmp_wait.py [--threads 2] [--rounds 3] [--hogs N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS: dict[str, dict[str, str]] = {
    "spin": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "bounded": {"GOMP_SPINCOUNT": "10000"},
    "1 thread": {},
}


def batching(setting: str, threads: int, rounds: int) -> dict[int, float]:
    """Batched frames/s by session count, bench/batching.py in a process of its own with `setting`."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env |= SETTINGS[setting]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "batching.json"
        command = [sys.executable, "-P", str(ROOT / "bench" / "batching.py"), "--model", "toyworld"]
        command += ["--sessions", "1,8", "--rounds", str(rounds), "--json", str(out)]
        command += ["--threads", "1" if setting == "1 thread" else str(threads)]
        subprocess.run(command, env=env, check=True, capture_output=True, cwd=ROOT, timeout=1800)
        rows = json.loads(out.read_text())["rows"]
    return {int(row["sessions"]): float(row["batched_fps"]) for row in rows}


LAYOUT = """
import sys, threading, time, torch
from concurrent.futures import ThreadPoolExecutor
from engine.contract import SessionRequest
from engine.registry import load_engine
layout, threads = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1 if layout == "engine thread, main at 1" else threads)
engine = load_engine("toyworld", kv_pages=256)
def blocks():
    torch.set_num_threads(threads)
    with engine.open_session(SessionRequest(prompt="a red ball", seed=1, session_id="s")) as session:
        for _ in range(5):
            session.next_block()
        began = time.perf_counter()
        for _ in range(40):
            session.next_block()
        return 1e3 * (time.perf_counter() - began) / 40
print(blocks() if layout == "main thread" else ThreadPoolExecutor(1).submit(blocks).result())
"""
LAYOUTS = ("main thread", "engine thread, main at N", "engine thread, main at 1")


def layout_ms(layout: str, threads: int) -> float:
    """ms per toyworld block where `layout` runs them, in a process of its own with the bounded spin."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env |= SETTINGS["bounded"]
    command = [sys.executable, "-P", "-c", LAYOUT, layout, str(threads)]
    done = subprocess.run(command, env=env, check=True, capture_output=True, text=True, cwd=ROOT, timeout=600)
    return float(done.stdout.split()[-1])


def hogs(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the multi-thread settings")
    parser.add_argument("--rounds", type=int, default=3, help="bench/batching.py rounds per N (default 3)")
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 2, help="busy processes (default: cores)")
    args = parser.parse_args()
    figures: dict[str, dict[str, dict[int, float]]] = {}
    for machine in ("idle", "busy"):
        running = hogs(args.hogs) if machine == "busy" else []
        try:
            figures[machine] = {s: batching(s, args.threads, args.rounds) for s in SETTINGS}
        finally:
            for hog in running:
                hog.kill()
                hog.wait()
    print(f"toyworld batched frames/s, {args.threads} threads (1 thread: one), {args.hogs} busy process(es) when busy")
    print(f"{'machine':8} {'N':>2} " + " ".join(f"{s:>9}" for s in SETTINGS) + "  bounded/passive  bounded/spin")
    for machine, by_setting in figures.items():
        for n in (1, 8):
            fps = {s: by_setting[s][n] for s in SETTINGS}
            cells = " ".join(f"{fps[s]:9.1f}" for s in SETTINGS)
            ratios = f"{fps['bounded'] / fps['passive']:15.2f}x {fps['bounded'] / fps['spin']:12.2f}x"
            print(f"{machine:8} {n:>2} {cells}  {ratios}")
    main_ms = layout_ms(LAYOUTS[0], args.threads)
    print(f"\nidle, {args.threads} threads, bounded spin: ms per toyworld block, and against the main thread")
    for layout in LAYOUTS:
        ms = main_ms if layout == LAYOUTS[0] else layout_ms(layout, args.threads)
        print(f"  {layout:26} {ms:6.1f} ms  {ms / main_ms:5.2f}x")


if __name__ == "__main__":
    main()
