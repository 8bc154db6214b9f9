"""gpu-check stage 3: speed (end to end, attention, KV offload, benches, compile, quantization, MAGI-1,
batching, extras)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the driver itself never imports torch or the engine: only the stage processes do
    import torch

    from engine.families.wan.loader import LoadedModel
    from inferix.spec.presets import ModelPreset

from gpucheck.harness import REAL, REPO, CheckFailed, Context, Sizes, first_line, sync, timed_ms


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
    """bench/engine_speed.py: paged KV pool (a ring for the window) vs the contiguous reference cache, bf16 and
    fp32, in the window's fill and rolling phases."""
    window = ["--window", "12", "--sink", "3", "--blocks", "7"]
    if ctx.sizes is REAL:
        args = ["--device", ctx.device, "--preset", "wan2.1-1.3b", "--dtypes", "bf16,fp32", *window, "--repeats", "2"]
    else:
        args = ["--device", ctx.device, "--dim", "64", "--layers", "2", "--heads", "2", "--latent", "8x8"]
        args += ["--dtypes", "fp32", *window, "--steps", "2", "--repeats", "1", "--threads", "1"]
    keys = ("ms_per_block", "kv_mib_per_session", "ratios")
    _run_bench(ctx, "bench/engine_speed.py", args, keys)


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
