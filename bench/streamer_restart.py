"""Streamer restart: SIGKILL of the streamer -> the session's next block, after 100 to thousands of blocks.

One toyworld session (64x64, one worker at one torch thread, unpaced: lookahead larger than the
session) runs through `inferix serve`'s mesh. When the session's announced blocks reach each kill
point, the streamer is SIGKILLed and started again on the same recordings folder. Frames wait at the
worker while it is away, so no block is announced until the restarted streamer has what it lacks;
timed: from the SIGKILL to the next block announced (this includes starting the streamer process,
and the worker's retry and reconnect backoff, whose phase makes single kills vary by up to a second:
each point is killed `--repeats` times, GAP blocks apart, and its median is the point's figure).

With `--before DIR` (a source tree of an earlier commit, e.g. `git archive COMMIT | tar -x -C DIR`)
the same session runs on a second mesh from that tree, in the same run, one after the other: there a
restarted streamer got the video again from frame 0, decoded again from every committed block.
At the end: the session's frame count and frames digest at the streamer, which must equal those of
`inferix generate` (printed for this tree).

    python -P bench/streamer_restart.py [--kills 100,1000,4000] [--repeats 3] [--before DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from inferix.api.v1 import streamer_pb2, streamer_pb2_grpc
from inferix.client import BlockDone, Client
from inferix_cli.mesh import Mesh, MeshConfig, start_mesh

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "a red ball bouncing to the right"
SEED = 7
EXTRA_BLOCKS = 20  # after the last kill: the session then completes
GAP = 7  # blocks between two kills at one point


def start(workdir: Path, tree: Path) -> Mesh:
    config = MeshConfig(
        workdir=workdir,
        workers=1,
        worker_threads=1,
        lookahead=100_000,
        realtime_streams=64,
        rtmp="off",
        env={"PYTHONPATH": str(tree)},
    )
    return start_mesh(config)


def session_blocks(points: list[int], repeats: int) -> int:
    return points[-1] + (repeats - 1) * GAP + EXTRA_BLOCKS


def run_tree(
    name: str, tree: Path, workdir: Path, points: list[int], repeats: int
) -> tuple[dict[int, list[float]], str, int]:
    """Kill the streamer at each point; returns (seconds to the next block by point, digest, frames)."""
    mesh = start(workdir, tree)
    recovery: dict[int, list[float]] = {p: [] for p in points}
    try:
        with Client(mesh.address, timeout=1800) as client:
            info = client.create_session(PROMPT, num_blocks=session_blocks(points, repeats), seed=SEED)
            pending = sorted((p + r * GAP, p) for p in points for r in range(repeats))
            killed_at = 0.0
            killed_point = killed_block = 0
            for event in client.events(info.session_id):
                if not isinstance(event, BlockDone):
                    continue
                if killed_at:
                    recovery[killed_point].append(time.perf_counter() - killed_at)
                    print(f"{name}: streamer killed after block {killed_block}: next block in "
                          f"{recovery[killed_point][-1]:.2f} s", flush=True)  # fmt: skip
                    killed_at = 0.0
                if pending and event.block_index + 1 >= pending[0][0]:
                    killed_block, killed_point = pending.pop(0)
                    killed_at = time.perf_counter()
                    mesh.streamer.kill()
                    mesh.replace(mesh.relaunch(mesh.streamer).wait())  # type: ignore[union-attr]
            streamed = mesh_stream_info(mesh, info.session_id)
    finally:
        mesh.stop()
    return recovery, streamed[0], streamed[1]


def mesh_stream_info(mesh: Mesh, session_id: str) -> tuple[str, int]:
    with grpc.insecure_channel(mesh.streamer.address) as channel:
        stub = streamer_pb2_grpc.StreamerServiceStub(channel)
        reply = stub.GetStreamInfo(streamer_pb2.GetStreamInfoRequest(session_id=session_id), timeout=30)
    return reply.frames_sha256, reply.frames


def generated(blocks: int, out_dir: Path) -> tuple[str, int]:
    """Frames digest and count of the same session made by `inferix generate` (this tree)."""
    out = subprocess.run(
        [sys.executable, "-m", "inferix_cli", "generate", "--model", "toyworld", "--prompt", PROMPT, "--seed",
         str(SEED), "--blocks", str(blocks), "--threads", "1", "--quiet", "--out", str(out_dir / "generate.mp4")],
        capture_output=True, text=True, check=True, cwd=tempfile.gettempdir(),
    )  # fmt: skip
    digest = re.search(r"frames sha256 ([0-9a-f]+)", out.stdout)
    frames = re.search(r": (\d+) frames", out.stdout)
    assert digest and frames, out.stdout
    return digest.group(1), int(frames.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", default="100,1000,4000", help="kill the streamer after these many blocks")
    parser.add_argument("--repeats", type=int, default=3, help="kills per point (default 3; the median counts)")
    parser.add_argument("--before", type=Path, help="an earlier commit's source tree, run side by side (see above)")
    args = parser.parse_args()
    points = sorted(int(p) for p in args.kills.split(","))
    trees = {"now": ROOT, **({"before": args.before.resolve()} if args.before else {})}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # the services' `python -m` puts their working folder first on their path
        for name, tree in trees.items():
            results[name] = run_tree(name, tree, Path(tmp) / name, points, args.repeats)
        reference = generated(session_blocks(points, args.repeats), Path(tmp))
    print(
        "\ntoyworld 64x64, one session, unpaced; seconds from the streamer's SIGKILL to the next block "
        f"(median of {args.repeats} kills per point)"
    )
    print(f"{'tree':>7} " + " ".join(f"{f'after {p}':>12}" for p in points) + f" {'last/first':>11}  frames digest")
    medians = {name: {p: statistics.median(s) for p, s in result[0].items()} for name, result in results.items()}
    for name, (_, digest, frames) in results.items():
        recovery = medians[name]
        cells = " ".join(f"{recovery[p]:>12.2f}" for p in points)
        ratio = recovery[points[-1]] / recovery[points[0]]
        if name == "now":
            same = "= generate" if (digest, frames) == reference else f"!= generate ({frames} frames)"
        else:  # an earlier tree may define the digest otherwise: compare the frame count
            same = f"{frames} frames, {'=' if frames == reference[1] else '!='} generate's"
        print(f"{name:>7} {cells} {ratio:>10.2f}x  {same}")
    if "before" in results:
        now, before = medians["now"], medians["before"]
        print("before/now: " + ", ".join(f"after {p}: {before[p] / now[p]:.1f}x" for p in points))


if __name__ == "__main__":
    main()
