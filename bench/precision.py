"""Reduced precision on this CPU: DiT step time, where it goes, and the error of bf16 / fp16 against fp32.

    python bench/precision.py --threads 1
    python bench/precision.py --threads 1 --dtypes fp32 bf16 --rounds 5 --toyworld-blocks 8

Prints, in one run:

1. The CPU: PyTorch's kernel level, the native bf16 / fp16 flags, whether oneDNN takes bf16 / fp16
   (``engine.precision``).
2. DiT step time per dtype, side by side: the engine bench's DiT (dim 384, 6 layers, 6 heads,
   latent 28x64 = 448 tokens/frame, 3-frame blocks, window 12 + sink 3, random weights) on a full
   window, one denoising step; ``--rounds`` interleaved rounds, minimum and median, ratio to fp32.
3. Where one step's time goes per dtype: every aten op timed at the dispatcher and put in a
   category (matmul, attention, conversion = a copy that changes dtype, ...), with the dtypes the
   category computes in.
4. The error of each dtype against fp32: the final latents of the golden Wan cases (tests/golden,
   their recorded noise and prompt) and of the toyworld model (same seed, same fp32 prompt
   embeddings), max abs and relative (L2) difference, with fp32's own difference from the
   reference's golden latents for scale.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from engine.families.wan.dit import CausalWanDiT
from engine.families.wan.golden import WanCase, _recorded_noise
from engine.families.wan.loader import TOYWORLD_WEIGHTS, load_wan_model
from engine.families.wan.pipeline import WanLoop, WanPipeline
from engine.noise import NoiseSource, SeededNoise
from engine.precision import cpu_precision
from engine.registry import wan_cases
from inferix.spec.architectures import WanDiTConfig
from inferix.spec.sampling import BlockConfig, PipelineConfig, SamplingConfig
from toyworld_lab.world import SceneSpec

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SHORT = {dtype: name for name, dtype in DTYPES.items()} | {torch.float64: "fp64", torch.complex64: "c64"}
GOLDEN_DIR = Path(__file__).resolve().parent.parent / "tests" / "golden"
BENCH_DIT = WanDiTConfig(dim=384, ffn_dim=1536, num_heads=6, num_layers=6, freq_dim=256, text_dim=512, text_len=64)
BENCH_LATENT = (28, 64)
WINDOW, SINK, FRAMES = 12, 3, 3

# aten op names by category (attention: every SDPA kernel); the rest is "other" (views, fills, ...).
CATEGORIES: dict[str, frozenset[str]] = {
    "matmul": frozenset({"addmm", "mm", "bmm", "baddbmm"}),
    "norm": frozenset({"native_layer_norm", "mean", "rsqrt", "pow", "linalg_vector_norm"}),
    "elementwise": frozenset(
        {"mul", "add", "sub", "div", "gelu", "silu", "neg", "cos", "sin", "exp", "clamp", "reciprocal", "where"}
    ),
    "copy": frozenset(
        {"copy_", "_to_copy", "clone", "cat", "index_select", "index_copy_", "stack", "view_as_real", "constant_pad_nd"}
    ),
    "conv": frozenset({"convolution"}),
}


@dataclass
class OpTimes:
    """Dispatcher-level milliseconds per category, with the dtypes seen per category."""

    ms: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    dtypes: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))


class OpTimer(TorchDispatchMode):
    """Times every aten op and files it by category; a copy that changes dtype is a "conversion"."""

    def __init__(self) -> None:
        super().__init__()
        self.times = OpTimes()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        elapsed = (time.perf_counter() - start) * 1e3
        name = func.overloadpacket.__name__
        category = next((c for c, names in CATEGORIES.items() if name in names), "other")
        if name.startswith("_scaled_dot_product"):
            category = "attention"
        tensors = [a for a in args if isinstance(a, Tensor)]
        kinds = sorted({SHORT.get(t.dtype, str(t.dtype)) for t in tensors if t.is_floating_point() or t.is_complex()})
        if category == "copy" and isinstance(out, Tensor) and any(t.dtype != out.dtype for t in tensors):
            category = "conversion"
            kinds = [f"{'/'.join(kinds)}->{SHORT.get(out.dtype, str(out.dtype))}"]
        self.times.ms[category] += elapsed
        self.times.dtypes[category].update(kinds)
        return out


@dataclass
class StepBench:
    """One dtype's DiT on a full rolling window, ready to time denoising steps."""

    dtype: str
    session: WanLoop
    x: Tensor
    t: Tensor

    def step(self) -> None:
        """The next block's denoising step: it writes frames past the full window, which rolls."""
        s = self.session
        s.dit(self.x, self.t, s.prompt, s.cache, start_frame=WINDOW)


def _pipeline(dit: CausalWanDiT) -> WanPipeline:
    steps = tuple(1000 - 250 * i for i in range(4))
    block = BlockConfig(FRAMES, local_attn_size=WINDOW, sink_size=SINK)
    return WanPipeline(dit, PipelineConfig(block, SamplingConfig(steps)))


def step_benches(dtypes: list[str]) -> list[StepBench]:
    """Each dtype's copy of one random DiT, its window filled by context passes (one forward a block)."""
    torch.manual_seed(0)
    base = CausalWanDiT(BENCH_DIT).eval()
    prompt = torch.randn(1, BENCH_DIT.text_len, BENCH_DIT.text_dim)
    x = torch.randn(1, FRAMES, BENCH_DIT.in_dim, *BENCH_LATENT)
    benches = []
    for name in dtypes:
        dit = copy.deepcopy(base).to(DTYPES[name])
        session = _pipeline(dit).open_session(prompt, *BENCH_LATENT)
        with torch.no_grad():
            for block in range(WINDOW // FRAMES):
                dit(x, torch.zeros(1, FRAMES), session.prompt, session.cache, start_frame=block * FRAMES)
        benches.append(StepBench(name, session, x, torch.full((1, FRAMES), 937.5)))
    return benches


def time_steps(benches: list[StepBench], rounds: int) -> dict[str, list[float]]:
    """Seconds of one denoising step per dtype, interleaved over ``rounds`` (after one warm-up step each)."""
    seconds: dict[str, list[float]] = {b.dtype: [] for b in benches}
    with torch.no_grad():
        for bench in benches:
            bench.step()
        for _ in range(rounds):
            for bench in benches:
                start = time.perf_counter()
                bench.step()
                seconds[bench.dtype].append(time.perf_counter() - start)
    return seconds


def profile_step(bench: StepBench) -> OpTimes:
    with torch.no_grad(), OpTimer() as timer:
        bench.step()
    return timer.times


def _final_latents(
    pipeline: WanPipeline, prompt: Tensor, hw: tuple[int, int], blocks: int, noise: NoiseSource
) -> tuple[Tensor, float]:
    """Latents of ``blocks`` blocks [1, F, C, h, w] (fp32) and seconds per block."""
    start = time.perf_counter()
    with pipeline.open_session(prompt, *hw, noise=noise, num_blocks=blocks) as session:
        latents = torch.cat([out.latents.float() for out in session], dim=1)
    return latents, (time.perf_counter() - start) / blocks


def _errors(ours: Tensor, reference: Tensor) -> tuple[float, float]:
    """(max abs difference, relative L2 difference) of ``ours`` from ``reference``."""
    diff = ours.double() - reference.double()
    return diff.abs().max().item(), (diff.norm() / reference.double().norm()).item()


@dataclass
class ErrorRow:
    model: str
    dtype: str
    blocks: int
    block_ms: float
    max_abs: float
    relative: float


def golden_errors(dtypes: list[str], blocks: int) -> list[ErrorRow]:
    rows = []
    for case in (c for c in wan_cases(GOLDEN_DIR) if c.has("outputs")):
        inputs = case.tensors("inputs")
        noise = _recorded_noise(inputs)
        _, frames, _, h, w = inputs["initial_noise"].shape
        nf = case.pipeline_config().block.num_frame_per_block
        n = min(blocks, frames // nf)
        reference = case.tensors("outputs")["latents"][:, : n * nf]
        results = {}
        for name in dtypes:
            dtyped = WanCase(case.folder, dtype=DTYPES[name])
            pipeline = WanPipeline(dtyped.build_dit(), dtyped.pipeline_config())
            results[name] = _final_latents(pipeline, inputs["prompt_embeds"], (h, w), n, noise)
        fp32 = results["fp32"][0]  # main() always runs fp32
        for name, (latents, seconds) in results.items():
            against = reference if name == "fp32" else fp32
            rows.append(ErrorRow(f"golden {case.name}", name, n, seconds * 1e3, *_errors(latents, against)))
    return rows


def toyworld_errors(dtypes: list[str], blocks: int) -> list[ErrorRow]:
    if not (TOYWORLD_WEIGHTS / "model.yaml").is_file():
        print(f"(toyworld weights not found in {TOYWORLD_WEIGHTS}: skipped)")
        return []
    fp32_model = load_wan_model("toyworld")
    prompt = fp32_model.prompt_encoder.encode([SceneSpec("red", "ball", 1, "bouncing to the right").prompt()])
    factor = fp32_model.vae.config.spatial_factor
    hw = (fp32_model.height // factor, fp32_model.width // factor)
    results = {}
    for name in dtypes:
        model = fp32_model if name == "fp32" else load_wan_model("toyworld", dtype=name)
        pipeline = WanPipeline(model.dit, model.pipeline_config)
        results[name] = _final_latents(pipeline, prompt, hw, blocks, SeededNoise(0))
    fp32 = results["fp32"][0]
    return [ErrorRow("toyworld", name, blocks, sec * 1e3, *_errors(lat, fp32)) for name, (lat, sec) in results.items()]


def report_cpu() -> None:
    cpu = cpu_precision()
    wanted = sorted({"avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16", "avx2", "avx512f", "bf16", "asimdhp"})
    present = ", ".join(f for f in wanted if f in cpu.flags) or "none"
    print(
        f"CPU: PyTorch kernels {cpu.capability}; flags of interest present: {present}\n"
        f"     native bf16 {cpu.native_bf16}, native fp16 {cpu.native_fp16}; "
        f"oneDNN takes bf16 {cpu.onednn_bf16}, fp16 {cpu.onednn_fp16}; torch threads {torch.get_num_threads()}\n"
    )


def report_steps(seconds: dict[str, list[float]]) -> None:
    fp32 = min(seconds["fp32"]) if "fp32" in seconds else None
    print(f"{'dtype':<8}{'step ms min':>13}{'median':>10}{'time / fp32':>13}{'speed-up':>10}")
    for name, values in seconds.items():
        ratio = min(values) / fp32 if fp32 else float("nan")
        ms = f"{1e3 * min(values):>13.1f}{1e3 * statistics.median(values):>10.1f}"
        print(f"{name:<8}{ms}{ratio:>13.3f}{1 / ratio:>10.2f}")


def report_profiles(profiles: dict[str, OpTimes]) -> None:
    categories = sorted(
        {c for p in profiles.values() for c in p.ms}, key=lambda c: -max(p.ms[c] for p in profiles.values())
    )
    header = "".join(f"{name + ' ms':>12}{'share':>7}  {'computes in':<22}" for name in profiles)
    print(f"{'category':<12}{header}")
    for category in categories:
        cells = ""
        for times in profiles.values():
            total = sum(times.ms.values())
            kinds = ",".join(sorted(times.dtypes[category]))[:22]
            cells += f"{times.ms[category]:>12.1f}{times.ms[category] / total:>7.1%}  {kinds:<22}"
        print(f"{category:<12}{cells}")
    totals = "".join(f"{sum(t.ms.values()):>12.1f}{'':>7}  {'':<22}" for t in profiles.values())
    print(f"{'total':<12}{totals}")


def report_errors(rows: list[ErrorRow]) -> None:
    print(f"{'model':<34}{'dtype':<6}{'blocks':>7}{'ms/block':>10}{'max abs':>11}{'rel L2':>11}  against")
    for r in rows:
        against = "golden reference" if r.dtype == "fp32" and r.model.startswith("golden") else "our fp32"
        if r.dtype == "fp32" and not r.model.startswith("golden"):
            against = "itself"
        print(
            f"{r.model:<34}{r.dtype:<6}{r.blocks:>7}{r.block_ms:>10.1f}{r.max_abs:>11.2e}{r.relative:>11.2e}  {against}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["fp32", "bf16", "fp16"])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds of the DiT step")
    parser.add_argument("--golden-blocks", type=int, default=6, help="blocks of each golden case (at most its own)")
    parser.add_argument("--toyworld-blocks", type=int, default=4)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtypes = ["fp32", *(d for d in args.dtypes if d != "fp32")]  # fp32 first: the reference of every ratio
    print("== this CPU")
    report_cpu()
    cfg, (h, w) = BENCH_DIT, BENCH_LATENT
    print(
        f"== DiT step: dim {cfg.dim}, {cfg.num_layers} layers, {cfg.num_heads} heads, latent {h}x{w} "
        f"({cfg.tokens_per_frame(h, w)} tokens/frame), {FRAMES}-frame block on a full window of {WINDOW} frames, "
        f"{args.rounds} interleaved rounds"
    )
    benches = step_benches(dtypes)
    report_steps(time_steps(benches, args.rounds))
    print("\n== one step by op category (each aten op timed at the dispatcher)")
    report_profiles({b.dtype: profile_step(b) for b in benches})
    del benches
    print("\n== final latents against fp32 (same noise and prompt embeddings)")
    report_errors(golden_errors(dtypes, args.golden_blocks) + toyworld_errors(dtypes, args.toyworld_blocks))


if __name__ == "__main__":
    main()
