"""Served throughput per worker: N sessions through `inferix serve` vs the same N batched in-engine.

In-engine: N toyworld sessions of one `WanEngine`, every block (DiT and decode) run through one
`BlockBatcher`, as a worker runs them, as fast as it goes. Served: one worker of a mesh on
127.0.0.1 (scheduler -> worker -> streamer + kvcache_svc), N sessions created at once by the SDK
with a lookahead past their length (throughput, not real-time pacing), frames/s from the first
create to the last completion. Two meshes side by side: the worker's OpenMP threads spinning a while
before they sleep (libgomp's default, the worker's before) and sleeping at once (OMP_WAIT_POLICY=
PASSIVE, the worker's default now). All with the same torch threads, in one run; the worker also
reports the sessions per batched forward.

    python bench/served.py [--sessions 1 2 4 8] [--blocks 24] [--threads 2]
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
import urllib.request
from pathlib import Path

import torch

from engine.families.wan.engine import WanEngine
from engine.families.wan.loader import load_wan_model
from inferix.client import BlockDone, Client, StateChanged
from inferix_cli.mesh import Mesh, MeshConfig, start_mesh

FRAMES_PER_BLOCK = 3  # toyworld: a latent frame is a video frame


def in_engine_fps(engine: WanEngine, n: int, blocks: int) -> float:
    sessions = [engine.open(f"a ball number {i}", seed=i, num_blocks=blocks) for i in range(n)]
    batcher = engine.batcher()
    began = time.perf_counter()
    with torch.no_grad():
        for _ in range(blocks):
            for session in sessions:
                batcher.add(session.block_job())
            while batcher.busy:
                batcher.step()
    seconds = time.perf_counter() - began
    for session in sessions:
        session.close()
    return n * blocks * FRAMES_PER_BLOCK / seconds


def served_fps(client: Client, n: int, blocks: int) -> float:
    began = time.perf_counter()
    ids = [client.create_session(f"a ball number {i}", num_blocks=blocks, seed=i).session_id for i in range(n)]
    frames = 0
    for session_id in ids:
        for event in client.events(session_id):
            if isinstance(event, BlockDone):
                frames += event.num_frames
            if isinstance(event, StateChanged) and event.state in ("completed", "failed", "cancelled"):
                assert event.state == "completed", event
    return frames / (time.perf_counter() - began)


def batch_histogram(port: int) -> tuple[float, float]:
    """(forwards, sessions summed over them) from the worker's inferix_worker_batch_sessions."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    count = float(re.search(r"^inferix_worker_batch_sessions_count (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]
    total = float(re.search(r"^inferix_worker_batch_sessions_sum (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]
    return count, total


# The worker's OpenMP wait before (libgomp's default when OMP_WAIT_POLICY is unset: spin 300,000 rounds,
# then sleep; GOMP_SPINCOUNT takes precedence over the policy the worker now sets) and now (sleep at once).
WAITS = {"spin": {"GOMP_SPINCOUNT": "300000"}, "sleep": {}}


def start(workdir: Path, threads: int, env: dict[str, str]) -> Mesh:
    config = MeshConfig(
        workdir=workdir,
        workers=1,
        worker_threads=threads,
        lookahead=100_000,
        realtime_streams=64,
        capacity_probe=0,
        rtmp="off",
        env=env,
    )
    return start_mesh(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--blocks", type=int, default=24, help="blocks per session (default 24: 4.5 s of video)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in-engine and of the worker (default 2)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = WanEngine(load_wan_model("toyworld"))
    in_engine_fps(engine, 1, 2)  # warm-up
    policies = tuple(WAITS)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        meshes = {policy: start(Path(tmp) / policy, args.threads, WAITS[policy]) for policy in policies}
        try:
            clients = {policy: Client(mesh.address, timeout=900) for policy, mesh in meshes.items()}
            for client in clients.values():
                served_fps(client, 1, 2)  # warm-up
            for n in args.sessions:
                row: dict[str, float] = {"engine": in_engine_fps(engine, n, args.blocks)}
                for policy in policies:
                    port = meshes[policy].workers[0].metrics_port or 0
                    before = batch_histogram(port)
                    row[policy] = served_fps(clients[policy], n, args.blocks)
                    after = batch_histogram(port)
                    row[f"{policy}_batch"] = (after[1] - before[1]) / max(after[0] - before[0], 1)
                rows.append((n, row))
                print(f"N={n}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()), flush=True)
            for client in clients.values():
                client.close()
        finally:
            for mesh in meshes.values():
                mesh.stop()
    print(f"\ntoyworld, {args.blocks} blocks per session, {args.threads} torch threads, one worker per mesh")
    print(
        f"{'N':>3} {'in-engine fps':>14} {'served, spin':>13} {'served, sleep':>14} "
        f"{'spin/engine':>12} {'sleep/engine':>13} {'sessions/forward (sleep)':>25}"
    )
    for n, row in rows:
        print(
            f"{n:>3} {row['engine']:>14.1f} {row['spin']:>13.1f} {row['sleep']:>14.1f} "
            f"{row['spin'] / row['engine']:>11.2f}x {row['sleep'] / row['engine']:>12.2f}x "
            f"{row['sleep_batch']:>25.2f}"
        )


if __name__ == "__main__":
    main()
