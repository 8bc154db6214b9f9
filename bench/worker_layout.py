"""Workers and CPU cores: one worker with every core against one single-threaded worker per core.

The same N toyworld sessions, in one run:

- in-engine, one process at C threads (C = `--threads`, default every core), N sessions batched, as
  `bench/served.py` measures it;
- in-engine, C processes of one thread side by side, N / C sessions batched in each (started
  together; frames/s over the span from the first start to the last end): what the engine itself
  makes of the cores when its work is split by session instead of inside each operator;
- served through `inferix serve`-style meshes of each layout `WxT` (W workers of T torch threads;
  default `1xC CxC Cx1`: today's `inferix serve`, its `--workers C`, and `--workers C
  --worker-threads 1`), N sessions created at once, as `bench/served.py` serves them;
- each layout's start-up capacity probe (fresh meshes, up to 8 probe sessions per worker): the
  real-time streams its workers claim together, next to the per-session rate served.

    python -P bench/worker_layout.py [--sessions 8] [--blocks 48] [--layouts 1x2 2x2 2x1] [--repeats 2]

(`-P`: this folder's bench/engine_speed.py must not shadow the `engine` package.)
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling bench this one reuses

from inferix.openmp import openmp_wait

os.environ.update(openmp_wait(os.environ))

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from served import FRAMES_PER_BLOCK, in_engine_fps, probed_streams, served_fps, start

from engine.families.wan.engine import WanEngine
from engine.families.wan.loader import load_wan_model
from inferix.client import Client


def layout(text: str) -> tuple[int, int]:
    """'2x1' -> (2 workers, 1 thread)."""
    workers, _, threads = text.partition("x")
    try:
        parsed = int(workers), int(threads)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a layout is WORKERSxTHREADS, e.g. 2x1; got {text!r}") from None
    if min(parsed) < 1:
        raise argparse.ArgumentTypeError(f"a layout needs at least one worker of one thread; got {text!r}")
    return parsed


def name(layout: tuple[int, int]) -> str:
    return f"{layout[0]}x{layout[1]}"


def side_by_side_fps(processes: int, sessions: int, blocks: int, go: Path) -> float:
    """Frames/s of `processes` one-thread in-engine processes run together, `sessions` split among them;
    they start once the file `go` exists."""
    children = []
    for i in range(processes):
        share = sessions // processes + (1 if i < sessions % processes else 0)
        cmd = [sys.executable, "-P", __file__, "--child", str(share), str(blocks), str(go)]
        children.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
    try:
        for child in children:  # each says "ready" once its model is loaded and warm
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    except BaseException:
        for child in children:
            child.kill()
        raise
    go.touch()
    spans = []
    for child in children:
        out, _ = child.communicate(timeout=900)
        if child.returncode:
            raise SystemExit(f"an in-engine child failed (exit {child.returncode})")
        spans.append(json.loads(out))
    frames = sum(span["frames"] for span in spans)
    return frames / (max(s["end"] for s in spans) - min(s["start"] for s in spans))


def child(sessions: int, blocks: int, go: Path) -> None:
    """One side-by-side in-engine process: load, warm up, wait for `go`, run, print its span."""
    torch.set_num_threads(1)
    engine = WanEngine(load_wan_model("toyworld"))
    in_engine_fps(engine, 1, 2)
    print("ready", flush=True)
    deadline = time.monotonic() + 600  # the parent died before it said go
    while not go.exists():
        if time.monotonic() > deadline:
            raise SystemExit("no go from the bench in 600 s")
        time.sleep(0.001)
    start = time.time()
    in_engine_fps(engine, sessions, blocks)
    end = time.time()
    print(json.dumps({"start": start, "end": end, "frames": sessions * blocks * FRAMES_PER_BLOCK}), flush=True)


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
        return
    cores = len(os.sched_getaffinity(0))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=8, help="sessions at once (default 8)")
    parser.add_argument("--blocks", type=int, default=48, help="blocks per session (default 48: 9 s of video)")
    parser.add_argument("--threads", type=int, default=cores, help=f"C: the cores to use (default {cores})")
    parser.add_argument(
        "--layouts",
        type=layout,
        nargs="+",
        help="served layouts WORKERSxTHREADS (default 1xC CxC Cx1)",
    )
    parser.add_argument(
        "--repeats", type=int, default=2, help="measure each figure this many times in turn and keep its best"
    )
    args = parser.parse_args()
    c = args.threads
    layouts = args.layouts or list(dict.fromkeys([(1, c), (c, c), (c, 1)]))
    torch.set_num_threads(c)
    with tempfile.TemporaryDirectory() as tmp:
        engine = WanEngine(load_wan_model("toyworld"))
        in_engine_fps(engine, 1, 2)  # warm-up
        size = (engine.model.width, engine.model.height)
        os.chdir(tmp)  # the services' `python -m` puts their working folder first on their path
        meshes = {lay: start(Path(tmp) / name(lay), lay[1], None, workers=lay[0]) for lay in layouts}
        best: dict[str, float] = {}

        def keep(label: str, fps: float) -> None:
            print(f"{label}: {fps:.1f} frames/s", flush=True)
            best[label] = max(best.get(label, 0.0), fps)

        try:
            clients = {lay: Client(mesh.address, timeout=900) for lay, mesh in meshes.items()}
            for client in clients.values():
                served_fps(client, 2, 2, size)  # warm-up
            for r in range(args.repeats):
                keep("one process", in_engine_fps(engine, args.sessions, args.blocks)[0])
                keep("side by side", side_by_side_fps(c, args.sessions, args.blocks, Path(tmp) / f"go{r}"))
                for lay, client in clients.items():
                    keep(name(lay), served_fps(client, args.sessions, args.blocks, size))
            for client in clients.values():
                client.close()
        finally:
            for mesh in meshes.values():
                mesh.stop()
        claims = {lay: probed_streams(Path(tmp) / f"probe{name(lay)}", lay[1], None, lay[0]) for lay in layouts}
    n, reference, fps = args.sessions, best["one process"], float(engine.model.fps)
    print(f"\ntoyworld, N = {n} sessions of {args.blocks} blocks, C = {c} cores, best of {args.repeats} run(s)")
    print(f"in-engine, one process of {c} threads:          {reference:7.1f} frames/s  1.00x")
    side = best["side by side"]
    print(f"in-engine, {c} processes of one thread together: {side:7.1f} frames/s  {side / reference:.2f}x")
    print(
        f"{'served':>8} {'frames/s':>9} {'/ in-engine':>12} {'per session':>12} {'probe claim':>12}"
        f"   ({fps:.0f} frames/s per session is real time)"
    )
    for lay in layouts:
        served = best[name(lay)]
        print(f"{name(lay):>8} {served:>9.1f} {served / reference:>11.2f}x {served / n:>12.1f} {claims[lay]:>12.0f}")


if __name__ == "__main__":
    main()
