"""What one committed block costs kvcache_svc's store as a session grows (issue 41: hour-long sessions).

Commits a toyworld-sized block (3 latent frames of 8x8x8, 6 KiB) to `BlockStore` until the session
holds each of the given lengths, then times the next commits there. An hour of toyworld is about
19,000 blocks. Prints the milliseconds per commit at each length and the ratio of the longest to the
shortest: a commit whose cost grows with the session shows a large ratio.

    python bench/commits.py [--blocks 1000,5000,19000] [--redis-url redis://127.0.0.1:6379/0]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np

from inferix.spec.blocks import CommittedBlock
from inferix.store import open_store
from kvcache_svc.blocks import BlockStore

TIMED = 50
SHAPE = (3, 8, 8, 8)


async def run(lengths: list[int], store_url: str) -> list[float]:
    store = open_store(store_url)
    blocks = BlockStore(store)
    latents = np.zeros(SHAPE, dtype="<f4").tobytes()
    session = f"bench-{time.time_ns()}"
    per_commit = []
    made = 0
    try:
        for length in lengths:
            while made < length:
                await blocks.commit(session, CommittedBlock(made, 3 * made, SHAPE, latents))
                made += 1
            began = time.perf_counter()
            for _ in range(TIMED):
                await blocks.commit(session, CommittedBlock(made, 3 * made, SHAPE, latents))
                made += 1
            per_commit.append((time.perf_counter() - began) / TIMED)
        await blocks.expire(session, 1.0)
    finally:
        await store.close()
    return per_commit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", default="1000,5000,19000", help="session lengths to time a commit at")
    parser.add_argument("--redis-url", default="memory://", help="the store (default: in-memory)")
    args = parser.parse_args()
    lengths = sorted(int(b) for b in args.blocks.split(","))
    per_commit = asyncio.run(run(lengths, args.redis_url))
    print(f"{'blocks':>8}{'ms per commit':>15}   store {args.redis_url}")
    for length, seconds in zip(lengths, per_commit, strict=True):
        print(f"{length:>8}{seconds * 1e3:>15.2f}")
    print(f"commit at {lengths[-1]} / at {lengths[0]} blocks: {per_commit[-1] / per_commit[0]:.2f}x")


if __name__ == "__main__":
    main()
