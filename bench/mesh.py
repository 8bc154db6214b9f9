"""Mesh overhead: the same generation in-process vs through the gRPC mesh, side by side.

In-process: `WanEngine` (DiT + VAE decode) in this process. Mesh: `inferix serve`'s
processes on 127.0.0.1 (scheduler -> worker -> streamer + kvcache_svc), driven by the SDK.
Both use the tiny built-in model, one torch thread, the same seed and prompts; runs alternate.

    python bench/mesh.py [--blocks 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

import torch

from engine.families.wan.engine import WanEngine
from engine.families.wan.loader import load_wan_model
from inferix.client import BlockDone, Client, StateChanged
from inferix_cli.mesh import MeshConfig, start_mesh


def in_process(generator: WanEngine, blocks: int, seed: int) -> tuple[float, float]:
    started = time.perf_counter()
    first = 0.0
    with generator.open("a red ball bouncing", seed=seed, num_blocks=blocks) as video:
        for block in video:
            if block.index == 0:
                first = time.perf_counter() - started
    return first, time.perf_counter() - started


def through_mesh(client: Client, blocks: int, seed: int) -> tuple[float, float]:
    started = time.perf_counter()
    first = 0.0
    info = client.create_session("a red ball bouncing", num_blocks=blocks, seed=seed, model="tiny")
    for event in client.events(info.session_id):
        if isinstance(event, BlockDone) and event.block_index == 0:
            first = time.perf_counter() - started
        if isinstance(event, StateChanged) and event.state in ("completed", "failed", "cancelled"):
            assert event.state == "completed", event
    return first, time.perf_counter() - started


def dispatch_overhead_ms(metrics_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    values = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("inferix_dispatch_overhead_seconds_")
    }
    return 1e3 * values["inferix_dispatch_overhead_seconds_sum"] / values["inferix_dispatch_overhead_seconds_count"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    generator = WanEngine(load_wan_model("tiny"))
    with tempfile.TemporaryDirectory() as tmp:
        mesh = start_mesh(MeshConfig(workdir=Path(tmp), workers=1, worker_threads=1, lookahead=64, model=Path("tiny")))
        try:
            client = Client(mesh.address, timeout=120)
            in_process(generator, 1, 0), through_mesh(client, 1, 0)  # warm-up both paths
            local: list[tuple[float, float]] = []
            remote: list[tuple[float, float]] = []
            for repeat in range(args.repeats):
                local.append(in_process(generator, args.blocks, repeat))
                remote.append(through_mesh(client, args.blocks, repeat))
            dispatch_ms = dispatch_overhead_ms(mesh.scheduler.metrics_port or 0)
            client.close()
        finally:
            mesh.stop()

    def median(runs: list[tuple[float, float]], i: int) -> float:
        return statistics.median(r[i] for r in runs)

    print(f"tiny model, {args.blocks} blocks, {args.repeats} repeats (medians), 1 torch thread")
    print(f"{'path':<12}{'first block ms':>16}{'total s':>10}")
    for name, runs in (("in-process", local), ("mesh", remote)):
        print(f"{name:<12}{median(runs, 0) * 1e3:>16.0f}{median(runs, 1):>10.2f}")
    print(
        f"mesh/in-process total time {median(remote, 1) / median(local, 1):.3f}x | "
        f"extra time to first block {1e3 * (median(remote, 0) - median(local, 0)):+.0f} ms | "
        f"scheduler dispatch cost {dispatch_ms:.2f} ms/block"
    )


if __name__ == "__main__":
    main()
