"""gpu-check stages 1-2: setup, and correctness (golden vectors fp32 / bf16, toyworld frames vs the CPU)."""

from __future__ import annotations

import importlib.util
import json
import platform
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from gpucheck.harness import WHEELS, CheckFailed, Context, first_line, run_cli
from gpucheck.wheels import _importable


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
