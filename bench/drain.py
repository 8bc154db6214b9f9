"""Scale-in / rolling update: how long a SIGTERM'd worker takes to hand its live sessions over.

A mesh of two workers (`inferix serve`'s processes on 127.0.0.1, the built-in toyworld model, one
torch thread per worker) runs `--sessions` sessions paced in real time (`--lookahead` blocks ahead of
playback). Once each has made `--stop-after` blocks, the worker running most of them gets SIGTERM (a
pod deleted or rolled); a fresh worker takes its place before the next repetition. Per moved session:

  handover   SIGTERM -> the session's first block done on the other worker
  stall      the gap between its two BlockDone events across the move (vs the normal gap: one block
             of video when generation keeps real time)
  frozen     seconds its real-time output stood still (the streamer's underruns, whole session)

and per repetition the drain: SIGTERM -> the worker process exited.

    python bench/drain.py [--sessions 3] [--blocks 64] [--stop-after 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from inferix.api.v1 import streamer_pb2, streamer_pb2_grpc
from inferix.client import BlockDone, Client
from inferix_cli.mesh import Mesh, MeshConfig, start_mesh
from inferix_cli.mesh.launch import ServiceProcess


@dataclass
class Run:
    """One session's BlockDone events with their arrival times (monotonic seconds)."""

    session_id: str
    blocks: list[tuple[float, BlockDone]] = field(default_factory=list)

    def follow(self, address: str) -> None:
        with Client(address, timeout=120) as client:
            for event in client.events(self.session_id):
                if isinstance(event, BlockDone):
                    self.blocks.append((time.monotonic(), event))


@dataclass
class Measured:
    handover_s: list[float] = field(default_factory=list)
    stall_s: list[float] = field(default_factory=list)
    normal_gap_s: list[float] = field(default_factory=list)
    frozen_s: list[float] = field(default_factory=list)
    drain_s: list[float] = field(default_factory=list)


def underrun_seconds(mesh: Mesh, session_id: str) -> float:
    with grpc.insecure_channel(mesh.streamer.address) as channel:
        stub = streamer_pb2_grpc.StreamerServiceStub(channel)
        reply = stub.GetStreamInfo(streamer_pb2.GetStreamInfoRequest(session_id=session_id), timeout=30)
    return float(reply.live.underrun_seconds)


def wait_registered(worker: ServiceProcess, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while "registered with kvcache_svc" not in worker.log_path.read_text():
        if time.monotonic() > deadline:
            raise SystemExit(f"{worker.name} did not register within {timeout:g}s; its log: {worker.log_path}")
        time.sleep(0.2)


def repetition(mesh: Mesh, args: argparse.Namespace, rep: int, measured: Measured) -> ServiceProcess:
    """Run the sessions, SIGTERM the busiest worker, measure; the stopped worker is returned."""
    with Client(mesh.address, timeout=120) as client:
        runs = [
            Run(client.create_session(f"a red ball {i}", num_blocks=args.blocks, seed=100 * rep + i).session_id)
            for i in range(args.sessions)
        ]
    threads = [threading.Thread(target=run.follow, args=(mesh.address,), daemon=True) for run in runs]
    for thread in threads:
        thread.start()
    while not all(len(run.blocks) > args.stop_after for run in runs):
        time.sleep(0.05)
    on = [run.blocks[-1][1].worker_id for run in runs]
    victim = next(w for w in mesh.workers if w.name == max(set(on), key=on.count))
    stopped_at = time.monotonic()
    os.kill(victim.serving_pid or victim.pid, signal.SIGTERM)
    code = victim.process.wait(120)
    measured.drain_s.append(time.monotonic() - stopped_at)
    for thread in threads:
        thread.join(600)
    for run, worker in zip(runs, on, strict=True):
        indices = [b.block_index for _, b in run.blocks]
        if indices != list(range(args.blocks)):
            raise SystemExit(f"session {run.session_id}: blocks {indices}, expected 0..{args.blocks - 1} once each")
        times = [t for t, _ in run.blocks]
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        if worker == victim.name:
            first = next(i for i, (_, b) in enumerate(run.blocks) if b.worker_id != victim.name)
            measured.handover_s.append(times[first] - stopped_at)
            measured.stall_s.append(gaps.pop(first - 1))
            measured.frozen_s.append(underrun_seconds(mesh, run.session_id))
        measured.normal_gap_s += gaps[2:]
    print(
        f"repetition {rep + 1}: {on.count(victim.name)} session(s) moved off {victim.name} (exit code {code}); "
        f"drain {measured.drain_s[-1]:.2f}s",
        flush=True,
    )
    return victim


def p50_max(values: list[float]) -> str:
    return f"p50 {statistics.median(values):.3f}s  max {max(values):.3f}s  (n={len(values)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=3, help="sessions running at once (default 3)")
    parser.add_argument("--blocks", type=int, default=64, help="blocks per session (default 64)")
    parser.add_argument("--stop-after", type=int, default=8, help="SIGTERM once each session made this many blocks")
    parser.add_argument("--repeats", type=int, default=3, help="repetitions, a fresh worker each (default 3)")
    parser.add_argument("--lookahead", type=int, default=2, help="blocks generated ahead of playback (default 2)")
    parser.add_argument("--model", type=Path, default=None, help="model folder or built-in (default toyworld)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.stop_after + 4 > args.blocks:
        parser.error("--blocks must exceed --stop-after by at least 4 (the sessions must outlive the SIGTERM)")
    with tempfile.TemporaryDirectory(prefix="inferix-bench-drain-") as tmp:
        config = MeshConfig(
            workdir=Path(tmp),
            workers=2,
            model=args.model,
            device=args.device,
            lookahead=args.lookahead,
            worker_threads=1,
            capacity_probe=0,
            realtime_streams=64,  # place by KV pages: the point is the handover, not admission
            rtmp="off",
        )
        mesh = start_mesh(config)
        measured = Measured()
        try:
            for rep in range(args.repeats):
                stopped = repetition(mesh, args, rep, measured)
                mesh.workers.remove(stopped)
                wait_registered(mesh.add_worker(f"{stopped.name.split('-')[0]}-r{rep + 1}"))
        finally:
            mesh.stop()
    print(f"handover (SIGTERM -> next block on the other worker): {p50_max(measured.handover_s)}")
    print(f"stall (BlockDone gap across the move):               {p50_max(measured.stall_s)}")
    print(f"normal BlockDone gap:                                {p50_max(measured.normal_gap_s)}")
    print(f"viewer frozen (streamer underruns, moved sessions):  {p50_max(measured.frozen_s)}")
    print(f"drain (SIGTERM -> worker exited):                    {p50_max(measured.drain_s)}")


if __name__ == "__main__":
    main()
