"""Engine benchmark: per-block latency and KV bytes, paged pool vs the contiguous reference cache.

Both caches run through the same block loop and the same DiT in one process, interleaved, so the
ratio is measured side by side. Random weights; no checkpoint needed.

    python bench/engine.py                                  # mid-size CPU config
    python bench/engine.py --device cuda --preset wan2.1-1.3b --dtype bf16   # real 480x832 shapes
    python bench/engine.py --device cuda --preset magi1-4.5b-distill --dtype bf16   # MAGI-1: bench/magi.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from inferix.spec.architectures import DIT_PRESETS, WanDiTConfig
from inferix.spec.magi import magi_presets
from inferix.spec.sampling import SamplingConfig
from workers.engine.flow_match import FlowMatchSchedule
from workers.engine.kv import ContiguousKVCache, KVPool, KVPoolSpec, SelfAttentionCache
from workers.engine.models.wan.dit import CausalWanDiT
from workers.engine.noise import SeededNoise

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--preset",
        choices=sorted(DIT_PRESETS) + magi_presets(),
        help="real model shapes (random weights); a MAGI-1 preset runs bench/magi.py at 720x720",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--latent", default="28x64", help="latent HxW (default 28x64 = 448 tokens/frame)")
    p.add_argument("--blocks", type=int, default=7)
    p.add_argument("--frames-per-block", type=int, default=3)
    p.add_argument("--window", type=int, default=12, help="local_attn_size in frames (-1 = global)")
    p.add_argument("--sink", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    p.add_argument("--json", type=Path, metavar="OUT", help="also write the figures to OUT as JSON")
    return p.parse_args()


def model_config(args: argparse.Namespace) -> WanDiTConfig:
    if args.preset:
        return replace(DIT_PRESETS[args.preset], text_len=64)
    return WanDiTConfig(
        dim=args.dim,
        ffn_dim=4 * args.dim,
        num_heads=args.heads,
        num_layers=args.layers,
        freq_dim=256,
        text_dim=512,
        text_len=64,
    )


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_session(
    dit: CausalWanDiT, cache: SelfAttentionCache, args: argparse.Namespace, shape: tuple[int, ...]
) -> list[tuple[float, float]]:
    """The block loop of the pipeline; returns (denoise seconds, context-pass seconds) per block."""
    device = dit.patch_embedding.weight.device
    sampling = SamplingConfig(denoising_steps=tuple(1000 - 250 * i for i in range(args.steps)))
    schedule = FlowMatchSchedule(sampling.schedule)
    timesteps = schedule.denoising_timesteps(sampling)
    prompt = dit.encode_prompt(torch.randn(1, dit.config.text_len, dit.config.text_dim, device=device))
    noise = SeededNoise(0)
    nf = args.frames_per_block
    times = []
    for block in range(args.blocks):
        sync(device)
        t0 = time.perf_counter()
        x = noise.initial(block, shape).to(device)
        for i, t_value in enumerate(timesteps):
            t = torch.full((1, nf), float(t_value), device=device)
            x0 = schedule.x0_from_flow(x, dit(x, t, prompt, cache, block * nf), t)
            if i + 1 < len(timesteps):
                t_next = torch.full((1, nf), float(timesteps[i + 1]), device=device)
                x = schedule.add_noise(x0, noise.renoise(block, i, shape).to(device), t_next)
        sync(device)
        t1 = time.perf_counter()
        dit(x0, torch.zeros(1, nf, device=device), prompt, cache, block * nf)
        sync(device)
        times.append((t1 - t0, time.perf_counter() - t1))
    return times


def run_magi(args: argparse.Namespace) -> None:
    """MAGI-1 is chunk-pipelined, not block-causal: its per-chunk latency is bench/magi.py's."""
    command = [sys.executable, str(Path(__file__).with_name("magi.py")), "--preset", args.preset, "--full"]
    command += ["--latent", "90x90", "--device", args.device, "--dtype", args.dtype, "--threads", str(args.threads)]
    if args.json:
        command += ["--json", str(args.json)]
    raise SystemExit(subprocess.run(command).returncode)


def main() -> None:
    args = parse_args()
    if args.preset in magi_presets():
        run_magi(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    if args.preset:
        args.latent = "60x104"
    lat_h, lat_w = (int(v) for v in args.latent.split("x"))
    config = model_config(args)
    torch.manual_seed(0)
    with device:  # initialised where it runs: no CPU init and copy of a real-size model
        dit = CausalWanDiT(config)
    dit = dit.to(dtype=dtype).eval()
    tokens = config.tokens_per_frame(lat_h, lat_w)
    nf = args.frames_per_block
    windowed = args.window != -1
    total_frames = args.blocks * nf
    cache_frames = args.window if windowed else total_frames
    shape = (1, nf, config.in_dim, lat_h, lat_w)

    pool = KVPool(
        KVPoolSpec(config.num_layers, config.num_heads, config.head_dim, tokens, cache_frames, dtype, str(device))
    )

    def paged() -> tuple[SelfAttentionCache, Callable[[], int]]:
        session_id = f"s{time.perf_counter_ns()}"
        cache = pool.open_session(session_id, tokens, args.window if windowed else None, args.sink if windowed else 0)

        def finish() -> int:
            peak = cache.usage().peak_device_pages * pool.spec.page_bytes
            pool.close_session(session_id)
            return peak

        return cache, finish

    def contiguous() -> tuple[SelfAttentionCache, Callable[[], int]]:
        cache = ContiguousKVCache(
            config.num_layers,
            config.num_heads,
            config.head_dim,
            tokens,
            total_frames,
            args.window if windowed else None,
            args.sink if windowed else 0,
            dtype,
            device,
        )
        return cache, lambda: cache.nbytes

    print(
        f"DiT dim={config.dim} layers={config.num_layers} heads={config.num_heads} | latent {lat_h}x{lat_w} "
        f"({tokens} tokens/frame) | {args.blocks} blocks x {nf} frames | {args.steps} steps | "
        f"window={args.window} sink={args.sink} | {device} {args.dtype}"
    )
    results: dict[str, list[list[tuple[float, float]]]] = {"paged": [], "contiguous": []}
    kv_bytes: dict[str, int] = {}
    with torch.no_grad():
        run_session(dit, contiguous()[0], replace_blocks(args, 1), shape)  # warm-up
        for _ in range(args.repeats):
            for name, factory in (("paged", paged), ("contiguous", contiguous)):
                cache, finish = factory()
                results[name].append(run_session(dit, cache, args, shape))
                kv_bytes[name] = finish()

    def per_block(name: str, which: int | None) -> float:
        # Median over repeats of the mean block time; block 0 (no context yet) included.
        runs = [[d + c if which is None else (d, c)[which] for d, c in run] for run in results[name]]
        return statistics.median(statistics.mean(run) for run in runs)

    print(f"{'cache':<12}{'block ms':>10}{'denoise ms':>12}{'context ms':>12}{'KV MiB/session':>16}")
    for name in ("paged", "contiguous"):
        print(
            f"{name:<12}{per_block(name, None) * 1e3:>10.1f}{per_block(name, 0) * 1e3:>12.1f}"
            f"{per_block(name, 1) * 1e3:>12.1f}{kv_bytes[name] / 2**20:>16.2f}"
        )
    time_ratio = per_block("paged", None) / per_block("contiguous", None)
    mem_ratio = kv_bytes["paged"] / kv_bytes["contiguous"]
    print(f"paged/contiguous: time {time_ratio:.3f}x  KV memory {mem_ratio:.3f}x")
    if args.json:
        figures = {
            name: {
                "block_ms": per_block(name, None) * 1e3,
                "denoise_ms": per_block(name, 0) * 1e3,
                "context_ms": per_block(name, 1) * 1e3,
                "kv_mib_per_session": kv_bytes[name] / 2**20,
            }
            for name in ("paged", "contiguous")
        }
        ratios = {"time_paged_over_contiguous": time_ratio, "kv_memory_paged_over_contiguous": mem_ratio}
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, **figures, **ratios}))


def replace_blocks(args: argparse.Namespace, blocks: int) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), "blocks": blocks})


if __name__ == "__main__":
    main()
