"""gpu-check stage 4: sequence-parallel pods, and the TAEHV decoder against the Wan VAE."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the driver itself never imports torch or the engine: only the stage processes do
    import torch


from gpucheck.harness import REAL, REPO, SCRIPT, SIZES, Context, Recorder, Skip, timed_ms
from gpucheck.stages_speed import speed_preset

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
