"""WanEngine benchmark: per-block latency and KV bytes, paged pool vs the contiguous reference cache.

Both caches run through the same block loop and the same DiT in one process, interleaved, so the
ratio is measured side by side. Random weights; no checkpoint needed.

    python bench/engine_speed.py                                  # mid-size CPU config
    python bench/engine_speed.py --context-passes cache-only,whole   # context passes stopping at the last K/V vs whole
    python bench/engine_speed.py --device cuda --preset wan2.1-1.3b --dtype bf16   # real 480x832 shapes
    python bench/engine_speed.py --device cuda --preset magi1-4.5b-distill --dtype bf16   # MAGI-1: bench/magi.py
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from engine.compiled import compile_dit, warm_up_cache
from engine.families.wan.dit import CausalWanDiT, DiTCall
from engine.flow_match import FlowMatchSchedule
from engine.kv import ContiguousKVCache, KVPool, KVPoolSpec, SelfAttentionCache
from engine.noise import SeededNoise
from inferix.spec.architectures import DIT_PRESETS, WanDiTConfig
from inferix.spec.families.magi import magi_presets
from inferix.spec.sampling import BlockConfig, SamplingConfig

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MODES = ("eager", "compiled")
CACHES = ("paged", "contiguous")
# How a block's context pass runs: as the pipeline does (it stops once the last layer's K/V are
# stored), or whole, its flow thrown away (as the reference code does).
CONTEXT_PASSES = {"cache-only": "context_pass", "whole": "denoise_step"}


def _names(allowed: Iterable[str]) -> Callable[[str], list[str]]:
    """An argparse type: a comma list of names out of `allowed`, order kept."""
    choices = list(allowed)

    def parse(text: str) -> list[str]:
        names = [n for n in text.split(",") if n]
        wrong = [n for n in names if n not in choices]
        if wrong or not names:
            raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(choices)}; got {text!r}")
        return names

    return parse


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--preset",
        choices=sorted(DIT_PRESETS) + magi_presets(),
        help="real model shapes (random weights); a MAGI-1 preset runs bench/magi.py at 720x720",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="MAGI-1 presets only (bench/magi.py)")
    p.add_argument(
        "--dtypes", type=_names(DTYPES), default=["fp32", "bf16"], help="comma list of weight dtypes to compare"
    )
    p.add_argument("--modes", type=_names(MODES), default=["eager"], help="comma list of: eager, compiled")
    p.add_argument("--caches", type=_names(CACHES), default=list(CACHES), help="comma list of: paged, contiguous")
    p.add_argument(
        "--context-passes",
        type=_names(CONTEXT_PASSES),
        default=["cache-only"],
        help="comma list of: cache-only (the engine's: stops at the last K/V), whole (the reference's)",
    )
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
    dit: CausalWanDiT,
    cache: SelfAttentionCache,
    args: argparse.Namespace,
    shape: tuple[int, ...],
    context_pass: str = "cache-only",
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
        zero = torch.zeros(1, nf, device=device)
        dit.forward_batch([DiTCall(x0, zero, prompt, cache, block * nf, kind=CONTEXT_PASSES[context_pass])])
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


@dataclass(frozen=True)
class Variant:
    """One way of running the same block loop: weights' dtype, eager or compiled, which KV cache,
    and how its context passes run."""

    dtype: str
    mode: str
    cache: str
    context: str = "cache-only"

    @property
    def name(self) -> str:
        suffix = "" if self.context == "cache-only" else f" {self.context}-ctx"
        return f"{self.dtype} {self.mode} {self.cache}{suffix}"


PHASES = ("fill", "rolling", "rolling context")


def phase_means(runs: list[list[tuple[float, float]]], fill_blocks: int) -> dict[str, float]:
    """Median over repeats of the mean block time (denoise + context pass) of each phase, and of
    the mean context pass alone in the rolling phase ("rolling context").

    The fill phase is the blocks whose frames still fit the window (block 0, with no context yet,
    included); the rolling phase the blocks that evict frames.
    """
    phases = {"fill": slice(0, fill_blocks), "rolling": slice(fill_blocks, None)}
    out = {}
    for phase, blocks in phases.items():
        means = [statistics.mean(d + c for d, c in run[blocks]) for run in runs if run[blocks]]
        if means:
            out[phase] = statistics.median(means)
        if phase == "rolling" and means:
            out["rolling context"] = statistics.median(statistics.mean(c for _, c in run[blocks]) for run in runs)
    return out


def main() -> None:
    args = parse_args()
    if args.preset in magi_presets():
        run_magi(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.preset:
        args.latent = "60x104"
    lat_h, lat_w = (int(v) for v in args.latent.split("x"))
    config = model_config(args)
    torch.manual_seed(0)
    with device:  # initialised where it runs: no CPU init and copy of a real-size model
        reference = CausalWanDiT(config)
    dits = {name: copy.deepcopy(reference).to(dtype=DTYPES[name]).eval() for name in args.dtypes}
    runners = {(name, "eager"): dit for name, dit in dits.items()}
    for name, dit in dits.items():
        if "compiled" in args.modes:
            compiled = copy.deepcopy(dit)
            compile_dit(compiled)
            runners[name, "compiled"] = compiled
    tokens = config.tokens_per_frame(lat_h, lat_w)
    nf = args.frames_per_block
    windowed = args.window != -1
    total_frames = args.blocks * nf
    cache_frames = args.window if windowed else total_frames
    fill_blocks = min(args.blocks, cache_frames // nf) if windowed else args.blocks
    shape = (1, nf, config.in_dim, lat_h, lat_w)

    def paged(dtype: torch.dtype) -> tuple[SelfAttentionCache, Callable[[], int]]:
        spec = KVPoolSpec(
            config.num_layers, config.num_heads, config.head_dim, tokens, cache_frames, dtype, str(device)
        )
        pool = KVPool(spec)
        cache = pool.open_session("bench", tokens, args.window if windowed else None, args.sink if windowed else 0)
        return cache, lambda: cache.usage().peak_device_pages * spec.page_bytes

    def contiguous(dtype: torch.dtype) -> tuple[SelfAttentionCache, Callable[[], int]]:
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

    factories = {"paged": paged, "contiguous": contiguous}
    variants = [
        Variant(d, m, c, x) for d in args.dtypes for m in args.modes for c in args.caches for x in args.context_passes
    ]
    print(
        f"DiT dim={config.dim} layers={config.num_layers} heads={config.num_heads} | latent {lat_h}x{lat_w} "
        f"({tokens} tokens/frame) | {args.blocks} blocks x {nf} frames ({fill_blocks} filling the window) | "
        f"{args.steps} steps | window={args.window} sink={args.sink} | {device} | {args.repeats} repeats, interleaved"
    )
    results: dict[Variant, list[list[tuple[float, float]]]] = {v: [] for v in variants}
    kv_bytes: dict[Variant, int] = {}
    with torch.no_grad():
        for variant in variants:  # warm-up: compiles (as a worker does at start-up), allocator, kernels
            runner = runners[variant.dtype, variant.mode]
            if variant.mode == "compiled":
                block = BlockConfig(nf, args.window if windowed else -1, args.sink if windowed else 0)
                warm = warm_up_cache(runner, factories[variant.cache](DTYPES[variant.dtype])[0], block, lat_h, lat_w)
                print(f"{variant.name}: compiled {warm.graphs} graph(s) in {warm.seconds:.0f} s")
            cache = factories[variant.cache](DTYPES[variant.dtype])[0]
            run_session(runner, cache, replace_blocks(args, 1), shape, variant.context)
        for _ in range(args.repeats):
            for variant in variants:
                cache, kv_size = factories[variant.cache](DTYPES[variant.dtype])
                runner = runners[variant.dtype, variant.mode]
                results[variant].append(run_session(runner, cache, args, shape, variant.context))
                kv_bytes[variant] = kv_size()

    figures = {v: phase_means(results[v], fill_blocks) for v in variants}
    print(f"{'variant':<36}{'fill ms/block':>14}{'rolling ms/block':>18}{'of it context':>15}{'KV MiB/session':>16}")
    for v in variants:
        fill, rolling, context = (f"{figures[v][p] * 1e3:.1f}" if p in figures[v] else "-" for p in PHASES)
        print(f"{v.name:<36}{fill:>14}{rolling:>18}{context:>15}{kv_bytes[v] / 2**20:>16.2f}")

    ratios: dict[str, float] = {}

    def ratio(label: str, num: Variant, den: Variant) -> None:
        for phase in PHASES:
            if num in figures and den in figures and phase in figures[num] and phase in figures[den]:
                ratios[f"{label} ({phase})"] = figures[num][phase] / figures[den][phase]

    for d in args.dtypes:
        for m in args.modes:
            ratio(f"paged/contiguous {d} {m}", Variant(d, m, "paged"), Variant(d, m, "contiguous"))
            for c in args.caches:
                whole = Variant(d, m, c, "whole")
                ratio(f"cache-only/whole context pass {d} {m} {c}", Variant(d, m, c), whole)
    base_dtype, base_mode = args.dtypes[0], args.modes[0]
    for m in args.modes:
        for d in args.dtypes[1:]:
            ratio(f"{d} speed-up over {base_dtype} {m} paged", Variant(base_dtype, m, "paged"), Variant(d, m, "paged"))
    for d in args.dtypes:
        for m in args.modes[1:]:
            ratio(f"{m} speed-up over {base_mode} {d} paged", Variant(d, base_mode, "paged"), Variant(d, m, "paged"))
    for label, value in ratios.items():
        print(f"{label:<72}{value:.3f}x")
    if args.json:
        out = {
            "args": {k: str(v) for k, v in vars(args).items()},
            "ms_per_block": {v.name: {p: t * 1e3 for p, t in figures[v].items()} for v in variants},
            "kv_mib_per_session": {v.name: kv_bytes[v] / 2**20 for v in variants},
            "ratios": ratios,
        }
        args.json.write_text(json.dumps(out, indent=1))


def replace_blocks(args: argparse.Namespace, blocks: int) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), "blocks": blocks})


if __name__ == "__main__":
    main()
