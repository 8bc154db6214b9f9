"""The store a long session fills: kvcache_svc's bytes for one session in Redis, as its blocks go by.

One toyworld session (64x64, one worker at one torch thread, unpaced: lookahead larger than the
session, KV snapshots at the workers' default `auto`, recorded by the streamer) runs through `inferix
serve`'s mesh with a redis-server this script starts. Every `--every` blocks the session's keys in
the store (committed blocks, their index, snapshots, anchor, candidates; everything under `kvcache/`
that names it) are summed, with Redis's own `used_memory`.

With `--before DIR` (a source tree of an earlier commit, e.g. `git archive COMMIT | tar -x -C DIR`)
the same session runs on a second mesh from that tree, in the same run, on another Redis database:
there every committed block stayed in the store until the session's release.

    python -P bench/store_growth.py [--blocks 3000] [--every 500] [--before DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from inferix.client import BlockDone, Client
from inferix.store import open_store
from inferix_cli.mesh import MeshConfig, start_mesh

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "a red ball bouncing to the right"
SEED = 7


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    for _ in range(100):
        if subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).stdout.strip() == b"PONG":
            return process, port
        time.sleep(0.1)
    raise RuntimeError("redis-server did not start")


def used_memory(port: int) -> int:
    info = subprocess.run(["redis-cli", "-p", str(port), "info", "memory"], capture_output=True, text=True).stdout
    return int(next(line.split(":")[1] for line in info.splitlines() if line.startswith("used_memory:")))


async def session_bytes(url: str, session_id: str) -> tuple[int, int]:
    """(bytes, keys) of everything kvcache_svc keeps for the session."""
    store = open_store(url)
    try:
        keys = [k for k in await store.list_prefix("kvcache/") if session_id in k]
        values = await store.get_many(keys)
        return sum(len(v) for v in values if v is not None), len(keys)
    finally:
        await store.close()


Sample = tuple[int, int, int, int]  # blocks done, the session's bytes and keys in the store, redis used_memory


def run_tree(name: str, tree: Path, workdir: Path, url: str, port: int, blocks: int, every: int) -> list[Sample]:
    """One session's samples, every `every` blocks."""
    config = MeshConfig(
        workdir=workdir,
        workers=1,
        worker_threads=1,
        lookahead=100_000,
        realtime_streams=64,
        rtmp="off",
        redis_url=url,
        env={"PYTHONPATH": str(tree)},
    )
    mesh = start_mesh(config)
    samples = []
    try:
        with Client(mesh.address, timeout=1800) as client:
            info = client.create_session(PROMPT, num_blocks=blocks, seed=SEED)
            for event in client.events(info.session_id):
                if isinstance(event, BlockDone) and (event.block_index + 1) % every == 0:
                    stored, keys = asyncio.run(session_bytes(url, info.session_id))
                    redis_bytes = used_memory(port)
                    samples.append((event.block_index + 1, stored, keys, redis_bytes))
                    print(f"{name}: {event.block_index + 1} blocks: {stored / 2**10:.0f} KiB in {keys} keys for the "
                          f"session, redis {redis_bytes / 2**20:.1f} MiB", flush=True)  # fmt: skip
    finally:
        mesh.stop()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=3000, help="the session's length in blocks (default 3000)")
    parser.add_argument("--every", type=int, default=500, help="sample every this many blocks (default 500)")
    parser.add_argument("--before", type=Path, help="an earlier commit's source tree, run side by side (see above)")
    args = parser.parse_args()
    trees = {"now": ROOT, **({"before": args.before.resolve()} if args.before else {})}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # the services' `python -m` puts their working folder first on their path
        redis, port = start_redis(Path(tmp))
        try:
            for db, (name, tree) in enumerate(trees.items()):
                url = f"redis://127.0.0.1:{port}/{db}"
                results[name] = run_tree(name, tree, Path(tmp) / name, url, port, args.blocks, args.every)
        finally:
            redis.terminate()
            redis.wait()
    print("\ntoyworld 64x64, one session, unpaced, snapshots auto; KiB kvcache_svc keeps for the session")
    points = [s[0] for s in results["now"]]
    print(f"{'tree':>7} " + " ".join(f"{f'{p} blocks':>12}" for p in points) + f" {'growth/1000 blocks':>20}")
    for name, samples in results.items():
        cells = " ".join(f"{s[1] / 2**10:>12.0f}" for s in samples)
        half = len(samples) // 2
        slope = (samples[-1][1] - samples[half][1]) / max(samples[-1][0] - samples[half][0], 1) * 1000
        print(f"{name:>7} {cells} {slope / 2**10:>16.0f} KiB")
    if "before" in results:
        now, before = results["now"][-1][1], results["before"][-1][1]
        print(f"before/now after {points[-1]} blocks: {before / now:.1f}x")


if __name__ == "__main__":
    main()
