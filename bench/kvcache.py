"""KV-cache benchmarks: bytes per session by KV storage mode, host offload bandwidth, recovery by
recompute vs copy, placement rate.

0. Bytes: the real bytes (8-bit values plus their fp32 scales) of one session's pages with
   `kv_dtype` auto (the model's dtype, and bf16), fp8 and int8, and the ratios to bf16.
1. Offload/restore: a session's pages to host memory and back (pinned + async on CUDA), bytes/s.
2. Recovery: rebuilding a session's cache after a worker loss, as a function of how many blocks
   it has committed -- recompute (one context pass per block, what the mesh does) vs copying the
   same pages back from host memory (what shipping KV would cost at host-copy speed).
3. Placement: Admit decisions per second with 1,000 sessions over 50 workers (in-memory store).

    python bench/kvcache.py [--device cuda] [--dim 384 --layers 6 --latent 28x64]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import time

import torch

from engine.families.wan.dit import CausalWanDiT
from engine.families.wan.pipeline import ReplayBlock, WanPipeline
from engine.kv.page_codec import KV_DTYPES
from engine.kv.pool import KVPool, KVPoolSpec
from inferix.spec.architectures import WanDiTConfig
from inferix.spec.sampling import BlockConfig, PipelineConfig, SamplingConfig
from inferix.store import MemoryStore
from kvcache_svc.registry import KVReport, Registry


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bytes_per_session(spec: KVPoolSpec, pages: int) -> None:
    """Print a session's KV bytes in every storage mode, counted from the tensors a one-page pool of
    each really holds, and their ratios to bf16 pages."""
    bf16 = pages * dataclasses.replace(spec, dtype=torch.bfloat16, kv_dtype="auto").page_bytes
    modes = [(spec.dtype, "auto"), (torch.bfloat16, "auto"), *((spec.dtype, k) for k in KV_DTYPES if k != "auto")]
    for dtype, kv_dtype in dict.fromkeys(modes):
        pool = KVPool(dataclasses.replace(spec, num_pages=1, dtype=dtype, kv_dtype=kv_dtype))
        held = sum(t.numel() * t.element_size() for t in pool._page_tensors())
        assert held == pool.spec.page_bytes, (held, pool.spec.page_bytes)
        name = f"{kv_dtype} ({str(dtype).removeprefix('torch.')})" if kv_dtype == "auto" else kv_dtype
        print(
            f"KV {name:<16}{pages * held / 2**20:9.2f} MiB/session ({pages} pages)"
            f"{pages * held / bf16:7.3f}x bf16  read: {pool.kv_read_path}"
        )


def offload_bandwidth(pool: KVPool, tokens: int, frames: int, repeats: int) -> tuple[float, float, int]:
    cache = pool.open_session("bw", tokens)
    cache.begin(0, frames)  # allocate the pages (contents do not matter for a copy)
    nbytes = len(cache.pages) * pool.spec.page_bytes
    out, back = [], []
    for _ in range(repeats):
        sync(pool.k.device)
        t0 = time.perf_counter()
        cache.offload()
        sync(pool.k.device)
        t1 = time.perf_counter()
        cache.prefetch()
        sync(pool.k.device)
        out.append(t1 - t0)
        back.append(time.perf_counter() - t1)
    pool.close_session("bw")
    return nbytes / statistics.median(out), nbytes / statistics.median(back), nbytes


def recovery(pipeline: WanPipeline, lat: tuple[int, int], blocks: int, pool: KVPool) -> tuple[float, float]:
    """Seconds to rebuild the cache of a session with `blocks` committed blocks: (recompute, copy)."""
    prompt = torch.randn(1, pipeline.dit.config.text_len, pipeline.dit.config.text_dim)
    with pipeline.open_session(prompt, *lat, seed=0, num_blocks=blocks + 1) as session:
        committed = [
            ReplayBlock(b.start_frame, b.latents, prompt) for b in (session.generate_block() for _ in range(blocks))
        ]
    with pipeline.open_session(prompt, *lat, seed=0, num_blocks=blocks + 1) as session:
        sync(pipeline.device)
        t0 = time.perf_counter()
        session.replay(committed, next_block_index=blocks)
        sync(pipeline.device)
        recompute = time.perf_counter() - t0
        session.cache.offload()
        sync(pipeline.device)
        t1 = time.perf_counter()
        session.cache.prefetch()
        sync(pipeline.device)
        copy = time.perf_counter() - t1
    return recompute, copy


async def placement_rate(sessions: int, workers: int) -> float:
    registry = Registry(MemoryStore(), heartbeat_timeout_s=3600)
    for w in range(workers):
        await registry.register(f"w{w:03d}", f"127.0.0.1:{10000 + w}", "tiny", KVReport(total_pages=10_000))
    t0 = time.perf_counter()
    for s in range(sessions):
        await registry.admit(f"s{s:05d}", "tiny", pages=21)
    return sessions / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--latent", default="28x64", help="latent HxW (default 28x64 = 448 tokens/frame)")
    parser.add_argument("--blocks", default="1,2,4,8", help="committed blocks to recover from")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--kv-dtype", default="auto", choices=KV_DTYPES, help="KV storage of the timed runs")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    lat_h, lat_w = (int(v) for v in args.latent.split("x"))
    config = WanDiTConfig(
        dim=args.dim,
        ffn_dim=4 * args.dim,
        num_heads=args.heads,
        num_layers=args.layers,
        freq_dim=256,
        text_dim=512,
        text_len=64,
    )
    torch.manual_seed(0)
    dit = CausalWanDiT(config).to(device).eval()
    block = BlockConfig(num_frame_per_block=3)
    pipeline = WanPipeline(dit, PipelineConfig(block=block, sampling=SamplingConfig()))
    tokens = config.tokens_per_frame(lat_h, lat_w)
    print(f"DiT dim={args.dim} layers={args.layers} | {tokens} tokens/frame | {device}")

    counts = [int(b) for b in args.blocks.split(",")]
    pool = KVPool(pipeline.pool_spec(lat_h, lat_w, frames=3 * max(counts) * 2, kv_dtype=args.kv_dtype))
    bytes_per_session(pool.spec, 3 * max(counts))
    out_bw, in_bw, nbytes = offload_bandwidth(pool, tokens, 3 * max(counts), repeats=5)
    print(f"offload {out_bw / 2**30:.2f} GiB/s, restore {in_bw / 2**30:.2f} GiB/s ({nbytes / 2**20:.0f} MiB session)")

    print(f"{'blocks':>6}{'KV MiB':>9}{'recompute s':>13}{'copy s':>9}{'recompute/copy':>16}")
    for blocks in counts:
        recompute, copy = recovery(pipeline, (lat_h, lat_w), blocks, pool)
        mib = 3 * blocks * pool.spec.page_bytes / 2**20
        print(f"{blocks:>6}{mib:>9.1f}{recompute:>13.3f}{copy:>9.4f}{recompute / copy:>16.0f}x")

    rate = asyncio.run(placement_rate(1000, 50))
    print(f"placement: {rate:.0f} Admit decisions/s (1,000 sessions over 50 workers, in-memory store)")


if __name__ == "__main__":
    main()
