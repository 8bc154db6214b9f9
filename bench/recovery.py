"""Recovery time with and without KV snapshots: worker SIGKILL -> the next block on another worker.

For each mode (workers with `--snapshot-every auto`, then with `--snapshot-every 0`) one toyworld
session (64x64, one torch thread per worker, unpaced: lookahead larger than the session) runs through
a mesh of two workers. When the session's announced blocks reach each kill point, the worker making
it is SIGKILLed; the scheduler moves the session to the other worker, which restores it (the latest
snapshot plus at most N committed blocks, or every committed block from the first) and makes the
next block; a fresh worker then joins for the next kill. Timed: from the SIGKILL to the first block
the new worker reports. Both modes run the same session (prompt, seed, kill points), one after the
other in one run.

Also printed: the snapshot bytes of the session (what kvcache_svc holds for it) and the stall a
snapshot adds: the workers' `inferix_worker_snapshot_stall_seconds` (the copy on the engine thread,
during which the session's next block waits) against the mean block time, plus the same copy timed
in this process next to a block.

    python bench/recovery.py [--kills 100,1000,3000]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import torch

from engine.contract import SessionRequest
from engine.registry import load_engine
from inferix.api.v1 import kvcache_pb2, kvcache_pb2_grpc
from inferix.client import BlockDone, Client
from inferix.server import INTERNAL_TOKEN_ENV, INTERNAL_TOKEN_HEADER
from inferix_cli.mesh import Mesh, MeshConfig, start_mesh

PROMPT = "a red ball bouncing to the right"
SEED = 7


@dataclass
class Run:
    mode: str
    recovery_s: list[float] = field(default_factory=list)
    restore_log: list[str] = field(default_factory=list)
    snapshot_bytes: int = 0
    stall_s: list[float] = field(default_factory=list)  # mean stall per worker that snapshotted
    block_ms: list[float] = field(default_factory=list)


def worker_stall(mesh: Mesh, name: str) -> tuple[float, float] | None:
    """(sum, count) of a worker's snapshot stall histogram, read from its metrics endpoint."""
    worker = next(w for w in mesh.workers if w.name == name)
    if not worker.metrics_port:
        return None
    text = urllib.request.urlopen(f"http://127.0.0.1:{worker.metrics_port}/metrics", timeout=10).read().decode()
    values = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("inferix_worker_snapshot_stall_seconds_")
    }
    count = values.get("inferix_worker_snapshot_stall_seconds_count", 0.0)
    return (values["inferix_worker_snapshot_stall_seconds_sum"], count) if count else None


def snapshot_bytes(mesh: Mesh, session_id: str) -> int:
    token = (
        ((INTERNAL_TOKEN_HEADER, mesh.config.env[INTERNAL_TOKEN_ENV]),) if INTERNAL_TOKEN_ENV in mesh.config.env else ()
    )
    with grpc.insecure_channel(mesh.kvcache.address) as channel:
        stub = kvcache_pb2_grpc.KVCacheServiceStub(channel)
        reply = stub.GetSnapshot(kvcache_pb2.GetSnapshotRequest(session_id=session_id), timeout=30, metadata=token)
    return len(reply.snapshot.state) if reply.found else 0


def run_mode(mode: str, every: str, kills: list[int], workdir: Path) -> Run:
    run = Run(mode)
    config = MeshConfig(
        workdir=workdir,
        workers=2,
        worker_threads=1,
        lookahead=kills[-1] + 100,  # unpaced: generation runs as fast as the worker goes
        rtmp="off",
        capacity_probe=0,
        realtime_streams=64,
        snapshot_every=None if every == "auto" else int(every),
    )
    mesh = start_mesh(config)
    try:
        with Client(mesh.address, timeout=600) as client:
            info = client.create_session(PROMPT, seed=SEED)  # unbounded: it runs until the last recovery
            pending = list(kills)
            killed_at = 0.0
            killed = ""
            for event in client.events(info.session_id):
                if not isinstance(event, BlockDone):
                    continue
                if event.engine_ms and not killed:
                    run.block_ms.append(event.engine_ms)
                if killed and event.worker_id != killed:
                    run.recovery_s.append(time.perf_counter() - killed_at)
                    killed = ""
                    if not pending:
                        break
                    mesh.add_worker(f"{event.worker_id}-next")  # the next kill's successor, started after this one
                if pending and event.block_index + 1 >= pending[0] and not killed:
                    pending.pop(0)
                    stall = worker_stall(mesh, event.worker_id)
                    if stall is not None:
                        run.stall_s.append(stall[0] / stall[1])
                    if not pending:
                        run.snapshot_bytes = snapshot_bytes(mesh, info.session_id)
                    victim = next(w for w in mesh.workers if w.name == event.worker_id)
                    killed_at = time.perf_counter()
                    victim.kill()
                    killed = victim.name
                    mesh.workers.remove(victim)
        for log in sorted(workdir.glob("worker*.log")):
            run.restore_log += [line.strip() for line in log.read_text().splitlines() if " restored from " in line]
    finally:
        mesh.stop()
    return run


def in_process_stall() -> tuple[float, float, int]:
    """(median block ms, median snapshot copy ms, snapshot bytes) of toyworld in this process."""
    engine = load_engine("toyworld", kv_pages=32)
    blocks, copies = [], []
    with engine.open_session(SessionRequest(prompt=PROMPT, seed=SEED)) as session:
        for _ in range(30):
            began = time.perf_counter()
            session.next_block()
            blocks.append(time.perf_counter() - began)
            began = time.perf_counter()
            snapshot = session.snapshot()
            copies.append(time.perf_counter() - began)
        size = len(snapshot.encode())
    return statistics.median(blocks) * 1e3, statistics.median(copies) * 1e3, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", default="100,1000,3000", help="kill the session's worker after these many blocks")
    args = parser.parse_args()
    kills = sorted(int(k) for k in args.kills.split(","))
    torch.set_num_threads(1)
    block_ms, copy_ms, size = in_process_stall()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode, every in (("snapshots (auto)", "auto"), ("replay from block 0", "0")):
            began = time.perf_counter()
            runs.append(run_mode(mode, every, kills, Path(tmp) / every))
            print(f"{mode}: {time.perf_counter() - began:.0f} s", flush=True)
    print(f"toyworld 64x64, 1 torch thread per worker; kills after {', '.join(map(str, kills))} blocks")
    print(f"{'mode':<22}" + "".join(f"{f'kill@{k} s':>14}" for k in kills) + f"{'max/min':>10}")
    for run in runs:
        times = run.recovery_s
        spread = max(times) / min(times) if times else float("nan")
        print(f"{run.mode:<22}" + "".join(f"{t:>14.2f}" for t in times) + f"{spread:>10.2f}")
    with_snapshots, without = runs
    print(
        "without/with snapshots: "
        + ", ".join(
            f"{b / a:.1f}x at {k}"
            for k, a, b in zip(kills, with_snapshots.recovery_s, without.recovery_s, strict=False)
        )
    )
    print(f"snapshot bytes per session (kvcache_svc): {with_snapshots.snapshot_bytes}")
    served_block = statistics.median(with_snapshots.block_ms)
    if with_snapshots.stall_s:
        stall_ms = statistics.mean(with_snapshots.stall_s) * 1e3
        print(
            f"served: snapshot stall {stall_ms:.2f} ms vs block {served_block:.1f} ms ({stall_ms / served_block:.2%})"
        )
    print(f"in-process: snapshot copy {copy_ms:.2f} ms vs block {block_ms:.1f} ms ({copy_ms / block_ms:.2%}); "
          f"{size} bytes serialised")  # fmt: skip
    for run in runs:  # the history each successor restored (the kill lands a few blocks after its point)
        print(f"[{run.mode}] " + " | ".join(line.split(" INFO ")[-1].split(" ", 2)[-1] for line in run.restore_log))


if __name__ == "__main__":
    main()
