"""`make gpu-check`: one prepared run that proves and measures every CUDA path of the engine.

    bash scripts/gpu-check.sh                      # what `make gpu-check` runs: carried wheels, then this
    python scripts/gpu_check.py --device cpu       # the dry run: every stage at toy sizes (what CI runs)
    python scripts/gpu_check.py --stages e2e,kv-offload --budget-s 200   # a shorter rerun

A GPU is lent to a task only by chance, for minutes, without network. This script uses such a
machine in one go, in the order that keeps the most important results if time runs out:

  1. setup        nvidia-smi, torch / CUDA versions, the carried wheels, the attention backend
  2. correctness  golden vectors in fp32 on the device (TF32 off, asserted), the same in bf16
                  (measured, not asserted), toyworld frames on the device vs the CPU (PSNR)
  3. speed        Wan2.1-1.3B at 480x832 with random weights through `WanEngine`: DiT and VAE ms per
                  block, end-to-end FPS, time to first frame, SDPA vs flash-attn; attention kernels;
                  KV host offload / restore; bench/engine.py; eager vs --compile vs --cuda-graphs;
                  what is not available (fp8, NVENC)
  4. pods         a 2-rank NCCL pod (Ulysses, Ring) vs one GPU when there are two GPUs
  5. results      results.json and results.md in --out, rewritten after every stage (and copied to
                  $OUT/gpu-check when the device tool sets $OUT), results.md printed at the end

Each stage runs as its own process with its own timeout, cut to what is left of --budget-s: a stage
that fails, crashes or times out is recorded with what it measured so far, and the next one runs.
Without CUDA the same stages run at toy sizes on the CPU (a 2-rank gloo pod included), so the
script is tested by CI and cannot rot; their numbers say nothing about GPU speed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the driver itself never imports torch or the engine: only the stage processes do
    import torch

    from engine.families.wan.loader import LoadedModel
    from inferix.spec.presets import ModelPreset

REPO = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve()
DEFAULT_OUT = REPO / "out" / "gpu-check"
DEFAULT_BUDGET_S = 450.0  # 7.5 min: the issue's 8 minutes, less the wheel install and start-up
RESERVE_S = 5.0  # kept back from the budget to write the results after the last stage
MIN_STAGE_S = 10.0  # a stage given less than this is skipped rather than started to be killed

# What the check imports that the GPU machine lacks. Its image has torch, triton, numpy, grpcio,
# protobuf, safetensors, tokenizers, sentencepiece, transformers, PyYAML, tqdm, typing-extensions
# and matplotlib, but none of these. `make gpu-wheels` downloads the pins (the versions the test
# suite runs with); gpu-check.sh installs those whose module is missing where it runs.
WHEELS: dict[str, str] = {
    "av==18.1.0": "av",  # inferix.media (inferix generate's MP4) and the NVENC / libx264 probe
    "ftfy==6.3.1": "ftfy",  # the umt5 tokenizer module, imported by every model load
    "wcwidth==0.7.0": "wcwidth",  # ftfy's dependency
    "opentelemetry-api==1.45.2": "opentelemetry.context",  # streamer.packets, under the NVENC probe
}
WHEELS_MAX_MIB = 60.0  # the wheels' own limit
TRAVEL_MAX_MIB = 64.0  # what travels to the GPU machine: the working tree and the carried .whl/ together

# Published figures the speed stage is compared with in results.md.
TARGETS = [
    ("Self Forcing 1.3B, one H100", "17 FPS end to end", "fps"),
    ("flashdreams, H100", "344 ms per 12-frame block, DiT only", "dit_ms"),
    ("LongLive, one H100", "20.7 FPS end to end", "fps"),
    ("our goal", ">= 35 FPS end to end, time to first frame <= 0.3 s", "goal"),
]
GOAL_FPS = 35.0
GOAL_TTFF_S = 0.3


# ---- sizes ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sizes:
    """The shapes of one run: the real ones on a GPU, toy ones for the CPU dry run."""

    name: str
    preset: str  # architecture + sampling of the speed stages (Self Forcing, or its tiny twin)
    dit_preset: str | None  # inferix.spec.architectures.DIT_PRESETS entry replacing the preset's DiT
    latent: tuple[int, int]  # latent H x W (pixels are 8x)
    blocks: int  # blocks of a measured session (7 x 3 = 21 latent frames: Self Forcing's video)
    repeats: int  # measured sessions (medians reported)
    timing_repeats: int  # calls per kernel timing
    kv_frames: int  # latent frames of the offloaded session
    toyworld_blocks: int
    pod_blocks: int
    nvenc_frames: int
    golden: str  # the golden cases verified (a folder of cases, or one case)


REAL = Sizes(
    name="real",
    preset="self-forcing-dmd",
    dit_preset="wan2.1-1.3b",
    latent=(60, 104),
    blocks=7,
    repeats=3,
    timing_repeats=10,
    kv_frames=6,
    toyworld_blocks=8,
    pod_blocks=3,
    nvenc_frames=96,
    golden="tests/golden",
)
TOY = Sizes(
    name="toy",
    preset="tiny",  # Self Forcing's architecture and sampling, scaled down
    dit_preset=None,
    latent=(8, 8),
    blocks=2,
    repeats=1,
    timing_repeats=2,
    kv_frames=2,
    toyworld_blocks=2,
    pod_blocks=2,
    nvenc_frames=8,
    golden="tests/golden/selfforcing_tiny_rolling",  # one case: bf16 on a CPU is slow, and CI checks all in fp32
)


# ---- stage records ------------------------------------------------------------------------------
class Skip(Exception):
    """The stage cannot run here (no second GPU, ...): recorded as skipped with this reason."""


class CheckFailed(Exception):
    """The stage ran and a check it asserts did not hold: recorded as failed with this reason."""


class Recorder:
    """One stage's results, rewritten to its file after every change: a killed stage keeps its figures."""

    def __init__(self, path: Path, data: dict[str, Any] | None = None) -> None:
        self.path = path
        self.data: dict[str, Any] = data or {"metrics": {}, "commands": [], "notes": []}

    @classmethod
    def load(cls, path: Path) -> Recorder:
        return cls(path, json.loads(path.read_text()) if path.is_file() else None)

    def set(self, key: str, value: Any) -> None:
        self.data["metrics"][key] = value
        self.flush()

    def command(self, command: str) -> None:
        self.data["commands"].append(command)
        self.flush()

    def note(self, text: str) -> None:
        self.data["notes"].append(text)
        self.flush()

    def finish(self, status: str, reason: str = "") -> None:
        self.data.update(status=status, reason=reason)
        self.flush()

    def flush(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)  # atomic: the driver never reads half a file


@dataclass
class Context:
    """What a stage function gets: where it runs, at which sizes, and its recorder."""

    device: str  # "cuda" or "cpu"
    sizes: Sizes
    out: Path
    record: Recorder

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    @property
    def dtype_name(self) -> str:
        """The engine's own default: bf16 on CUDA, fp32 on the CPU."""
        return "bf16" if self.cuda else "fp32"


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def timed_ms(fn: Callable[[], object], device: str, repeats: int) -> float:
    """Median wall time of `fn` in ms, after one untimed call (kernel selection, allocator warm-up)."""
    fn()
    sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def first_line(exc: BaseException, limit: int = 160) -> str:
    """An exception in one short line, for a table cell."""
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0] if text else ''}"
    return line if len(line) <= limit else line[: limit - 3] + "..."


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """`inferix ARGV` in this process: (exit code, stdout, stderr)."""
    from inferix_cli.main import main as inferix_main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = inferix_main(argv)
    print(out.getvalue() + err.getvalue())  # into the stage's log as well
    return code, out.getvalue(), err.getvalue()


# ---- 1. setup -----------------------------------------------------------------------------------
def stage_setup(ctx: Context) -> None:
    import torch

    rec = ctx.record
    # The carried wheels first: without them the engine does not even import.
    wheels = {}
    for requirement, module in WHEELS.items():
        spec = importlib.util.find_spec(module) if _importable(module) else None
        wheels[requirement] = "missing" if spec is None else str(Path(spec.origin or "").parent)
    rec.set("wheel_modules", wheels)
    missing = [r for r, where in wheels.items() if where == "missing"]
    rec.set("python", platform.python_version())
    rec.set("torch", torch.__version__)
    rec.set("cuda_runtime", torch.version.cuda)
    rec.set("cudnn", torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
    smi = shutil.which("nvidia-smi")
    if smi:
        full = subprocess.run([smi], capture_output=True, text=True, timeout=30)
        print(full.stdout + full.stderr)
        rec.set("nvidia_smi", full.stdout.strip())
        query = "name,driver_version,memory.total,compute_cap,pcie.link.gen.max,pcie.link.width.max"
        csv = subprocess.run(
            [smi, f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
        keys = query.split(",")
        gpus = [dict(zip(keys, (v.strip() for v in line.split(",")), strict=False)) for line in csv.stdout.splitlines()]
        rec.set("gpus", gpus)
        rec.set("driver", gpus[0].get("driver_version") if gpus else None)
    else:
        rec.set("nvidia_smi", "not found")
    rec.set("device_count", torch.cuda.device_count() if ctx.cuda else 0)
    if ctx.cuda:
        props = torch.cuda.get_device_properties(0)
        rec.set("gpu", props.name)
        rec.set("gpu_memory_gib", round(props.total_memory / 2**30, 1))
        rec.set("compute_capability", f"{props.major}.{props.minor}")
        rec.set(
            "sdpa_kernels_enabled",
            {
                "flash": torch.backends.cuda.flash_sdp_enabled(),
                "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
                "cudnn": getattr(torch.backends.cuda, "cudnn_sdp_enabled", lambda: None)(),
                "math": torch.backends.cuda.math_sdp_enabled(),
            },
        )
        rec.set("tf32", {"matmul": torch.backends.cuda.matmul.allow_tf32, "cudnn": torch.backends.cudnn.allow_tf32})
    # Which attention runs: the engine's SDPA backend always; flash-attn only if importable (never built here).
    packages = {}
    for module in ("flash_attn", "flashinfer", "triton"):
        try:
            packages[module] = getattr(importlib.import_module(module), "__version__", "importable")
        except Exception as exc:  # a broken build can fail with anything, not only ImportError
            packages[module] = f"not available ({first_line(exc)})"
    rec.set("attention_packages", packages)
    if missing:
        raise CheckFailed(f"no module for {', '.join(missing)}: run make gpu-wheels where PyPI is, and carry .whl")
    from engine.attention.backends import get_backend

    rec.set("engine_attention_backend", get_backend("auto").name)
    major, minor = (int(v) for v in re.findall(r"\d+", torch.__version__)[:2])
    if (major, minor) < (2, 4):
        raise CheckFailed(f"torch {torch.__version__} is older than 2.4, the oldest the engine supports")


# ---- 2. correctness -----------------------------------------------------------------------------
def _golden_family(tensor: str) -> str:
    """Group a compared tensor's name: pipeline.x0_b2_s1 -> pipeline.x0, kv_cache.layer0.k -> kv_cache."""
    head, _, rest = tensor.partition(".")
    if head == "pipeline":
        return "pipeline.x0" if rest.startswith("x0_") else tensor
    return head


def _golden(ctx: Context, dtype: str, assert_parity: bool) -> None:
    rec = ctx.record
    argv = ["verify-golden", ctx.sizes.golden, "--device", ctx.device, "--dtype", dtype, "--json"]
    rec.command("inferix " + " ".join(argv))
    code, out, err = run_cli(argv)
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if not records:
        raise RuntimeError(f"inferix verify-golden printed no comparison (exit code {code}): {err.strip()[-500:]}")
    by_case: dict[str, dict[str, float]] = {}
    for r in records:
        families = by_case.setdefault(r["case"], {})
        family = _golden_family(r["tensor"])
        families[family] = max(families.get(family, 0.0), r["max_abs_diff"])
    failed = [r for r in records if not r["passed"]]
    worst = sorted(records, key=lambda r: -r["max_abs_diff"])[:5]
    rec.set("max_abs_diff", max(r["max_abs_diff"] for r in records))
    rec.set("comparisons", len(records))
    rec.set("above_tolerance", len(failed))
    rec.set("tolerance", records[0]["tolerance"])
    rec.set("by_case", by_case)
    rec.set("worst", [{k: r[k] for k in ("case", "tensor", "max_abs_diff")} for r in worst])
    if assert_parity and failed:
        names = ", ".join(f"{r['case']}/{r['tensor']} {r['max_abs_diff']:.2e}" for r in failed[:5])
        raise CheckFailed(f"{len(failed)} of {len(records)} comparisons above {records[0]['tolerance']}: {names}")


def stage_golden_fp32(ctx: Context) -> None:
    _golden(ctx, "fp32", assert_parity=True)


def stage_golden_bf16(ctx: Context) -> None:
    _golden(ctx, "bf16", assert_parity=False)  # bf16 cannot meet 1e-5: the error is the figure


TOYWORLD_PROMPT = "a red ball bouncing to the right"
TOYWORLD_CHANGE = "the ball turns green"


def _psnr(reference: Any, frames: Any) -> dict[str, Any]:
    """PSNR of uint8 frames [T, H, W, 3] against the reference: over all frames, and the worst frame."""
    import numpy as np

    diff = reference.astype(np.float64) - frames.astype(np.float64)
    per_frame = (diff**2).mean(axis=(1, 2, 3))

    def db(mse: float) -> float | None:  # None: identical (infinite PSNR, which JSON cannot hold)
        return None if mse == 0 else round(10 * float(np.log10(255.0**2 / mse)), 2)

    return {
        "psnr_db": db(float(per_frame.mean())),
        "min_frame_psnr_db": db(float(per_frame.max())),
        "identical_frames": int((per_frame == 0).sum()),
        "frames": int(len(per_frame)),
        "max_abs_pixel_diff": int(np.abs(diff).max()),
    }


def stage_toyworld(ctx: Context) -> None:
    import numpy as np

    from engine.families.wan.engine import WanEngine

    rec = ctx.record
    blocks = ctx.sizes.toyworld_blocks
    change_at = blocks // 2

    def frames(device: str, dtype: str) -> Any:
        engine = WanEngine.load("toyworld", device=device, dtype=dtype)
        out = []
        with engine.open(TOYWORLD_PROMPT, seed=1, num_blocks=blocks) as session:
            for block in session:
                out.append(block.frames)
                if block.index + 1 == change_at:
                    session.set_prompt(TOYWORLD_CHANGE)
        return np.concatenate(out)

    rec.command(f"WanEngine.load('toyworld', device=D, dtype=T): {blocks} blocks, prompt change at block {change_at}")
    reference = frames("cpu", "fp32")
    # The dry run has no second device: its CPU bf16 run still exercises the comparison.
    runs = [(ctx.device, "fp32"), (ctx.device, "bf16")] if ctx.cuda else [("cpu", "bf16")]
    for device, dtype in runs:
        rec.set(f"{device}_{dtype}_vs_cpu_fp32", _psnr(reference, frames(device, dtype)))
    # The command line itself, MP4 included, on the device with its default dtype.
    video = ctx.out / f"toyworld-{ctx.device}.mp4"
    argv = ["generate", "--prompt", TOYWORLD_PROMPT, "--prompt-at", f"{change_at}:{TOYWORLD_CHANGE}"]
    argv += ["--blocks", str(blocks), "--seed", "1", "--device", ctx.device, "--out", str(video), "--quiet"]
    rec.command("inferix " + " ".join(f'"{a}"' if " " in a else a for a in argv))
    code, out, err = run_cli(argv)
    if code != 0:
        raise CheckFailed(f"inferix generate exited {code}: {err.strip()[-500:]}")
    figures = re.search(r"time to first block ([\d.]+) s \| ([\d.]+) frames/s \| real-time factor ([\d.]+)", out)
    digest = re.search(r"frames sha256 ([0-9a-f]{64})", out)
    rec.set(
        "cli",
        {
            "time_to_first_block_s": float(figures.group(1)) if figures else None,
            "frames_per_s": float(figures.group(2)) if figures else None,
            "real_time_factor": float(figures.group(3)) if figures else None,
            "frames_sha256": digest.group(1) if digest else None,
            "mp4_bytes": video.stat().st_size if video.is_file() else 0,
        },
    )
    if not video.is_file() or video.stat().st_size == 0:
        raise CheckFailed(f"inferix generate wrote no MP4 at {video}")


# ---- 3. speed -----------------------------------------------------------------------------------
def speed_preset(sizes: Sizes) -> ModelPreset:
    """The preset the speed stages and the pods run: Self Forcing with the Wan2.1-1.3B DiT, or `tiny`."""
    from inferix.spec.architectures import DIT_PRESETS
    from inferix.spec.presets import load_preset

    preset = load_preset(sizes.preset)
    return preset if sizes.dit_preset is None else replace(preset, dit=DIT_PRESETS[sizes.dit_preset])


def random_model(ctx: Context) -> LoadedModel:
    """The speed stages' model: the preset's architecture with random weights, made on the device.

    The text encoder (umt5-xxl, 5.7B parameters) is left out: a prompt is encoded once per session,
    never per block, so random embeddings stand in for it.
    """
    import torch

    from engine.checkpoint import parse_dtype
    from engine.families.wan.dit import CausalWanDiT
    from engine.families.wan.loader import LoadedModel
    from engine.families.wan.text_encoder import PromptEncoder
    from engine.families.wan.vae import WanVAE
    from inferix.spec.architectures import WanVAEConfig

    preset = speed_preset(ctx.sizes)
    assert isinstance(preset.vae, WanVAEConfig), f"preset {preset.name} has no Wan VAE"
    dtype = parse_dtype(ctx.dtype_name)
    torch.manual_seed(0)
    with torch.device(ctx.device):  # random init where it runs: no CPU init and copy of 1.3B parameters
        dit = CausalWanDiT(preset.dit, attention_backend="sdpa")
        vae = WanVAE(preset.vae)
    text_len, text_dim = preset.dit.text_len, preset.dit.text_dim

    class RandomPromptEncoder(PromptEncoder):
        """Random embeddings fixed per prompt text (no tokenizer, no encoder: nothing to set up)."""

        def __init__(self) -> None:  # not PromptEncoder's: it wants the tokenizer and umt5 this replaces
            pass

        def encode(self, prompts: list[str]) -> torch.Tensor:
            generators = [torch.Generator().manual_seed(zlib.crc32(p.encode())) for p in prompts]
            embeds = torch.cat([torch.randn(1, text_len, text_dim, generator=g) for g in generators])
            return embeds.to(device=ctx.device, dtype=dtype)

    return LoadedModel(
        preset,
        dit.to(dtype).eval().requires_grad_(False),
        vae.to(dtype).eval().requires_grad_(False),
        RandomPromptEncoder(),
        source=None,
    )


def _session_figures(model: LoadedModel, ctx: Context, blocks: int) -> dict[str, Any]:
    """One session through `WanEngine` (what inferix generate and a worker run), timed per block."""
    from engine.families.wan.engine import WanEngine

    engine = WanEngine(model)
    h, w = ctx.sizes.latent
    factor = model.vae.config.spatial_factor
    sync(ctx.device)
    start = time.perf_counter()
    first_frame_s = 0.0
    pixel_frames = 0
    dit_ms, vae_ms = [], []
    with engine.open(
        "a red fox running through fresh snow", width=w * factor, height=h * factor, num_blocks=blocks
    ) as s:
        for block in s:
            if block.index == 0:
                first_frame_s = time.perf_counter() - start  # its frames are on the host: decoded
            pixel_frames += block.frames.shape[0]
            dit_ms.append((block.denoise_s + block.context_s) * 1e3)
            vae_ms.append(block.decode_s * 1e3)
    total_s = time.perf_counter() - start
    steady = slice(1, None) if blocks > 1 else slice(None)  # block 0 decodes 9 frames, later ones 12
    return {
        "dit_ms_per_block": statistics.mean(dit_ms),
        "dit_ms_first_block": dit_ms[0],
        "dit_ms_last_block": dit_ms[-1],
        "vae_ms_per_block": statistics.mean(vae_ms[steady]),
        "vae_ms_first_block": vae_ms[0],
        "fps": pixel_frames / total_s,
        "time_to_first_frame_s": first_frame_s,
        "pixel_frames": pixel_frames,
        "total_s": total_s,
        "dit_ms_blocks": [round(v, 1) for v in dit_ms],
        "vae_ms_blocks": [round(v, 1) for v in vae_ms],
    }


def stage_e2e(ctx: Context) -> None:
    import torch

    from engine.attention.backends import flash_attention_available

    rec = ctx.record
    sizes = ctx.sizes
    h, w = sizes.latent
    model = random_model(ctx)
    cfg = model.dit.config
    rec.set(
        "shape",
        {
            "preset": model.preset.name,
            "dit": sizes.dit_preset or model.preset.name,
            "dim": cfg.dim,
            "layers": cfg.num_layers,
            "heads": cfg.num_heads,
            "pixels": f"{h * 8}x{w * 8}",
            "latent": f"{h}x{w}",
            "tokens_per_frame": cfg.tokens_per_frame(h, w),
            "frames_per_block": model.pipeline_config.block.num_frame_per_block,
            "denoising_steps": len(model.pipeline_config.sampling.denoising_steps),
            "attention_window": model.pipeline_config.block.local_attn_size,
            "blocks": sizes.blocks,
            "dtype": ctx.dtype_name,
        },
    )
    rec.command(f"WanEngine(random {model.preset.name} model) -> open(...) -> {sizes.blocks} x next_block()")
    for backend in ("sdpa", "flash"):
        if backend == "flash" and not flash_attention_available():
            rec.set(backend, {"status": "not available", "reason": "flash-attn is not importable here (never built)"})
            continue
        model.dit.set_attention_backend(backend)
        _session_figures(model, ctx, min(2, sizes.blocks))  # warm-up: kernels, allocator, cuDNN choices
        if ctx.cuda:
            torch.cuda.reset_peak_memory_stats()
        runs = [_session_figures(model, ctx, sizes.blocks) for _ in range(sizes.repeats)]
        median_run = sorted(runs, key=lambda r: r["total_s"])[len(runs) // 2]
        figures: dict[str, Any] = {"status": "ok", "runs": len(runs), **median_run}
        for key in ("dit_ms_per_block", "vae_ms_per_block", "fps", "time_to_first_frame_s"):
            figures[key] = statistics.median(r[key] for r in runs)
        if ctx.cuda:
            figures["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        rec.set(backend, figures)


def stage_attention(ctx: Context) -> None:
    """One layer's self-attention at the real shape: a 3-frame block against a 21-frame context."""
    import torch

    from engine.attention.backends import AttentionBackend, FlashAttentionBackend, flash_attention_available
    from engine.checkpoint import parse_dtype

    rec = ctx.record
    preset = speed_preset(ctx.sizes)
    cfg, block = preset.dit, preset.pipeline.block
    page = cfg.tokens_per_frame(*ctx.sizes.latent)
    frames = ctx.sizes.blocks * block.num_frame_per_block
    dtype = parse_dtype(ctx.dtype_name)
    g = torch.Generator(device=ctx.device).manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=ctx.device, dtype=dtype)

    q = rand(1, block.num_frame_per_block * page, cfg.num_heads, cfg.head_dim)
    k, v = rand(1, frames * page, cfg.num_heads, cfg.head_dim), rand(1, frames * page, cfg.num_heads, cfg.head_dim)
    flops = 4 * q.shape[1] * k.shape[1] * cfg.num_heads * cfg.head_dim
    rec.set(
        "shape", {"q_tokens": q.shape[1], "kv_tokens": k.shape[1], "heads": cfg.num_heads, "head_dim": cfg.head_dim}
    )
    sdpa = AttentionBackend()
    repeats = ctx.sizes.timing_repeats

    def measure(name: str, fn: Callable[[], object]) -> None:
        try:
            ms = timed_ms(fn, ctx.device, repeats)
        except Exception as exc:  # a kernel that does not support this device / dtype / shape
            rec.set(name, {"status": "not available", "reason": first_line(exc)})
            return
        rec.set(name, {"status": "ok", "ms": ms, "tflops": flops / ms / 1e9})

    measure("sdpa_default", lambda: sdpa.dense(q, k, v))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for kernel in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        backend = getattr(SDPBackend, kernel, None)
        if backend is None:
            rec.set(f"sdpa_{kernel.lower()}", {"status": "not available", "reason": f"torch {torch.__version__}"})
            continue

        def pinned(b: SDPBackend = backend) -> object:
            with sdpa_kernel(b):
                return sdpa.dense(q, k, v)

        measure(f"sdpa_{kernel.lower()}", pinned)
    # The paged path as a session's cache calls it: pages of one latent frame, in a shuffled order
    # (index fetch: a gather, then SDPA), against flash-attn's native block_table when it applies.
    k_pages, v_pages = k[0].unflatten(0, (frames, page)), v[0].unflatten(0, (frames, page))
    ids = torch.randperm(frames, generator=torch.Generator().manual_seed(0)).to(ctx.device)
    measure("paged_sdpa_gather", lambda: sdpa.paged(q, k_pages, v_pages, ids))
    if flash_attention_available():
        flash = FlashAttentionBackend()
        measure("flash_attn_dense", lambda: flash.dense(q, k, v))
        measure("flash_attn_paged", lambda: flash.paged(q, k_pages, v_pages, ids))
    else:
        for name in ("flash_attn_dense", "flash_attn_paged"):
            rec.set(name, {"status": "not available", "reason": "flash-attn is not importable here (never built)"})
    native = page % 256 == 0  # flash-attn's block_table needs pages of a multiple of 256 tokens
    rec.set("flash_paged_native", native)
    if not native:
        rec.note(
            f"a page is one latent frame, {page} tokens, not a multiple of 256: flash-attn's paged kernel cannot "
            "read the pool in place at this size, so the engine gathers the pages for SDPA instead"
        )


def stage_kv_offload(ctx: Context) -> None:
    """A session's KV pages to host memory and back through `KVPool` (pinned + async on CUDA)."""
    import torch

    from engine.checkpoint import parse_dtype
    from engine.kv.pool import KVPool, KVPoolSpec

    rec = ctx.record
    cfg = speed_preset(ctx.sizes).dit
    tokens = cfg.tokens_per_frame(*ctx.sizes.latent)
    frames = ctx.sizes.kv_frames
    spec = KVPoolSpec(
        cfg.num_layers, cfg.num_heads, cfg.head_dim, tokens, frames, parse_dtype(ctx.dtype_name), ctx.device
    )
    pool = KVPool(spec)
    cache = pool.open_session("gpu-check", tokens)
    cache.begin(0, frames)
    pool.k.normal_()
    pool.v.normal_()
    nbytes = len(cache.pages) * spec.page_bytes
    before = pool.k.index_select(1, torch.tensor(cache.pages, device=ctx.device))  # a copy
    rec.set("session_bytes", nbytes)
    rec.set("frames", frames)
    rec.command(f"KVPool({spec}).open_session -> offload() / prefetch()")
    out_s, back_s = [], []
    for _ in range(ctx.sizes.timing_repeats // 2 + 2):
        sync(ctx.device)
        start = time.perf_counter()
        cache.offload()
        sync(ctx.device)
        mid = time.perf_counter()
        cache.prefetch()
        sync(ctx.device)
        out_s.append(mid - start)
        back_s.append(time.perf_counter() - mid)
    after = pool.k.index_select(1, torch.tensor(cache.pages, device=ctx.device))
    bit_exact = bool(torch.equal(before, after))
    rec.set("bit_exact", bit_exact)
    gb = nbytes / 1e9
    rec.set("offload_gb_per_s_first", gb / out_s[0])  # the first pays for allocating pinned memory
    rec.set("offload_gb_per_s", gb / statistics.median(out_s[1:]))
    rec.set("restore_gb_per_s_first", gb / back_s[0])
    rec.set("restore_gb_per_s", gb / statistics.median(back_s[1:]))
    if not bit_exact:
        raise CheckFailed("the restored KV pages differ from the offloaded ones")
    if not ctx.cuda:
        rec.set("raw_pinned", {"status": "not available", "reason": "pinned memory needs CUDA"})
        return
    # The link itself, for comparison: one pinned buffer of the same size, each way.
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=ctx.device)
    d2h = timed_ms(lambda: host.copy_(dev, non_blocking=True), ctx.device, 3)
    h2d = timed_ms(lambda: dev.copy_(host, non_blocking=True), ctx.device, 3)
    rec.set("raw_pinned", {"status": "ok", "d2h_gb_per_s": gb / d2h * 1e3, "h2d_gb_per_s": gb / h2d * 1e3})


def _run_bench(ctx: Context, script: str, args: list[str], keys: tuple[str, ...]) -> None:
    """Run a committed bench script with --json, record its printout and the figures `keys`."""
    rec = ctx.record
    figures = ctx.out / f"bench-{Path(script).stem}.json"
    figures.unlink(missing_ok=True)
    command = [script, *args, "--json", str(figures)]
    rec.command("python " + " ".join(command))
    done = subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True)
    print(done.stdout + done.stderr)
    rec.set("output", done.stdout.strip())
    if done.returncode != 0:
        raise RuntimeError(f"{script} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    data = json.loads(figures.read_text())
    for key in keys:
        rec.set(key, data[key])


def stage_bench_engine(ctx: Context) -> None:
    """bench/engine.py: paged KV pool (a ring for the window) vs the contiguous reference cache, bf16 and
    fp32, in the window's fill and rolling phases."""
    window = ["--window", "12", "--sink", "3", "--blocks", "7"]
    if ctx.sizes is REAL:
        args = ["--device", ctx.device, "--preset", "wan2.1-1.3b", "--dtypes", "bf16,fp32", *window, "--repeats", "2"]
    else:
        args = ["--device", ctx.device, "--dim", "64", "--layers", "2", "--heads", "2", "--latent", "8x8"]
        args += ["--dtypes", "fp32", *window, "--steps", "2", "--repeats", "1", "--threads", "1"]
    keys = ("ms_per_block", "kv_mib_per_session", "ratios")
    _run_bench(ctx, "bench/engine.py", args, keys)


def stage_engine_speed(ctx: Context) -> None:
    """One session's DiT calls eager, compiled (`--compile`) and replayed from CUDA graphs (`--cuda-graphs`),
    with a window of 4 blocks (2 in the dry run), the first the sink, so that both its fill and its rolling
    phase are timed: ms per block and the latents' max abs diff to eager. Each mode first warms up as a
    worker does at start-up (`warm_up`: compiles, captures). On a CPU the graphs' static-buffer step runs uncaptured and
    torch.compile uses its eager backend: the dry run proves the paths, not their speed."""
    import copy

    import torch

    from engine.compiled import CompileOptions, compile_dit, warm_up
    from engine.cuda_graphs import StaticStep, use_cuda_graphs
    from engine.families.wan.pipeline import WanPipeline
    from engine.kv.pool import KVPool
    from inferix.spec.sampling import BlockConfig

    rec = ctx.record
    model = random_model(ctx)
    h, w = ctx.sizes.latent
    nf = model.pipeline_config.block.num_frame_per_block
    fill = 4 if ctx.sizes is REAL else 2  # blocks that fit the window; as many more roll it (3 on a GPU)
    blocks = 2 * fill - 1 if ctx.sizes is REAL else 2 * fill
    window = BlockConfig(num_frame_per_block=nf, local_attn_size=fill * nf, sink_size=nf)
    config = replace(model.pipeline_config, block=window)
    rec.command(
        f"WanPipeline(random {model.preset.name} DiT, window {window.local_attn_size} sink {nf}) -> "
        f"{blocks} blocks per mode after warm_up; compile_dit, use_cuda_graphs (StaticStep on a CPU)"
    )
    prompt = torch.randn(1, model.dit.config.text_len, model.dit.config.text_dim).to(ctx.device)
    reference: list[torch.Tensor] | None = None
    for mode in ("eager", "compiled", "cuda_graphs"):
        dit = copy.deepcopy(model.dit)
        pipeline = WanPipeline(dit, config)
        pipeline.pool = KVPool(pipeline.pool_spec(h, w, 2 * window.local_attn_size))
        began = time.perf_counter()
        if mode == "compiled":
            compile_dit(dit, CompileOptions(backend="inductor" if ctx.cuda else "eager"))
        elif mode == "cuda_graphs":
            dit.compiled_step = use_cuda_graphs(dit, pipeline.pool) if ctx.cuda else StaticStep(dit, pipeline.pool)
        warm_up(pipeline, h, w)
        setup_s = time.perf_counter() - began
        block_s: list[float] = []
        latents: list[torch.Tensor] = []
        with pipeline.open_session(prompt, h, w, seed=0, num_blocks=blocks) as session:
            for _ in range(blocks):
                sync(ctx.device)
                start = time.perf_counter()
                latents.append(session.generate_block().latents.float().cpu())
                sync(ctx.device)
                block_s.append(time.perf_counter() - start)
        reference = reference or latents
        diff = max(float((a - b).abs().max()) for a, b in zip(reference, latents, strict=True))
        rec.set(
            mode,
            {
                "setup_s": setup_s,
                "fill_ms_per_block": statistics.mean(block_s[:fill]) * 1e3,
                "rolling_ms_per_block": statistics.mean(block_s[fill:]) * 1e3,
                "max_abs_diff_vs_eager": diff,
            },
        )


QUANT_VARIANTS = (("none", "auto"), ("int8", "auto"), ("fp8", "auto"), ("fp8", "fp8"))


def stage_quant(ctx: Context) -> None:
    """`--quant` / `--kv-dtype` through `WanEngine`: one session per variant (weights x KV storage) of the
    speed preset (Wan2.1-1.3B at 480x832 on a GPU), DiT ms per block and end-to-end fps, the first
    block's latents against unquantized (relative L2), and the DiT's weight bytes. fp8 needs sm 8.9+:
    on an older GPU it is recorded as refused, with the engine's one-line error."""
    import copy

    import torch

    from engine.families.wan.engine import WanEngine
    from engine.quant import check_quant_device, int8_path, parse_quant, quantize_linears, weight_bytes

    rec = ctx.record
    model = random_model(ctx)
    blocks = 4 if ctx.sizes is REAL else 1  # the dry run proves the paths
    h, w = ctx.sizes.latent
    factor = model.vae.config.spatial_factor
    rec.command(f"WanEngine(random {model.preset.name}, quant=..., kv_dtype=...) -> {blocks} blocks per variant")
    rec.set("int8_kernel", int8_path(torch.device(ctx.device).type))
    reference: torch.Tensor | None = None
    for quant, kv_dtype in QUANT_VARIANTS:
        label = quant if kv_dtype == "auto" else f"{quant}+kv-{kv_dtype}"
        mode = parse_quant(quant)
        try:
            check_quant_device(mode.is_fp8, ctx.device)
        except Exception as exc:
            rec.set(label, {"status": "refused", "reason": first_line(exc)})
            continue
        dit = quantize_linears(copy.deepcopy(model.dit), mode) if mode.enabled else model.dit
        engine = WanEngine(replace(model, dit=dit), kv_dtype=kv_dtype)
        dit_ms: list[float] = []
        first: torch.Tensor | None = None
        sync(ctx.device)
        start = time.perf_counter()
        frames = 0
        with engine.open("a red fox in snow", width=w * factor, height=h * factor, num_blocks=blocks, seed=0) as s:
            for block in s:
                dit_ms.append((block.denoise_s + block.context_s) * 1e3)
                frames += block.frames.shape[0]
                if first is None:
                    first = block.latents.float().cpu()
        sync(ctx.device)
        total_s = time.perf_counter() - start
        assert first is not None
        reference = first if reference is None else reference
        error = float((first - reference).norm() / reference.norm())
        steady = dit_ms[1:] if len(dit_ms) > 1 else dit_ms
        rec.set(
            label,
            {
                "status": "ok",
                "dit_ms_per_block": statistics.mean(steady),
                "fps": frames / total_s,
                "rel_l2_vs_none": error,
                "dit_weight_gib": weight_bytes(dit) / 2**30,
            },
        )
        del engine, dit


def stage_magi(ctx: Context) -> None:
    """bench/magi.py: MAGI-1's chunk pipeline, seconds per chunk against the chunk's real-time budget."""
    if ctx.sizes is REAL:  # the 4.5B-distill DiT at 720x720, random weights; 16 steps keep it in budget
        args = ["--preset", "magi1-4.5b-distill", "--full", "--latent", "90x90", "--steps", "16", "--dtype", "bf16"]
        args += ["--chunks", "3", "--modes", "distill"]
    else:
        args = ["--latent", "8x8", "--chunks", "2", "--modes", "distill", "--threads", "1"]
    keys = ("distill_first_chunk_s", "distill_steady_chunk_s", "video_s_per_chunk")
    _run_bench(ctx, "bench/magi.py", ["--device", ctx.device, *args], keys)


def _open_sessions(engine: Any, n: int, width: int, height: int, warm: bool) -> list[Any]:
    """`n` sessions; `warm`: each has made one block (kernels, allocator, and a cache to attend to)."""
    sessions = [engine.open(f"prompt {i}", width=width, height=height, seed=i, num_blocks=4) for i in range(n)]
    for session in sessions if warm else ():
        session.next_block()
    return sessions


def stage_batching(ctx: Context) -> None:
    """Continuous batching: N sessions' blocks batched vs one at a time, at the real shape and at half of
    it; per-stream frames/s, the most streams at real time, and how far batched blocks are from solo
    ones (bit-identical on CPUs; cuBLAS picks kernels by batch size)."""
    from engine.families.wan.engine import WanEngine
    from engine.families.wan.pipeline import WanPipeline
    from engine.kv.pool import KVPool

    rec = ctx.record
    model = random_model(ctx)
    factor = model.vae.config.spatial_factor
    h, w = ctx.sizes.latent
    real = ctx.sizes is REAL
    counts = (1, 2, 4, 8) if real else (2,)  # a dry run only proves the stage runs
    rec.command(
        f"WanEngine(random model).batcher().run([s.block_job() for s in N sessions]) vs N x next_block(), N={counts}"
    )
    sizes = {"native": (h, w), "half": (h // 4 * 2, w // 4 * 2)} if real else {"native": (h, w)}
    for label, (lh, lw) in sizes.items():
        probe = WanPipeline(model.dit, model.pipeline_config)
        window = probe.session_frames(4)
        rows: list[dict[str, Any]] = []
        for n in counts:
            engine = WanEngine(model, KVPool(probe.pool_spec(lh, lw, 2 * n * window)))

            solo, batched = (_open_sessions(engine, n, lw * factor, lh * factor, warm=real) for _ in range(2))
            batcher = engine.batcher()
            sync(ctx.device)
            start = time.perf_counter()
            alone = [s.next_block() for s in solo]
            sync(ctx.device)
            solo_s = time.perf_counter() - start
            start = time.perf_counter()
            together = batcher.run([s.block_job() for s in batched])
            sync(ctx.device)
            batched_s = time.perf_counter() - start
            frames = sum(b.frames.shape[0] for b in together)
            diff = max(float((a.latents - b.latents).abs().max()) for a, b in zip(alone, together, strict=True))
            rows.append(
                {
                    "sessions": n,
                    "one_at_a_time_fps": frames / solo_s,
                    "batched_fps": frames / batched_s,
                    "ratio": solo_s / batched_s,
                    "fps_per_stream": frames / batched_s / n,
                    "max_abs_diff": diff,
                }
            )
            for session in (*solo, *batched):
                session.close()
        realtime = [r["sessions"] for r in rows if r["fps_per_stream"] >= model.fps]
        rec.set(
            label,
            {"pixels": f"{lh * factor}x{lw * factor}", "rows": rows, "streams_at_realtime": max(realtime, default=0)},
        )


def stage_extras(ctx: Context) -> None:
    """What the issue asks for only "if present" (fp8, NVENC): recorded as not available rather than built here
    (torch.compile and CUDA graphs: the engine-speed stage)."""
    import numpy as np
    import torch

    from engine.checkpoint import DTYPES
    from streamer.encoder import LIBX264, NVENC, H264Encoder, probe_encoder
    from streamer.packets import StreamFormat

    rec = ctx.record
    dtypes = sorted({str(d).removeprefix("torch.") for d in DTYPES.values()})
    capability = torch.cuda.get_device_capability() if ctx.cuda else None
    rec.set(
        "fp8",
        {
            "status": "ok",
            "reason": f"--dtype: {', '.join(dtypes)}; fp8 weights and KV: --quant fp8 / --kv-dtype fp8 (quant stage)",
            "hardware_fp8": capability is not None and capability >= (8, 9),
        },
    )
    # The streamer's H.264 encoders at the video's size: NVENC if it opens here, libx264 (CPU) as the baseline.
    h, w = (8 * v for v in ctx.sizes.latent)
    frame = np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8).tobytes()
    for codec in (NVENC, LIBX264):
        try:
            problem = probe_encoder(codec)
        except Exception as exc:  # a PyAV built without the codec at all raises its own error type
            problem = first_line(exc)
        if problem is not None:
            rec.set(codec, {"status": "not available", "reason": problem})
            continue
        encoder = H264Encoder(StreamFormat(w, h, 16.0), codec)
        start = time.perf_counter()
        for i in range(ctx.sizes.nvenc_frames):
            encoder.encode(frame, i)
        encoder.flush()
        rec.set(
            codec, {"status": "ok", "fps": ctx.sizes.nvenc_frames / (time.perf_counter() - start), "size": f"{w}x{h}"}
        )


# ---- 4. pods ------------------------------------------------------------------------------------
POD_STRATEGIES = ("ulysses", "ring-pass-kv", "ring-pass-q")


def stage_pods(ctx: Context) -> None:
    import torch

    if ctx.cuda and torch.cuda.device_count() < 2:
        raise Skip(f"{torch.cuda.device_count()} CUDA device here; a 2-rank NCCL pod needs 2")
    ctx.record.set("backend", "nccl" if ctx.cuda else "gloo (dry run: CPU ranks at toy size)")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += [str(SCRIPT), "--pod-rank", str(ctx.record.path)]
    command += ["--device", ctx.device, "--sizes", ctx.sizes.name, "--out", str(ctx.out)]
    ctx.record.command(" ".join(["python", *command[1:]]))
    done = subprocess.run(command, cwd=REPO)  # rank 0 writes into this stage's file as it goes
    ctx.record.data = Recorder.load(ctx.record.path).data
    if done.returncode != 0:
        raise RuntimeError(f"the pod exited {done.returncode} (see this stage's log)")


def pod_rank(args: argparse.Namespace) -> int:
    """One rank of the pods stage, under torchrun: one GPU each (NCCL), or a CPU rank (gloo)."""
    import torch
    import torch.distributed as dist

    from engine.checkpoint import parse_dtype
    from engine.families.wan.dit import CausalWanDiT
    from engine.families.wan.pipeline import WanPipeline
    from engine.parallel.cost import ParallelConfig
    from engine.parallel.pod_driver import PodDriver
    from engine.parallel.pod_main import PodSpec, build_pod, init_distributed, serve_pod

    sizes = SIZES[args.sizes]
    device = init_distributed(args.device)
    rank = dist.get_rank()
    rec = Recorder.load(args.pod_rank) if rank == 0 else None  # the pods stage's file
    preset = speed_preset(sizes)
    config = preset.dit
    dtype = parse_dtype("bf16" if device.type == "cuda" else "fp32")
    h, w = sizes.latent
    embeds = torch.randn(1, config.text_len, config.text_dim, generator=torch.Generator().manual_seed(0))
    blocks = sizes.pod_blocks

    def session(run: Callable[[str, int], list[Any]]) -> tuple[torch.Tensor, float]:
        run("warm-up", 1)
        outputs = run("measured", blocks)
        latents = torch.cat([b.latents.float().cpu() for b in outputs], dim=1)
        return latents, statistics.mean(b.timings.total_s for b in outputs) * 1e3

    single: torch.Tensor | None = None
    if rank == 0:  # the baseline: the same weights (same seed, as build_pod makes them) on one device
        torch.manual_seed(0)
        dit = CausalWanDiT(config, attention_backend="sdpa").to(device=device, dtype=dtype).eval()
        pipeline = WanPipeline(dit, preset.pipeline)

        def alone(name: str, n: int) -> list[Any]:
            with pipeline.open_session(embeds, h, w, seed=0, num_blocks=n) as s:
                return list(s)

        single, single_ms = session(alone)
        assert rec is not None
        rec.set("single", {"ms_per_block": single_ms})
        del dit, pipeline
    dist.barrier()
    for strategy in POD_STRATEGIES:
        spec = PodSpec(
            dit=config,
            pipeline=preset.pipeline,
            latent_height=h,
            latent_width=w,
            parallel=ParallelConfig(strategy=strategy),
            dtype=dtype,
            attention_backend="sdpa",
        )
        engine, choice = build_pod(spec, device)
        result: dict[str, Any] = {"plan": choice.plan.name}

        def serve(driver: PodDriver, result: dict[str, Any] = result) -> None:
            def run(name: str, n: int) -> list[Any]:
                driver.open_session(name, embeds, h, w, seed=0, num_blocks=n)
                outputs = [driver.generate_block(name) for _ in range(n)]
                driver.close_session(name)
                return outputs

            latents, ms = session(run)
            assert single is not None
            result.update(ms_per_block=ms, max_abs_diff_vs_single=float((latents - single).abs().max()))

        serve_pod(engine, serve)
        if rec is not None:
            result["speedup_vs_single"] = rec.data["metrics"]["single"]["ms_per_block"] / result["ms_per_block"]
            rec.set(strategy, result)
        del engine
    dist.destroy_process_group()
    return 0


def stage_taehv(ctx: Context) -> None:
    """TAEHV vs the Wan VAE decode: one streamed block of 3 latent frames after a first frame, same latents."""
    import torch

    from engine.decoders.taehv import load_taehv
    from engine.decoders.taehv_golden import verify_taehv_case
    from engine.families.wan.vae import WanVAE
    from inferix.spec.architectures import WanVAEConfig

    rec = ctx.record
    case = Path("tests/golden/taew2_1_tiny")
    if ctx.cuda:  # the golden case on the GPU in fp32: measured, not asserted (cuDNN's conv order is not the CPU's)
        golden = verify_taehv_case(case, 1e-5, ctx.device, torch.float32)
        rec.set("golden_fp32_max_abs_diff", max(c.max_abs_diff for c in golden))
    else:
        rec.note("the golden case on the CPU is asserted by tests/engine/decoders (inferix verify-golden)")
    dtype = torch.bfloat16 if ctx.cuda else torch.float32
    real = ctx.sizes is REAL
    h, w = ctx.sizes.latent if real else (4, 4)  # 480x832; the dry run only proves the code path
    dim = 96 if real else 8  # the released Wan VAE; a toy one for the dry run
    latents = torch.randn(1, 4, 16, h, w, generator=torch.Generator().manual_seed(0)).to(ctx.device, dtype)
    first, block = latents[:, :1], latents[:, 1:]
    taehv = load_taehv(case / "taew2_1.pth", dtype=dtype, device=ctx.device)
    vae = WanVAE(WanVAEConfig(dim=dim)).eval().to(ctx.device, dtype)
    rec.command(f"TAEHV (taew2_1 layout) vs WanVAE(dim={dim}) decode_block, {ctx.dtype_name}, latent {h}x{w}")
    figures: dict[str, Any] = {"pixels": f"{8 * h}x{8 * w}", "dtype": ctx.dtype_name, "wan_vae_dim": dim}
    with torch.no_grad():
        state = taehv.new_decode_state()
        taehv.decode_stream(first, state)
        repeats = 3 if ctx.cuda else 1
        figures["taehv_ms_per_block"] = timed_ms(lambda: taehv.decode_stream(block, state), ctx.device, repeats)
        vae_state = vae.new_decode_state()
        vae.decode_block(first, vae_state)
        figures["wan_vae_ms_per_block"] = timed_ms(lambda: vae.decode_block(block, vae_state), ctx.device, repeats)
    figures["speedup"] = figures["wan_vae_ms_per_block"] / figures["taehv_ms_per_block"]
    if ctx.cuda:
        figures["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    rec.set("decode", figures)


# ---- the driver ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stage:
    name: str
    title: str
    run: Callable[[Context], None]
    timeout_s: float  # at real sizes on a GPU; the budget cuts it further


STAGES = [
    Stage("setup", "Setup: GPU, driver, versions, wheels, attention backend", stage_setup, 60),
    Stage("golden-fp32", "Golden vectors, fp32 (TF32 off): asserted", stage_golden_fp32, 90),
    Stage("golden-bf16", "Golden vectors, bf16: error measured", stage_golden_bf16, 60),
    Stage("toyworld", "toyworld frames on the device vs the CPU; inferix generate", stage_toyworld, 90),
    Stage("e2e", "Speed: DiT, VAE, end to end through WanEngine (SDPA, flash-attn)", stage_e2e, 150),
    Stage("attention", "Speed: attention kernels at the real shape", stage_attention, 60),
    Stage("kv-offload", "Speed: KV host offload / restore", stage_kv_offload, 60),
    Stage("bench-engine", "Speed: bench/engine.py, paged vs contiguous KV", stage_bench_engine, 120),
    Stage("batching", "Speed: continuous batching, N sessions per device", stage_batching, 120),
    Stage("extras", "fp8, NVENC", stage_extras, 45),
    Stage("pods", "Pods: 2-rank Ulysses / Ring vs one device", stage_pods, 180),
    Stage("engine-speed", "Speed: DiT eager vs --compile vs --cuda-graphs, fill and rolling", stage_engine_speed, 150),
    Stage("quant", "Speed: --quant int8 / fp8 and --kv-dtype fp8 vs unquantized, per block", stage_quant, 120),
    Stage("magi", "Speed: MAGI-1 chunk pipeline, seconds per chunk (4.5B-distill shapes)", stage_magi, 90),
    Stage("taehv", "Speed: TAEHV tiny decoder vs the Wan VAE decode, one block at 480x832", stage_taehv, 60),
]
SIZES = {s.name: s for s in (REAL, TOY)}


def run_stage_process(args: argparse.Namespace) -> int:
    """Body of one stage's process: run its function, record how it ended."""
    stage = next(s for s in STAGES if s.name == args.run_stage)
    rec = Recorder(args.out / "stages" / f"{stage.name}.json")
    rec.flush()
    ctx = Context(args.device, SIZES[args.sizes], args.out, rec)
    try:
        stage.run(ctx)
    except Skip as exc:
        rec.finish("skipped", str(exc))
    except CheckFailed as exc:
        rec.finish("failed", str(exc))
    except Exception as exc:
        rec.finish("error", first_line(exc))
        raise  # the traceback goes to the stage's log
    else:
        rec.finish("ok")
    return 0


def stage_env() -> dict[str, str]:
    """The stages import the repository without an install (the GPU machine has none)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    paths = [str(REPO), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def run_stage(stage: Stage, device: str, sizes: Sizes, out: Path, timeout_s: float) -> dict[str, Any]:
    """Run one stage in its own process group; kill the whole group (torchrun's ranks too) on timeout."""
    path = out / "stages" / f"{stage.name}.json"
    log = out / "logs" / f"{stage.name}.log"
    command = [sys.executable, str(SCRIPT), "--run-stage", stage.name, "--device", device, "--sizes", sizes.name]
    command += ["--out", str(out)]
    start = time.monotonic()
    status = ""
    with log.open("w") as log_file:
        # A process group of its own (killable as one), in this session: a session of its own would
        # outlive the device tool's command if that one is stopped.
        proc = subprocess.Popen(
            command, cwd=REPO, env=stage_env(), stdout=log_file, stderr=subprocess.STDOUT, process_group=0
        )
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            status = "timeout"
            _kill_group(proc)
            code = proc.returncode
        except BaseException:  # Ctrl-C, or SIGTERM (see drive): leave no stage running behind us
            _kill_group(proc)
            raise
    seconds = time.monotonic() - start
    data = Recorder.load(path).data
    if status == "timeout":
        data.update(status="timeout", reason=f"killed after {timeout_s:.0f} s; figures until then are kept")
    elif "status" not in data:  # died before recording how it ended (a crash, an OOM kill)
        data.update(status="error", reason=f"exit code {code} before the stage finished; see {log.name}")
    elif code != 0 and data["status"] == "ok":
        data.update(status="error", reason=f"exit code {code}")
    tail = log.read_text(errors="replace").strip().splitlines()[-15:]
    return {"name": stage.name, "title": stage.title, "seconds": round(seconds, 1), "log": str(log), **data} | (
        {"log_tail": tail} if data["status"] in ("error", "timeout", "failed") else {}
    )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM first: torchrun forwards it to its ranks, which run in sessions of their own."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def skipped(stage: Stage, reason: str) -> dict[str, Any]:
    return {"name": stage.name, "title": stage.title, "status": "skipped", "reason": reason, "metrics": {}}


def resolve_device(name: str) -> str:
    if name == "cpu":
        return name
    import torch

    available = torch.cuda.is_available()
    if name == "auto":
        return "cuda" if available else "cpu"
    if name == "cuda" and not available:
        raise SystemExit(
            f"gpu_check: --device cuda, but torch {torch.__version__} sees no CUDA device; "
            "--device cpu runs the dry run"
        )
    return name


def drive(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # unwinds into run_stage's cleanup
    device = resolve_device(args.device)
    sizes = SIZES[args.sizes] if args.sizes != "auto" else (REAL if device == "cuda" else TOY)
    selected = [s.strip() for s in args.stages.split(",")] if args.stages else [s.name for s in STAGES]
    unknown = set(selected) - {s.name for s in STAGES}
    if unknown:
        raise SystemExit(
            f"gpu_check: unknown stage(s) {', '.join(sorted(unknown))}; stages: {', '.join(s.name for s in STAGES)}"
        )
    out: Path = args.out.resolve()
    for folder in ("stages", "logs"):
        shutil.rmtree(out / folder, ignore_errors=True)
        (out / folder).mkdir(parents=True)
    started = time.monotonic()
    results: dict[str, Any] = {
        "schema": 1,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([os.environ.get("GPU_CHECK_COMMAND", "python scripts/gpu_check.py"), *sys.argv[1:]]),
        "device": device,
        "sizes": sizes.name,
        "dry_run": device != "cuda",
        "budget_s": args.budget_s,
        "host": {"hostname": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "targets": [{"who": who, "figure": figure} for who, figure, _ in TARGETS],
        "stages": [],
    }
    print(f"gpu-check: device {device}, {sizes.name} sizes, budget {args.budget_s:.0f} s, results in {out}")
    for index, stage in enumerate(STAGES, 1):
        left = args.budget_s - (time.monotonic() - started) - RESERVE_S
        label = f"[{index:2}/{len(STAGES)}] {stage.name:<13}"
        if stage.name not in selected:
            record = skipped(stage, "not in --stages")
        elif left < MIN_STAGE_S:
            record = skipped(stage, f"{left:.0f} s of --budget-s left")
        else:
            print(f"{label} ...", flush=True)
            record = run_stage(stage, device, sizes, out, min(stage.timeout_s, left))
        print(
            f"{label} {record['status']:<8} {record.get('seconds', 0):6.1f} s  {record.get('reason', '')}", flush=True
        )
        results["stages"].append(record)
        results["total_s"] = round(time.monotonic() - started, 1)
        write_results(results, out)
    bad = [s["name"] for s in results["stages"] if s["status"] not in ("ok", "skipped")]
    good = len(STAGES) - len(bad)
    # The results once more on stdout: the device tool returns the output's tail even if no file comes back.
    print("\n" + (out / "results.md").read_text())
    print(f"gpu-check: {good} of {len(STAGES)} stages ok or skipped in {results['total_s']} s: {out / 'results.md'}")
    return 1 if bad else 0


def write_results(results: dict[str, Any], out: Path) -> None:
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    try:
        report = render_markdown(results)
    except Exception as exc:  # a figure of an unforeseen shape must not stop the stages still to run
        report = f"# GPU check results\n\nresults.md could not be rendered ({first_line(exc)}); see results.json.\n"
    (out / "results.md").write_text(report)
    # The device tool brings back what is under $OUT, even from a command it had to stop, but at most
    # 8 files: the results and the stage logs in one file.
    target = os.environ.get("OUT")
    if target and Path(target).resolve() != out:
        copy = Path(target) / "gpu-check"
        copy.mkdir(parents=True, exist_ok=True)
        for name in ("results.json", "results.md"):
            shutil.copy2(out / name, copy / name)
        logs = [f"===== {log.name}\n{log.read_text(errors='replace')}" for log in sorted((out / "logs").glob("*.log"))]
        (copy / "logs.txt").write_text("\n".join(logs))


# ---- results.md ---------------------------------------------------------------------------------
def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}e}" if value and abs(value) < 10**-digits else f"{value:.{digits}f}"
    return str(value)


def _row(*cells: Any) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header: list[str], align: str) -> list[str]:
    """A markdown table head; `align` has one letter per column: l(eft) or r(ight)."""
    return [_row(*header), _row(*("---:" if a == "r" else "---" for a in align))]


def _stage(results: dict[str, Any], name: str) -> dict[str, Any]:
    return next((s for s in results["stages"] if s["name"] == name), {})


def _metrics(results: dict[str, Any], name: str) -> dict[str, Any]:
    metrics: dict[str, Any] = _stage(results, name).get("metrics", {})
    return metrics


def _why(entry: dict[str, Any]) -> str:
    """What a table cell says for a figure that is not there."""
    return f"{entry.get('status', 'n/a')}: {entry['reason']}" if entry.get("reason") else entry.get("status", "n/a")


def render_markdown(results: dict[str, Any]) -> str:
    setup = _metrics(results, "setup")
    lines = ["# GPU check results", ""]
    if results["dry_run"]:
        lines += [
            "**Dry run on the CPU at toy sizes**: it proves every stage runs; its figures say nothing of a GPU.",
            "",
        ]
    packages = ", ".join(f"{k} {v}" for k, v in setup.get("attention_packages", {}).items())
    lines += [
        f"`{results['command']}`, {results['started']}: {results.get('total_s', 0)} s of a {results['budget_s']:.0f} s "
        "budget.",
        "",
        f"- GPU: {setup.get('gpu') or 'none'} x {setup.get('device_count', 0)}, "
        f"{setup.get('gpu_memory_gib', 'n/a')} GiB, "
        f"compute capability {setup.get('compute_capability', 'n/a')}, driver {setup.get('driver', 'n/a')}",
        f"- torch {setup.get('torch', 'n/a')}, CUDA runtime {setup.get('cuda_runtime', 'n/a')}, "
        f"cuDNN {setup.get('cudnn', 'n/a')}, Python {setup.get('python', 'n/a')}",
        f"- attention: the engine's `auto` backend is {setup.get('engine_attention_backend', 'n/a')}; {packages}",
        "",
        *_table(["stage", "status", "s", "reason"], "llrl"),
    ]
    lines += [_row(s["name"], s["status"], s.get("seconds", ""), s.get("reason", "")) for s in results["stages"]]
    lines += _correctness_md(results) + _speed_md(results) + _pods_md(results)
    lines += ["", "## Commands", ""]
    lines += [f"- {s['name']}: `{command}`" for s in results["stages"] for command in s.get("commands", [])]
    return "\n".join(lines) + "\n"


def _correctness_md(results: dict[str, Any]) -> list[str]:
    fp32, bf16 = _metrics(results, "golden-fp32"), _metrics(results, "golden-bf16")
    lines = ["", "## Correctness"]
    if fp32 or bf16:
        lines += [
            "",
            f"### Golden vectors on {results['device']}: max abs diff from the reference (fp32, CPU)",
            "",
            f"fp32 with TF32 off: {fp32.get('above_tolerance', 'n/a')} of {fp32.get('comparisons', 'n/a')} comparisons "
            f"above {fp32.get('tolerance', 'n/a')} (asserted). bf16: measured, not asserted.",
            "",
            *_table(["case", "tensors", "fp32", "bf16"], "llrr"),
        ]
        for case, families in (fp32.get("by_case") or bf16.get("by_case") or {}).items():
            for family in families:
                a = fp32.get("by_case", {}).get(case, {}).get(family)
                b = bf16.get("by_case", {}).get(case, {}).get(family)
                lines.append(_row(case, family, _fmt(a, 2), _fmt(b, 2)))
    toy = _metrics(results, "toyworld")
    runs = {k.removesuffix("_vs_cpu_fp32"): v for k, v in toy.items() if k.endswith("_vs_cpu_fp32")}
    if runs:
        lines += ["", "### toyworld: frames vs the CPU in fp32", ""]
        lines += _table(["run", "PSNR dB", "worst frame dB", "identical frames", "max pixel diff"], "lrrrr")
        for name, r in runs.items():
            psnr = "identical" if r["psnr_db"] is None else r["psnr_db"]
            worst = "identical" if r["min_frame_psnr_db"] is None else r["min_frame_psnr_db"]
            lines.append(_row(name, psnr, worst, f"{r['identical_frames']} / {r['frames']}", r["max_abs_pixel_diff"]))
    cli = toy.get("cli")
    if cli:
        lines += [
            "",
            f"`inferix generate` on {results['device']}: time to first block {cli['time_to_first_block_s']} s, "
            f"{cli['frames_per_s']} frames/s, real-time factor {cli['real_time_factor']}, "
            f"MP4 of {cli['mp4_bytes']} bytes.",
        ]
    return lines


def _speed_md(results: dict[str, Any]) -> list[str]:
    lines = ["", f"## Speed (random weights, {results['sizes']} shapes)"]
    e2e = _metrics(results, "e2e")
    shape = e2e.get("shape")
    if shape:
        lines += [
            "",
            f"DiT {shape['dit']} (dim {shape['dim']}, {shape['layers']} layers) at {shape['pixels']} "
            f"(latent {shape['latent']}, {shape['tokens_per_frame']} tokens/frame), {shape['dtype']}, "
            f"{shape['frames_per_block']} latent frames per block, {shape['denoising_steps']} steps + context pass, "
            f"attention window {shape['attention_window']} (-1: every earlier frame), {shape['blocks']} blocks; "
            f"the Wan VAE ({shape['preset']} config) decoding block by block; random prompt embeddings instead of "
            "the text encoder. "
            "Measured through `WanEngine`, as `inferix generate` runs.",
            "",
            *_table(
                ["attention", "DiT ms/block", "last block ms", "VAE ms/block", "FPS", "first frame s", "GiB"], "lrrrrrr"
            ),
        ]
        for backend in ("sdpa", "flash"):
            r = e2e.get(backend, {})
            if r.get("status") == "ok":
                figures = [r["dit_ms_per_block"], r["dit_ms_last_block"], r["vae_ms_per_block"], r["fps"]]
                cells = [_fmt(v) for v in figures] + [
                    _fmt(r["time_to_first_frame_s"], 3),
                    _fmt(r.get("peak_memory_gib")),
                ]
                lines.append(_row(backend, *cells))
            elif r:
                lines.append(_row(backend, _why(r), "", "", "", "", ""))
        lines += _targets_md(e2e, results["dry_run"])
    attention = _metrics(results, "attention")
    if attention.get("shape"):
        a = attention["shape"]
        lines += [
            "",
            f"### Attention: {a['q_tokens']} queries x {a['kv_tokens']} keys, {a['heads']} heads of {a['head_dim']}",
        ]
        lines += ["", *_table(["kernel", "ms", "TFLOP/s"], "lrr")]
        for name, r in attention.items():
            if isinstance(r, dict) and "status" in r:
                ok = r["status"] == "ok"
                lines.append(_row(name, _fmt(r["ms"], 3) if ok else _why(r), _fmt(r.get("tflops"))))
        lines += [f"- {note}" for note in _stage(results, "attention").get("notes", [])]
    lines += _kv_md(_metrics(results, "kv-offload"))
    bench = _metrics(results, "bench-engine")
    if bench.get("output"):
        lines += ["", "### bench/engine.py: paged KV pool vs the contiguous cache", "", "```", bench["output"], "```"]
    lines += _batching_md(_metrics(results, "batching"))
    lines += _engine_speed_md(_metrics(results, "engine-speed"))
    lines += _quant_md(_metrics(results, "quant"))
    magi = _metrics(results, "magi")
    if magi.get("output"):
        lines += ["", "### bench/magi.py: MAGI-1 seconds per chunk", "", "```", magi["output"], "```"]
    extras = _metrics(results, "extras")
    if extras:
        lines += ["", "### If present", "", *_table(["feature", "status"], "ll")]
        for name, r in extras.items():
            lines.append(_row(name, f"{r['fps']:.0f} frames/s at {r['size']}" if r.get("fps") else _why(r)))
    return lines


def _quant_md(quant: dict[str, Any]) -> list[str]:
    rows = [(label, quant[label]) for label in quant if isinstance(quant[label], dict)]
    if not rows:
        return []
    lines = ["", f"### Quantization (int8 kernel: {quant.get('int8_kernel', '?')})", ""]
    lines += _table(["variant", "DiT ms/block", "fps", "rel L2 vs none", "DiT GiB"], "lrrrr")
    for label, r in rows:
        if r.get("status") != "ok":
            lines.append(_row(label, r.get("status", "?"), r.get("reason", ""), "", ""))
            continue
        figures = (_fmt(r["dit_ms_per_block"], 1), _fmt(r["fps"], 2), f"{r['rel_l2_vs_none']:.2e}")
        lines.append(_row(label, *figures, _fmt(r["dit_weight_gib"], 2)))
    return lines


def _engine_speed_md(speed: dict[str, Any]) -> list[str]:
    modes = [m for m in ("eager", "compiled", "cuda_graphs") if m in speed]
    if not modes:
        return []
    lines = ["", "### DiT step modes: eager, --compile, --cuda-graphs (window of 4 blocks, the first the sink)", ""]
    lines += _table(["mode", "setup s", "fill ms/block", "rolling ms/block", "max abs diff vs eager"], "lrrrr")
    for mode in modes:
        r = speed[mode]
        figures = (_fmt(r["setup_s"], 1), _fmt(r["fill_ms_per_block"], 1), _fmt(r["rolling_ms_per_block"], 1))
        lines.append(_row(mode, *figures, f"{r['max_abs_diff_vs_eager']:.2e}"))
    return lines


def _batching_md(batching: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for label in ("native", "half"):
        r = batching.get(label)
        if not r:
            continue
        lines += ["", f"### Continuous batching at {r['pixels']}: {r['streams_at_realtime']} streams at real time", ""]
        lines += _table(["N", "1-at-a-time fps", "batched fps", "ratio", "fps per stream", "max abs diff"], "rrrrrr")
        for row in r["rows"]:
            figures = (row["one_at_a_time_fps"], row["batched_fps"], row["ratio"], row["fps_per_stream"])
            lines.append(_row(row["sessions"], *(_fmt(v, 2) for v in figures), f"{row['max_abs_diff']:.2e}"))
    return lines


def _targets_md(e2e: dict[str, Any], dry_run: bool) -> list[str]:
    if dry_run:  # toy figures next to H100 ones would compare nothing
        lines = ["", "Public targets (one H100), compared on a GPU run only:", ""]
        return lines + [f"- {who}: {figure}" for who, figure, _ in TARGETS]
    best = "flash" if e2e.get("flash", {}).get("status") == "ok" else "sdpa"
    ours: dict[str, Any] = e2e.get(best, {})
    if ours.get("status") != "ok":
        return []
    fps, ttff = ours["fps"], ours["time_to_first_frame_s"]
    mine = {
        "fps": f"{fps:.1f} FPS",
        "dit_ms": f"{ours['dit_ms_per_block']:.0f} ms per block (last block {ours['dit_ms_last_block']:.0f} ms)",
        "goal": f"{fps:.1f} FPS ({'met' if fps >= GOAL_FPS else 'not met'}), "
        f"{ttff:.2f} s ({'met' if ttff <= GOAL_TTFF_S else 'not met'})",
    }
    lines = ["", f"Public targets, for comparison (theirs on one H100; ours above, with {best}):", ""]
    lines += _table(["who", "their figure", "ours"], "lll")
    return lines + [_row(who, figure, mine[key]) for who, figure, key in TARGETS]


def _kv_md(kv: dict[str, Any]) -> list[str]:
    if "offload_gb_per_s" not in kv:
        return []
    raw = kv.get("raw_pinned", {})
    link = (
        f"Raw pinned copies of the same size: device to host {raw['d2h_gb_per_s']:.2f} GB/s, "
        f"host to device {raw['h2d_gb_per_s']:.2f} GB/s."
        if raw.get("status") == "ok"
        else f"Raw pinned copies: {_why(raw)}."
    )
    return [
        "",
        f"### KV host offload: {kv['frames']} latent frames ({_fmt(kv['session_bytes'] / 2**20, 2)} MiB), "
        "KVPool offload / prefetch",
        "",
        f"offload {kv['offload_gb_per_s']:.2f} GB/s (the first {kv['offload_gb_per_s_first']:.2f}: it allocates the "
        f"host buffers), restore {kv['restore_gb_per_s']:.2f} GB/s (the first {kv['restore_gb_per_s_first']:.2f}); "
        f"bit-exact: {kv['bit_exact']}. {link}",
    ]


def _pods_md(results: dict[str, Any]) -> list[str]:
    stage = _stage(results, "pods")
    pods = stage.get("metrics", {})
    lines = ["", "## Pods: 2 ranks vs one device", ""]
    if "single" not in pods:
        return [*lines, f"{stage.get('status', 'not run')}: {stage.get('reason', '')}"]
    lines += [f"Backend {pods.get('backend')}; one device: {pods['single']['ms_per_block']:.1f} ms per block.", ""]
    lines += _table(["strategy", "plan", "ms/block", "speed-up", "max abs diff vs one device"], "llrrr")
    for strategy in POD_STRATEGIES:
        r = pods.get(strategy)
        if r:
            speedup = f"{r['speedup_vs_single']:.2f}x"
            lines.append(
                _row(strategy, r["plan"], _fmt(r["ms_per_block"]), speedup, _fmt(r["max_abs_diff_vs_single"], 2))
            )
    return lines


# ---- wheels (make gpu-wheels, gpu-check.sh) -----------------------------------------------------
def missing_wheels() -> list[str]:
    """The pinned requirements whose module this Python cannot import (what gpu-check.sh installs)."""
    return [requirement for requirement, module in WHEELS.items() if not _importable(module)]


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a dotted name whose parent package is missing
        return False


def check_wheels(folder: Path, max_mib: float) -> int:
    """Every pinned wheel is in `folder`, within `max_mib`, and with the working tree within what travels."""

    def normal(name: str) -> str:
        return re.sub(r"[-_.]+", "_", name).lower()

    wheels = sorted(folder.glob("*.whl"))
    missing = [
        r for r in WHEELS if not any(normal(w.name).startswith(normal(r.replace("==", "-")) + "_") for w in wheels)
    ]
    total = sum(w.stat().st_size for w in wheels) / 2**20
    for wheel in wheels:
        print(f"{wheel.stat().st_size / 2**20:8.2f} MiB  {wheel.name}")
    print(f"{total:8.2f} MiB  in {folder} (limit {max_mib:g} MiB)")
    tree = working_tree_mib()
    if tree is not None:
        print(f"{tree:8.2f} MiB  the working tree that travels with it (limit {TRAVEL_MAX_MIB:g} MiB together)")
    problems = []
    if missing:
        problems.append(f"no wheel in {folder} for {', '.join(missing)}")
    if total > max_mib:
        problems.append(f"{folder} holds {total:.1f} MiB, over the {max_mib:g} MiB limit")
    if tree is not None and tree + total > TRAVEL_MAX_MIB:
        problems.append(f"with the working tree ({tree:.1f} MiB) that is over the {TRAVEL_MAX_MIB:g} MiB that travel")
    for problem in problems:
        print(f"gpu-wheels: {problem}", file=sys.stderr)
    if problems and not missing:
        print("gpu-wheels: drop or re-pin a wheel in WHEELS (scripts/gpu_check.py)", file=sys.stderr)
    return 1 if problems else 0


def working_tree_mib() -> float | None:
    """Size of what the device tool sends: tracked and untracked-not-ignored files (None without git)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    files = (REPO / name for name in listed.decode().split("\0") if name)
    return sum(f.stat().st_size for f in files if f.is_file()) / 2**20


# ---- command line -------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--device", choices=("auto", "cuda", "cpu"), default="auto", help="auto: cuda when available (default)"
    )
    p.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"results folder (default {DEFAULT_OUT.relative_to(REPO)})"
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=DEFAULT_BUDGET_S,
        help=f"wall-time budget of all stages (default {DEFAULT_BUDGET_S:g})",
    )
    p.add_argument(
        "--stages", default="", help=f"comma-separated subset, in this order: {','.join(s.name for s in STAGES)}"
    )
    p.add_argument(
        "--sizes", choices=("auto", "real", "toy"), default="auto", help="auto: real on CUDA, toy on the CPU"
    )
    wheels = p.add_argument_group("wheels (make gpu-wheels, scripts/gpu-check.sh)")
    wheels.add_argument("--wheel-list", action="store_true", help="print the pinned requirements to download")
    wheels.add_argument("--missing-wheels", action="store_true", help="print those whose module is not importable here")
    wheels.add_argument("--check-wheels", type=Path, metavar="DIR", help="check DIR holds them all within --max-mib")
    wheels.add_argument("--max-mib", type=float, default=WHEELS_MAX_MIB)
    # Internal: how the driver starts a stage's process, and torchrun a pod's ranks.
    p.add_argument("--run-stage", choices=[s.name for s in STAGES], help=argparse.SUPPRESS)
    p.add_argument("--pod-rank", type=Path, metavar="STAGE_FILE", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.wheel_list:
        print(" ".join(WHEELS))
        return 0
    if args.missing_wheels:
        print(" ".join(missing_wheels()))
        return 0
    if args.check_wheels:
        return check_wheels(args.check_wheels, args.max_mib)
    if str(REPO) not in sys.path:  # run as a file: its folder, not the repository, is on the path
        sys.path.insert(0, str(REPO))
    if args.run_stage:
        return run_stage_process(args)
    if args.pod_rank:
        return pod_rank(args)
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
