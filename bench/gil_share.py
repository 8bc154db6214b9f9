"""What another thread's hold on the GIL costs the engine: in-engine throughput beside a GIL holder.

A worker runs its engine on one thread and its gRPC event loop (the RPCs of every block: the
scheduler's RunBlock, the streamer's PushBlock, the KV cache's commits, ...) on another thread of the
same process. The engine thread takes the GIL between every two torch operators, and a forward of
a small model is hundreds of them, so whenever the loop thread holds the GIL the engine mostly
waits. This bench measures that cost without a mesh: N toyworld sessions batched in this process
(`bench/served.py`'s in-engine figure), alone and with a thread beside them that runs pure Python
for `span` then sleeps (releasing the GIL), at the duties asked for, in turn and repeated, so that
each duty is measured under the same load as the figure alone.

    python -P bench/gil_share.py [--sessions 8] [--blocks 24] [--threads 1] [--duties 5 10 20] [--repeats 4]

It prints the median frames/s per duty and its ratio to the median alone. A scratch `py-spy record
--gil` of a served worker finds out the duty its event loop runs at (bench/RESULTS.md, issue 38).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench this one reuses

from inferix.openmp import openmp_wait

os.environ.update(openmp_wait(os.environ))  # the worker's OpenMP wait, as bench/served.py

import argparse
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from served import in_engine_fps

from engine.families.wan.engine import WanEngine
from engine.families.wan.loader import load_wan_model

SPAN_S = 0.0002  # a loop callback's length: a few hundred microseconds of Python


@contextmanager
def gil_holder(duty: float) -> Iterator[None]:
    """A thread that holds the GIL `duty` of the time, in spans of SPAN_S (0: no thread)."""
    if duty <= 0:
        yield
        return
    stop = threading.Event()
    rest = SPAN_S * (1 - duty) / duty

    def hold() -> None:
        while not stop.is_set():
            began = time.perf_counter()
            while time.perf_counter() - began < SPAN_S:
                pass
            time.sleep(rest)

    thread = threading.Thread(target=hold, name="gil-holder", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=8, help="toyworld sessions batched (default 8)")
    parser.add_argument("--blocks", type=int, default=24, help="blocks per session (default 24)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument(
        "--duties", type=float, nargs="+", default=[5, 10, 20], help="%% of the time the other thread holds the GIL"
    )
    parser.add_argument("--repeats", type=int, default=4, help="rounds of every duty in turn (default 4)")
    args = parser.parse_args()
    if args.sessions < 1 or args.blocks < 1 or args.repeats < 1 or args.threads < 1:
        parser.error("--sessions, --blocks, --repeats and --threads must be at least 1")
    if any(not 0 < d < 100 for d in args.duties):
        parser.error("--duties are percentages between 0 and 100")
    torch.set_num_threads(args.threads)
    engine = WanEngine(load_wan_model("toyworld"))
    in_engine_fps(engine, 1, 2)  # warm-up
    duties = [0.0, *args.duties]
    fps: dict[float, list[float]] = {d: [] for d in duties}
    for _ in range(args.repeats):
        for duty in duties:
            with gil_holder(duty / 100):
                fps[duty].append(in_engine_fps(engine, args.sessions, args.blocks)[0])
    alone = statistics.median(fps[0.0])
    print(
        f"toyworld, {args.sessions} sessions batched in-engine, {args.blocks} blocks each, {args.threads} torch "
        f"thread(s), median of {args.repeats}; beside them a thread holding the GIL in {SPAN_S * 1e6:.0f} us spans"
    )
    print(f"{'GIL held by the other thread':>30} {'frames/s':>9} {'vs alone':>9}   runs")
    for duty in duties:
        median = statistics.median(fps[duty])
        runs = " ".join(f"{v:.1f}" for v in fps[duty])
        label = "none (alone)" if duty == 0 else f"{duty:g}%"
        print(f"{label:>30} {median:>9.1f} {median / alone:>8.2f}x   {runs}")


if __name__ == "__main__":
    main()
