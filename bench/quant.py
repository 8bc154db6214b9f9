"""8-bit DiT weights and 8-bit KV pages: error, drift, bytes and speed against the unquantized model, side by side.

    python bench/quant.py                                 # default variants, 3 drift scenes x 30 s
    python bench/quant.py --modes none,int8,int8-wo,fp8,fp8-tensor --kv auto,fp8,int8 --all
    python bench/quant.py --scenes 6 --seconds 60 --blocks 32 --threads 2 --json out/quant.json

A variant is a weight mode (`--quant`: none, int8 = W8A8, int8-wo = weight-only, fp8, fp8-tensor)
and a KV storage mode (`--kv-dtype`: auto = the model's dtype, fp8, int8). By default every weight
mode runs with KV auto, and each 8-bit KV mode with unquantized weights (its effect alone) and with
the first quantized weight mode (the deployed combination); `--all` runs the full product. Each is
compared with the unquantized fp32 model with KV auto ("none/kv-auto"):

1. DiT error: relative L2 of the DiT's flow against the unquantized fp32 one, for the Wan golden
   cases (`--golden`, their weights and inputs): the second of the cases' two stand-alone calls,
   which writes and then attends to the first's cached K/V, so 8-bit pages count too.
2. Video PSNR: the toyworld model's uint8 frames of the first `--blocks` blocks of every drift video
   against the unquantized run's (same prompts, same seeds), over all of them.
3. Drift (bench/toyworld.py's scenes and reading of the pixels): objects on screen and colour =
   prompt over `--seconds` of video for the first `--scenes` scenes, and the change vs unquantized.
4. Bytes, as ratios to bf16: the DiT's weights (8-bit linears and their scales, the rest in bf16)
   and one session's KV pages, for toyworld and the real Self Forcing 1.3B config (built on the
   meta device; KV at 480x832 over `--real-frames` latent frames).
5. Speed on the CPU with `--threads` torch threads, interleaved repeats, ratios to unquantized:
   a toyworld block (DiT steps + decode), and one denoising step of bench/precision.py's mid-size
   DiT (random weights) on a full window of random K/V, where the linears are large enough to show
   the int8 GEMM.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from engine.families.wan.dit import CausalWanDiT
from engine.families.wan.engine import WanEngine
from engine.families.wan.golden import WanCase
from engine.families.wan.loader import LoadedModel, load_wan_model
from engine.families.wan.pipeline import WanPipeline
from engine.kv.page_codec import KV_DTYPES
from engine.kv.pool import KVPool, KVPoolSpec
from engine.quant import QUANT_MODES, int8_path, parse_quant, quantize_linears, quantized_skeleton, weight_bytes
from engine.quant.kernels import int8_activation_levels
from engine.registry import wan_cases
from inferix.spec.architectures import WanDiTConfig
from inferix.spec.presets import load_preset
from inferix.spec.sampling import BlockConfig, PipelineConfig, SamplingConfig
from inferix.spec.sizing import native_latent_size
from toyworld_lab.evaluate import generate_blocks, video_stats

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling benches, also under `python -P`
from precision import BENCH_DIT, BENCH_LATENT, FRAMES, SINK, WINDOW, StepBench, time_steps  # noqa: E402
from toyworld import SCENES, blocks_for  # noqa: E402

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "tests" / "golden"
REAL_PRESET = "self-forcing-dmd"
DRIFT_TARGET = 0.05  # |change in on screen / colour = prompt| vs unquantized
WEIGHT_TARGET, KV_TARGET = 0.55, 0.52  # bytes vs bf16 on the real model


@dataclass(frozen=True)
class Variant:
    """How the DiT stores its block linears (`--quant`) and how the KV pool stores K/V (`--kv-dtype`)."""

    weights: str
    kv: str

    @property
    def name(self) -> str:
        return f"{self.weights}/kv-{self.kv}"


BASELINE = Variant("none", "auto")
ModuleT = TypeVar("ModuleT", bound=nn.Module)


def _names(allowed: list[str]) -> Callable[[str], list[str]]:
    """An argparse type: a comma list of names out of `allowed`, order kept."""

    def parse(text: str) -> list[str]:
        names = [n for n in text.split(",") if n]
        wrong = [n for n in names if n not in allowed]
        if wrong or not names:
            raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(allowed)}; got {text!r}")
        return names

    return parse


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", type=_names(list(QUANT_MODES)), default=["none", "int8", "int8-wo", "fp8"])
    p.add_argument("--kv", type=_names(list(KV_DTYPES)), default=["auto", "fp8"], help="KV storage modes")
    p.add_argument("--all", action="store_true", help="every weight mode with every KV mode")
    p.add_argument("--blocks", type=int, default=16, help="toyworld blocks compared by PSNR")
    p.add_argument("--seconds", type=float, default=30.0, help="length of each drift video")
    p.add_argument("--scenes", type=int, default=3, help=f"drift scenes (first N of bench/toyworld.py's {len(SCENES)})")
    p.add_argument("--golden", type=Path, default=GOLDEN_DIR, help="golden case folder(s); the Wan T2V ones run")
    p.add_argument("--real-frames", type=int, default=21, help="latent frames of a 1.3B session's KV (21: 81 frames)")
    p.add_argument("--time-blocks", type=int, default=6, help="toyworld blocks timed per repeat")
    p.add_argument("--repeats", type=int, default=3, help="interleaved timing repeats (0: no timing)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--json", type=Path, metavar="OUT", help="also write the figures to OUT as JSON")
    return p.parse_args()


def variants(modes: list[str], kvs: list[str], full: bool) -> list[Variant]:
    """The baseline first; then each weight mode with KV auto, each 8-bit KV with unquantized weights
    and with the first quantized mode (all pairs with `full`)."""
    quantized = [m for m in modes if m != "none"]
    if full:
        pairs = [Variant(m, k) for m in ["none", *quantized] for k in dict.fromkeys(["auto", *kvs])]
    else:
        pairs = [Variant(m, "auto") for m in quantized]
        pairs += [Variant(m, k) for k in kvs if k != "auto" for m in ["none", *quantized[:1]]]
    return list(dict.fromkeys([BASELINE, *pairs]))


def rel_l2(x: Tensor, reference: Tensor) -> float:
    return float((x.double() - reference.double()).norm() / reference.double().norm())


def quantized_copy(dit: ModuleT, mode: str) -> ModuleT:
    """`dit` itself for "none", else a copy with its block linears quantized."""
    return dit if mode == "none" else quantize_linears(copy.deepcopy(dit), parse_quant(mode))


def meta_dit(config: WanDiTConfig, mode: str) -> nn.Module:
    """The DiT in fp32 on the meta device (no memory, any size) with `mode`'s empty 8-bit linears."""

    def build() -> nn.Module:
        with torch.device("meta"):
            return CausalWanDiT(config)

    return build() if mode == "none" else quantized_skeleton(build, parse_quant(mode))()


# ---- 1. DiT error on the golden cases -------------------------------------------------------
def golden_flow(case: WanCase, dit: CausalWanDiT, kv: str) -> Tensor:
    """The flow of the case's second stand-alone DiT call (after the first, on a fresh cache)."""
    data = case.tensors("dit_forward")
    _, frames, _, h, w = data["dit_fwd_in0"].shape
    pipeline = WanPipeline(dit, case.pipeline_config(), kv_dtype=kv)
    cache = pipeline.open_cache(None, "golden", h, w, frames=2 * frames)
    prompt = dit.encode_prompt(case.tensors("inputs")["prompt_embeds"])
    with torch.no_grad():
        dit(data["dit_fwd_in0"], data["dit_fwd_t0"], prompt, cache, start_frame=0)
        return dit(data["dit_fwd_in1"], data["dit_fwd_t1"], prompt, cache, start_frame=frames)


def golden_errors(root: Path, runs: list[Variant]) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """({case: {variant: relative L2 vs our fp32 flow}}, {case: our fp32 flow vs the reference's})."""
    errors: dict[str, dict[str, float]] = {}
    reference_error: dict[str, float] = {}
    for case in wan_cases(root):
        if not case.has("dit_forward"):
            continue  # MAGI-1 and action-conditioned cases: not the Wan T2V DiT
        dit = case.build_dit()
        dits = {m: quantized_copy(dit, m) for m in dict.fromkeys(v.weights for v in runs)}
        base = golden_flow(case, dit, "auto")
        reference_error[case.name] = rel_l2(base, case.tensors("dit_forward")["dit_fwd_flow1"])
        errors[case.name] = {v.name: rel_l2(golden_flow(case, dits[v.weights], v.kv), base) for v in runs}
    return errors, reference_error


# ---- 2-3. Toyworld PSNR and drift -----------------------------------------------------------
@dataclass(frozen=True)
class VideoQuality:
    psnr_db: float | None  # None: identical frames (the baseline itself)
    on_screen: float
    colour_match: float


def toyworld_videos(
    engines: dict[Variant, WanEngine], blocks: int, psnr_blocks: int, scenes: int
) -> dict[Variant, VideoQuality]:
    """Every variant's drift videos; PSNR of their first `psnr_blocks` blocks vs the baseline's."""
    baseline_frames: list[np.ndarray] = []
    out: dict[Variant, VideoQuality] = {}
    for variant, engine in engines.items():  # the baseline first
        began = time.perf_counter()
        stats, squared, count = [], 0.0, 0
        for seed, spec in enumerate(SCENES[:scenes]):
            frame_blocks = generate_blocks(engine, spec.prompt(), max(blocks, psnr_blocks), seed=seed)
            stats.extend(video_stats(frame_blocks[:blocks], [spec.colour] * blocks))
            frames = np.concatenate(frame_blocks[:psnr_blocks]).astype(np.float64)
            if variant == BASELINE:
                baseline_frames.append(frames)
            squared += float(((frames - baseline_frames[seed]) ** 2).sum())
            count += frames.size
        mse = squared / count
        out[variant] = VideoQuality(
            psnr_db=10 * math.log10(255**2 / mse) if mse > 0 else None,
            on_screen=float(np.mean([s.on_screen for s in stats])),
            colour_match=float(np.mean([s.colour_match for s in stats])),
        )
        print(f"  {variant.name}: {scenes} videos x {blocks} blocks in {time.perf_counter() - began:.0f} s", flush=True)
    return out


# ---- 4. Bytes -------------------------------------------------------------------------------
def dit_bytes(config: WanDiTConfig, modes: list[str]) -> dict[str, int]:
    """Bytes of the DiT's parameters and buffers in bf16 with each weight mode's 8-bit linears;
    "bf16" is the unquantized baseline."""
    out = {"bf16": weight_bytes(meta_dit(config, "none").to(torch.bfloat16))}
    out |= {m: weight_bytes(meta_dit(config, m).to(torch.bfloat16)) for m in modes if m != "none"}
    return out


def kv_bytes(config: WanDiTConfig, latent: tuple[int, int], frames: int, kvs: list[str]) -> dict[str, int]:
    """One session's KV bytes (`frames` pages of one latent frame), bf16 and each 8-bit mode."""
    spec = KVPoolSpec(
        config.num_layers, config.num_heads, config.head_dim, config.tokens_per_frame(*latent), frames, torch.bfloat16
    )
    out = {"bf16": frames * spec.page_bytes}
    for kv in kvs:
        if kv != "auto":
            out[kv] = frames * KVPoolSpec(**{**asdict(spec), "kv_dtype": kv}).page_bytes
    return out


# ---- 5. Speed -------------------------------------------------------------------------------
def time_toyworld(engines: dict[Variant, WanEngine], blocks: int, repeats: int) -> dict[Variant, float]:
    """Median over interleaved repeats of the mean seconds per toyworld block (after the first block)."""
    seconds: dict[Variant, list[float]] = {v: [] for v in engines}
    for _ in range(repeats):
        for variant, engine in engines.items():
            with engine.open(SCENES[0].prompt(), seed=0, num_blocks=blocks + 1) as video:
                video.next_block()  # no context yet; the allocator's first sizes
                began = time.perf_counter()
                for _ in range(blocks):
                    video.next_block()
                seconds[variant].append((time.perf_counter() - began) / blocks)
    return {v: statistics.median(s) for v, s in seconds.items()}


def step_benches(runs: list[Variant]) -> list[StepBench]:
    """bench/precision.py's DiT (random weights) per variant, its window's pages filled with random K/V
    (read as fast as real ones, without a context pass per block and variant)."""
    torch.manual_seed(0)
    base = CausalWanDiT(BENCH_DIT).eval()
    dits = {m: quantized_copy(base, m) for m in dict.fromkeys(v.weights for v in runs)}
    prompt = torch.randn(1, BENCH_DIT.text_len, BENCH_DIT.text_dim)
    x = torch.randn(1, FRAMES, BENCH_DIT.in_dim, *BENCH_LATENT)
    config = PipelineConfig(BlockConfig(FRAMES, WINDOW, SINK), SamplingConfig((1000, 750, 500, 250)))
    kv_shape = (1, FRAMES * BENCH_DIT.tokens_per_frame(*BENCH_LATENT), BENCH_DIT.num_heads, BENCH_DIT.head_dim)
    benches = []
    for variant in runs:
        session = WanPipeline(dits[variant.weights], config, kv_dtype=variant.kv).open_session(prompt, *BENCH_LATENT)
        for block in range(WINDOW // FRAMES):
            session.cache.begin(block * FRAMES, FRAMES)
            for layer in range(BENCH_DIT.num_layers):
                session.cache.store(layer, torch.randn(kv_shape), torch.randn(kv_shape))
        benches.append(StepBench(variant.name, session, x, torch.full((1, FRAMES), 937.5)))
    return benches


# ---- report ---------------------------------------------------------------------------------
def print_variants(
    runs: list[Variant],
    golden: dict[str, dict[str, float]],
    golden_ref: dict[str, float],
    quality: dict[Variant, VideoQuality],
    block_s: dict[Variant, float],
    step_s: dict[str, float],
) -> None:
    """One row per variant: golden DiT error per case, toyworld PSNR and drift, speed (when timed)."""
    cases = list(golden)
    width = {c: max(9, len(c)) + 2 for c in cases}
    timing = f"{'block ms':>10}{'x':>7}{'step ms':>9}{'x':>7}" if block_s else ""
    print(
        f"{'variant':<18}"
        + "".join(f"{c:>{width[c]}}" for c in cases)
        + f"{'PSNR dB':>9}{'on screen':>11}{'Δ':>7}{'colour':>8}{'Δ':>7}{timing}"
    )
    base = quality[BASELINE]
    for v in runs:
        q = quality[v]
        psnr = "-" if q.psnr_db is None else f"{q.psnr_db:.1f}"
        row = f"{v.name:<18}" + "".join(f"{golden[c][v.name]:>{width[c]}.2e}" for c in cases)
        row += f"{psnr:>9}{q.on_screen:>11.3f}{q.on_screen - base.on_screen:>+7.3f}"
        row += f"{q.colour_match:>8.3f}{q.colour_match - base.colour_match:>+7.3f}"
        if block_s:
            row += f"{block_s[v] * 1e3:>10.1f}{block_s[BASELINE] / block_s[v]:>6.2f}x"
            row += f"{step_s[v.name] * 1e3:>9.0f}{step_s[BASELINE.name] / step_s[v.name]:>6.2f}x"
        print(row)
    print(
        "(golden: relative L2 of the DiT flow vs fp32; our fp32 vs the reference: "
        + ", ".join(f"{c} {e:.1e}" for c, e in golden_ref.items())
        + ")"
    )
    print(f"(x: speed-up over {BASELINE.name} fp32; Δ: change vs it, target |Δ| <= {DRIFT_TARGET})")
    worst = max(abs(getattr(quality[v], f) - getattr(base, f)) for v in runs for f in ("on_screen", "colour_match"))
    verdict = "within" if worst <= DRIFT_TARGET else "OUTSIDE"
    print(f"drift: largest |Δ| {worst:.3f} ({verdict} the {DRIFT_TARGET} target)")


def ratio_row(label: str, sizes: dict[str, int]) -> str:
    base = sizes["bf16"]
    return f"{label:<34}{base / 2**20:>10.2f} MiB  " + "  ".join(
        f"{name} {size / base:.3f}x" for name, size in sizes.items() if name != "bf16"
    )


def target_line(name: str, sizes: dict[str, int], target: float) -> str:
    """Whether the worst 8-bit mode of `sizes` is within `target` times bf16."""
    ratios = [size / sizes["bf16"] for mode, size in sizes.items() if mode != "bf16"]
    if not ratios:
        return f"{name} <= {target}x (no 8-bit mode run)"
    return f"{name} <= {target}x ({'met' if max(ratios) <= target else 'MISSED'}, worst {max(ratios):.3f}x)"


def print_bytes(weights: dict[str, dict[str, int]], kv: dict[str, dict[str, int]]) -> None:
    """Weight and KV bytes per model as ratios to bf16, and the real model's targets."""
    print("weights (DiT, 8-bit linears + bf16 rest) vs bf16, and KV per session vs bf16 pages:")
    for model_name, sizes in weights.items():
        print(ratio_row(f"{model_name} weights", sizes))
    for label, sizes in kv.items():
        print(ratio_row(label, sizes))
    real_kv = list(kv.values())[-1]
    print(
        f"1.3B targets: {target_line('weights', weights[REAL_PRESET], WEIGHT_TARGET)}, "
        f"{target_line('KV', real_kv, KV_TARGET)}"
    )


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    runs = variants(args.modes, args.kv, args.all)
    kvs = list(dict.fromkeys(v.kv for v in runs))
    levels = int8_activation_levels("cpu")
    read_paths = {kv: KVPool(KVPoolSpec(1, 1, 2, 1, 1, kv_dtype=kv)).kv_read_path for kv in kvs}
    print(
        f"int8 kernel: {int8_path('cpu')}, activations ±{levels} ({1 + levels.bit_length()} bits) | KV read: "
        + ", ".join(f"{kv} {path}" for kv, path in read_paths.items())
        + f" | {args.threads} thread(s) | variants: {', '.join(v.name for v in runs)}"
    )

    began = time.perf_counter()
    golden, golden_ref = golden_errors(args.golden, runs)
    print(f"golden DiT forwards ({', '.join(golden)}) in {time.perf_counter() - began:.0f} s", flush=True)

    models: dict[str, LoadedModel] = {m: load_wan_model(None, quant=m) for m in dict.fromkeys(v.weights for v in runs)}
    engines = {v: WanEngine(models[v.weights], kv_dtype=v.kv) for v in runs}
    toy = models["none"]
    for mode, model in models.items():  # the meta count of the bytes table is the loaded DiT's (both fp32)
        counted, loaded = weight_bytes(meta_dit(toy.dit.config, mode)), weight_bytes(model.dit)
        assert counted == loaded, f"{mode}: {counted} bytes on the meta device, {loaded} loaded"
    block_frames = toy.pipeline_config.block.num_frame_per_block
    drift_blocks = blocks_for(args.seconds, toy.fps, block_frames, toy.vae.config.temporal_factor)
    print(
        f"toyworld drift: {args.scenes} scenes x {args.seconds:.0f} s ({drift_blocks} blocks) per variant", flush=True
    )
    quality = toyworld_videos(engines, drift_blocks, args.blocks, args.scenes)

    block_s: dict[Variant, float] = {}
    step_s: dict[str, float] = {}
    if args.repeats:
        block_s = time_toyworld(engines, args.time_blocks, args.repeats)
        step_s = {k: statistics.median(v) for k, v in time_steps(step_benches(runs), args.repeats).items()}

    real = load_preset(REAL_PRESET)
    toy_latent = native_latent_size(toy.preset)
    toy_window = toy.pipeline_config.block.local_attn_size
    weights = {"toyworld": dit_bytes(toy.dit.config, args.modes), REAL_PRESET: dit_bytes(real.dit, args.modes)}
    kv = {
        "toyworld": kv_bytes(toy.dit.config, toy_latent, toy_window, kvs),
        REAL_PRESET: kv_bytes(real.dit, native_latent_size(real), args.real_frames, kvs),
    }

    print()
    print_variants(runs, golden, golden_ref, quality, block_s, step_s)
    print()
    toy_kv = f"toyworld KV ({toy_window} frames, {toy_latent[0]}x{toy_latent[1]} latent)"
    print_bytes(
        weights, {toy_kv: kv["toyworld"], f"{REAL_PRESET} KV ({args.real_frames} frames, 480x832)": kv[REAL_PRESET]}
    )

    if args.json:
        out = {
            "args": {k: str(val) for k, val in vars(args).items()},
            "int8_path": int8_path("cpu"),
            "int8_activation_levels": levels,
            "kv_read_path": read_paths,
            "golden_rel_l2": golden,
            "golden_fp32_vs_reference": golden_ref,
            "toyworld": {v.name: asdict(quality[v]) for v in runs},
            "toyworld_block_ms": {v.name: s * 1e3 for v, s in block_s.items()},
            "dit_step_ms": {k: s * 1e3 for k, s in step_s.items()},
            "weight_bytes": weights,
            "kv_bytes_per_session": kv,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
