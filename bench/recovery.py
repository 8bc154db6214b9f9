"""Recovery time with and without KV snapshots: worker SIGKILL -> the next block on another worker.

For each mode (workers with `--snapshot-every auto`, then with `--snapshot-every 0`) one toyworld
session (64x64, one torch thread per worker, unpaced: lookahead larger than the session) runs through
a mesh of two workers. When the session's announced blocks reach each kill point, the worker making
it is SIGKILLed; the scheduler moves the session to the other worker, which restores it (the latest
snapshot plus at most N committed blocks, or every committed block from the first) and makes the
next block; a fresh worker then joins for the next kill (warmed by its one-session capacity probe,
as a serving worker is warm). Timed: from the SIGKILL to the first block the new worker reports.
With snapshots each point is killed `--repeats` times, GAP blocks apart (so the kills land at
different places between two snapshots), and its median is the point's figure; without, once (its
replay grows by about 10 ms a block, far past the noise). Both modes run the same session (prompt,
seed, kill points), one after the other in one run.

Also printed: the snapshot bytes of the session (what kvcache_svc holds for it) and the stall a
snapshot adds: the workers' `inferix_worker_snapshot_stall_seconds` (the copy on the engine thread,
during which the session's next block waits) against the mean block time, plus the same copy timed
in this process next to a block.

    python bench/recovery.py [--kills 100,1000,10000] [--repeats 3]
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
GAP = 7  # blocks between two kills at one point: they land at different places after a snapshot


@dataclass
class Run:
    mode: str
    recovery_s: dict[int, list[float]] = field(default_factory=dict)  # by kill point
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


def run_mode(mode: str, every: str, points: list[int], repeats: int, workdir: Path) -> Run:
    run = Run(mode)
    kills = [(point + GAP * i, point) for point in points for i in range(repeats)]  # (block, its point)
    config = MeshConfig(
        workdir=workdir,
        workers=2,
        worker_threads=1,
        lookahead=kills[-1][0] + 100,  # unpaced: generation runs as fast as the worker goes
        rtmp="off",
        capacity_probe=1,  # claims are pinned below; the one probe session warms the worker up
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
            point = 0
            for event in client.events(info.session_id):
                if not isinstance(event, BlockDone):
                    continue
                if event.engine_ms and not killed:
                    run.block_ms.append(event.engine_ms)
                if killed and event.worker_id != killed:
                    run.recovery_s.setdefault(point, []).append(time.perf_counter() - killed_at)
                    killed = ""
                    if not pending:
                        break
                    mesh.add_worker(f"{event.worker_id}-next")  # the next kill's successor, started after this one
                if pending and event.block_index + 1 >= pending[0][0] and not killed:
                    point = pending.pop(0)[1]
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
        if pending or killed:
            raise RuntimeError(f"{mode}: the session ended before its kills at {[k for k, _ in pending]} blocks")
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
    parser.add_argument("--kills", default="100,1000,10000", help="kill the session's worker after these many blocks")
    parser.add_argument(
        "--repeats", type=int, default=3, help="with snapshots: kills per point, GAP blocks apart (default 3)"
    )
    args = parser.parse_args()
    kills = sorted(int(k) for k in args.kills.split(","))
    torch.set_num_threads(1)
    block_ms, copy_ms, size = in_process_stall()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode, every in (("snapshots (auto)", "auto"), ("replay from block 0", "0")):
            began = time.perf_counter()
            repeats = args.repeats if every == "auto" else 1
            runs.append(run_mode(mode, every, kills, repeats, Path(tmp) / every))
            print(f"{mode}: {time.perf_counter() - began:.0f} s", flush=True)
    print(f"toyworld 64x64, 1 torch thread per worker; kills after {', '.join(map(str, kills))} blocks")
    print("seconds from the SIGKILL to the next block; with several kills per point, their median (and each)")
    print(f"{'mode':<22}" + "".join(f"{f'kill@{k} s':>14}" for k in kills) + f"{'max/min':>10}")
    medians = [{k: statistics.median(t) for k, t in run.recovery_s.items()} for run in runs]
    for run, median in zip(runs, medians, strict=True):
        spread = max(median.values()) / min(median.values()) if median else float("nan")
        print(f"{run.mode:<22}" + "".join(f"{median.get(k, float('nan')):>14.2f}" for k in kills) + f"{spread:>10.2f}")
        for k in kills:
            if len(run.recovery_s.get(k, [])) > 1:
                print(f"  kill@{k}: " + ", ".join(f"{t:.2f}" for t in run.recovery_s[k]))
    with_snapshots, without = medians
    print(
        "without/with snapshots: "
        + ", ".join(
            f"{without[k] / with_snapshots[k]:.1f}x at {k}" for k in kills if k in without and k in with_snapshots
        )
    )
    print(f"snapshot bytes per session (kvcache_svc): {runs[0].snapshot_bytes}")
    served_block = statistics.median(runs[0].block_ms)
    if runs[0].stall_s:
        stall_ms = statistics.mean(runs[0].stall_s) * 1e3
        print(
            f"served: snapshot stall {stall_ms:.2f} ms vs block {served_block:.1f} ms ({stall_ms / served_block:.2%})"
        )
    print(f"in-process: snapshot copy {copy_ms:.2f} ms vs block {block_ms:.1f} ms ({copy_ms / block_ms:.2%}); "
          f"{size} bytes serialised")  # fmt: skip
    for run in runs:  # the history each successor restored (the kill lands a few blocks after its point)
        print(f"[{run.mode}] " + " | ".join(line.split(" INFO ")[-1].split(" ", 2)[-1] for line in run.restore_log))


if __name__ == "__main__":
    main()
