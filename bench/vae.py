"""Benchmark the Wan VAE decoder: streaming vs one-shot, decode variants side by side, share of a block.

    python bench/vae.py --device cpu --threads 1
    python bench/vae.py --device cuda --dim 96 --latent-hw 60 104 --blocks 7   # real Wan2.1 480p shape
    python bench/vae.py --threads 1 --variants fp32 fp32-contiguous bf16 fp16  # side by side, ratios
    python bench/vae.py --threads 1 --share                                    # VAE share of a block

Random weights (speed and memory do not depend on their values).

Streaming vs one-shot (the default): each mode runs in a fresh child process so that one mode's
allocator state cannot flatter the other.  Inside a child: one untimed pass measures peak memory
(on CPU that pass must be the first, see below), then ``--repeats`` passes are timed and the
median per call is reported.

Peak memory, per call:

* CUDA: ``torch.cuda.max_memory_allocated()`` (reset before the call) minus the bytes allocated just
  before it, i.e. exactly what the decode needs on top of weights, inputs and (streaming) its state.
* CPU: the process peak resident set size (``VmHWM``, reset through ``/proc/self/clear_refs``) minus
  the RSS measured after building the model and inputs, before any decode.  It counts real resident
  memory including allocator slack and memory the allocator retained from earlier blocks, so it is a
  coarse, upper-bound-ish number; Linux only ("n/a" elsewhere).

Streaming outputs are hashed and dropped (as the streamer would consume them); one-shot keeps the
whole video, as it must.  The sha256 of both outputs is compared to confirm they are bit-identical.

``--variants``: ways to run the same streaming decode, named ``<dtype>[-contiguous][-compile]``
(dtype fp32, bf16 or fp16; ``-contiguous``: NCTHW activations and the 2D time-tap fold instead of
the default channels-last ones with oneDNN's 3D convolution on CPU, see ``WanVAE.channels_last``;
``-compile``: ``torch.compile`` of the decoder, compiled during the warm-up pass).  All variants
run in one child process, interleaved, ``--repeats`` rounds after one warm-up pass each: per
variant the time per block of the blocks after the first (the first decodes fewer frames), the
minimum over rounds (the least disturbed by other work on the cores) and the median, the ratio of
minimums to the first variant, the max abs difference of the video from the first variant's, and
the warm-up pass's time (a whole video; compilation included).

``--taehv``: the TAEHV tiny decoder (engine/decoders/taehv.py) next to the Wan VAE at its released
size (``--dim 96``), on the same latents, in one child process: per resolution (``--taehv-latents``,
default the engine bench's 224x512 and 480x832) and dtype (``--taehv-dtypes``), each decoder first
decodes one latent frame (the stream's first block), then the timed block of ``--block-frames``
latent frames (the Wan VAE once: it is slow; the TAEHV decoders min of ``--repeats`` interleaved
rounds). The TAEHV decoders first run a throwaway stream, so that their timed first blocks (printed
after the table, once each) do not pay for kernel set-up. Three decoders: the Wan VAE; ours, which
runs a block's frames through each layer together (channels-last, TGrow before the upsample,
upsample+conv as 2x2 phase convs); and "framewise", a faithful reference-style walk of one time step
through every layer in the default layout (engine/decoders/taehv_framewise.py), the baseline of the
>= 1.5x target.
Decoder times are CPU seconds of the (one-thread) process, robust to other work on shared cores;
the DiT's are the engine's own wall-clock phase timings.
The share of a block adds the engine bench's DiT (denoising steps + context pass per block, same
dtype, min over the blocks after the first of one session) at the same latent size. TAEHV weights:
the golden case's taew2_1.pth (released layout, 11.3 M parameters; speed does not depend on values).

``--share``: the VAE decode's share of a block, next to the DiT's denoising steps and context pass
of the same block: the engine bench's DiT (dim 384, 6 layers, 448 tokens/frame at the default
``--share-latent``) with a VAE of ``--dim``, then every golden Wan case of tests/golden with its own
DiT and VAE.  Minimum over ``--repeats`` sessions of each phase, per block.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from torch import Tensor

from engine.decoders.taehv import TAEHV, load_taehv
from engine.decoders.taehv_framewise import FramewiseDecoder
from engine.families.wan.autoencoders import load_vae
from engine.families.wan.dit import CausalWanDiT
from engine.families.wan.pipeline import WanPipeline
from engine.families.wan.vae import WanVAE
from engine.registry import wan_cases
from inferix.spec.architectures import WanDiTConfig, WanVAEConfig
from inferix.spec.sampling import BlockConfig, PipelineConfig, SamplingConfig

MiB = 2**20
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
GOLDEN_DIR = Path(__file__).resolve().parent.parent / "tests" / "golden"


@dataclass
class Call:
    """One measured decode call: a streaming block, or the whole one-shot decode."""

    latent_frames: int
    pixel_frames: int
    seconds: float
    peak_bytes: int | None


@dataclass
class ModeResult:
    """What one child process reports back for its mode."""

    calls: list[Call]
    sha256: str
    state_bytes: int  # streaming: size of the decode state after the last block; one-shot: 0


@dataclass(frozen=True)
class Variant:
    """One way to run the decoder (see the module docstring)."""

    name: str
    dtype: torch.dtype
    channels_last: bool
    compile: bool

    @classmethod
    def parse(cls, name: str) -> Variant:
        dtype, *options = name.split("-")
        if dtype not in DTYPES or not set(options) <= {"contiguous", "compile"}:
            raise argparse.ArgumentTypeError(f"variant {name!r}: expected <fp32|bf16|fp16>[-contiguous][-compile]")
        return cls(name, DTYPES[dtype], "contiguous" not in options, "compile" in options)


@dataclass
class VariantResult:
    """Seconds per block (blocks after the first) of each round, the decoded video, the warm-up's seconds."""

    seconds: list[float]
    video: Tensor
    warmup_s: float  # the first decode of the video: oneDNN primitive creation, compilation


@dataclass
class ShareRow:
    """One model's block time, split by phase (minimum over sessions, mean over blocks)."""

    name: str
    pixels: tuple[int, int]
    denoise_s: float
    context_s: float
    vae_s: float

    @property
    def vae_share(self) -> float:
        return self.vae_s / (self.denoise_s + self.context_s + self.vae_s)


class PeakMemory:
    """Peak memory of a call, measured as described in the module docstring."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.baseline = 0 if device.type == "cuda" else self._proc_kib("VmRSS")

    def measure(self, fn: Callable[[], Tensor]) -> tuple[Tensor, int | None]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            before = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            out = fn()
            torch.cuda.synchronize(self.device)
            return out, torch.cuda.max_memory_allocated(self.device) - before
        try:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        except OSError:
            return fn(), None
        out = fn()
        return out, (self._proc_kib("VmHWM") - self.baseline) * 1024

    @staticmethod
    def _proc_kib(key: str) -> int:
        try:
            status = Path("/proc/self/status").read_text()
        except OSError:
            return 0
        match = re.search(rf"^{key}:\s+(\d+) kB", status, re.MULTILINE)
        return int(match.group(1)) if match else 0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _random_model(args: argparse.Namespace, device: torch.device) -> WanVAE:
    torch.manual_seed(0)
    return WanVAE(WanVAEConfig(dim=args.dim, num_res_blocks=args.num_res_blocks)).eval().to(device)


def _latents(args: argparse.Namespace, device: torch.device) -> Tensor:
    h, w = args.latent_hw
    return torch.randn(1, args.blocks * args.block_frames, 16, h, w, generator=torch.Generator().manual_seed(1)).to(
        device
    )


def _decode_pass(
    model: WanVAE, latents: Tensor, mode: str, block: int, measure_memory: PeakMemory | None
) -> tuple[list[Call], str, int]:
    """Run one full decode in ``mode``; return (calls, sha256 of the video bytes, state bytes)."""
    digest = hashlib.sha256()
    calls: list[Call] = []
    device = latents.device

    def run(fn: Callable[[], Tensor], latent_frames: int) -> None:
        _sync(device)
        start = time.perf_counter()
        if measure_memory is None:
            out, peak = fn(), None
        else:
            out, peak = measure_memory.measure(fn)
        _sync(device)
        seconds = time.perf_counter() - start
        digest.update(out.cpu().numpy().tobytes())
        calls.append(Call(latent_frames, out.shape[1], seconds, peak))

    if mode == "oneshot":
        run(partial(model.decode, latents), latents.shape[1])
        return calls, digest.hexdigest(), 0
    state = model.new_decode_state()
    for start in range(0, latents.shape[1], block):
        chunk = latents[:, start : start + block]
        run(partial(model.decode_block, chunk, state), chunk.shape[1])
    return calls, digest.hexdigest(), state.nbytes


def run_mode(args: argparse.Namespace, mode: str) -> ModeResult:
    """Child-process body: build the model and latents, measure memory once, then time."""
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model = _random_model(args, device).to(DTYPES[args.dtype])
    latents = _latents(args, device)
    memory = PeakMemory(device)
    mem_calls, sha, state_bytes = _decode_pass(model, latents, mode, args.block_frames, memory)
    timed = [_decode_pass(model, latents, mode, args.block_frames, None)[0] for _ in range(args.repeats)]
    calls = [
        Call(c.latent_frames, c.pixel_frames, statistics.median(r[i].seconds for r in timed), c.peak_bytes)
        for i, c in enumerate(mem_calls)
    ]
    return ModeResult(calls, sha, state_bytes)


def _stream(model: WanVAE, latents: Tensor, block: int) -> tuple[Tensor, float]:
    """Streaming decode of ``latents``: the video and the seconds per block after the first."""
    state = model.new_decode_state()
    frames, seconds = [], []
    for start in range(0, latents.shape[1], block):
        _sync(latents.device)
        began = time.perf_counter()
        frames.append(model.decode_block(latents[:, start : start + block], state))
        _sync(latents.device)
        seconds.append(time.perf_counter() - began)
    return torch.cat(frames, dim=1), statistics.mean(seconds[1:] or seconds)


def run_variants(args: argparse.Namespace) -> dict[str, VariantResult]:
    """Child-process body of ``--variants``: one model per variant, the same weights, interleaved rounds."""
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    base = _random_model(args, device)
    latents = _latents(args, device)
    models: dict[Variant, WanVAE] = {}
    for variant in args.variants:
        model = WanVAE(base.config).eval().to(device)
        model.load_state_dict(base.state_dict())
        model = model.to(variant.dtype)
        model.channels_last = variant.channels_last
        if variant.compile:
            model.decoder.compile()
        models[variant] = model
    results = {}
    for variant, model in models.items():
        began = time.perf_counter()
        video = _stream(model, latents, args.block_frames)[0]
        results[variant.name] = VariantResult([], video, time.perf_counter() - began)
    for _ in range(args.repeats):
        for variant, model in models.items():
            results[variant.name].seconds.append(_stream(model, latents, args.block_frames)[1])
    return results


def _share_phases(pipeline: WanPipeline, vae: WanVAE, prompt: Tensor, hw: tuple[int, int], blocks: int) -> list[float]:
    """Mean seconds per block of [denoising steps, context pass, VAE decode] over one session."""
    phases = []
    state = vae.new_decode_state()
    with pipeline.open_session(prompt, *hw, num_blocks=blocks) as session:
        for out in session:
            began = time.perf_counter()
            vae.decode_block(out.latents, state)
            phases.append((out.timings.denoise_s, out.timings.context_s, time.perf_counter() - began))
    return [statistics.mean(p[i] for p in phases) for i in range(3)]


def _share_row(
    name: str,
    pipeline: WanPipeline,
    vae: WanVAE,
    prompt: Tensor,
    hw: tuple[int, int],
    args: argparse.Namespace,
) -> ShareRow:
    runs = [_share_phases(pipeline, vae, prompt, hw, args.share_blocks) for _ in range(args.repeats)]
    denoise, context, decode = (min(r[i] for r in runs) for i in range(3))
    factor = vae.config.spatial_factor
    return ShareRow(name, (hw[0] * factor, hw[1] * factor), denoise, context, decode)


def run_share(args: argparse.Namespace) -> list[ShareRow]:
    """Child-process body of ``--share``: the engine bench's DiT, then the golden cases (fp32, CPU)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dit_config = WanDiTConfig(dim=384, ffn_dim=1536, num_heads=6, num_layers=6, freq_dim=256, text_dim=512, text_len=64)
    steps = tuple(1000 - 250 * i for i in range(4))
    pipeline = WanPipeline(
        CausalWanDiT(dit_config).eval(),
        PipelineConfig(BlockConfig(args.block_frames, local_attn_size=12, sink_size=3), SamplingConfig(steps)),
    )
    h, w = args.share_latent
    prompt = torch.randn(1, dit_config.text_len, dit_config.text_dim)
    vae = _random_model(args, torch.device("cpu"))
    rows = [_share_row(f"engine bench DiT + VAE dim {args.dim}", pipeline, vae, prompt, (h, w), args)]
    cases = [c for c in wan_cases(GOLDEN_DIR) if c.has("outputs") and c.has("vae")]
    for case in cases:
        inputs = case.tensors("inputs")
        _, _, _, h, w = inputs["initial_noise"].shape
        golden = WanPipeline(case.build_dit(), case.pipeline_config())
        case_vae = load_vae(case.folder / "vae.safetensors", WanVAEConfig.from_dict(case.config["vae"]))
        rows.append(_share_row(f"golden {case.name}", golden, case_vae, inputs["prompt_embeds"], (h, w), args))
    return rows


@dataclass
class TaehvRow:
    """One resolution and dtype of ``--taehv``: ms per timed block of each decoder, and the DiT's."""

    latent_hw: tuple[int, int]
    dtype: str
    pixel_frames: int
    wan_s: float | None
    ours_s: float
    framewise_s: float
    dit_s: float | None
    ours_vs_framewise: float  # max abs diff of the timed block's frames, [0, 1] range
    ours_first_s: float = 0.0  # a stream's first block (one latent frame), after a warm-up stream
    framewise_first_s: float = 0.0


def _dit_block_seconds(latent_hw: tuple[int, int], dtype: torch.dtype, block_frames: int) -> float:
    """Denoising steps + context pass of one block of the engine bench's DiT (min over blocks 2 and 3)."""
    torch.manual_seed(0)
    dit_config = WanDiTConfig(dim=384, ffn_dim=1536, num_heads=6, num_layers=6, freq_dim=256, text_dim=512, text_len=64)
    steps = tuple(1000 - 250 * i for i in range(4))
    pipeline = WanPipeline(
        CausalWanDiT(dit_config).eval().to(dtype),
        PipelineConfig(BlockConfig(block_frames, local_attn_size=12, sink_size=3), SamplingConfig(steps)),
    )
    prompt = torch.randn(1, dit_config.text_len, dit_config.text_dim).to(dtype)
    seconds = []
    with pipeline.open_session(prompt, *latent_hw, num_blocks=3) as session:
        for out in session:
            seconds.append(out.timings.denoise_s + out.timings.context_s)
    return min(seconds[1:])


def _timed(fn: Callable[[], Tensor]) -> tuple[Tensor, float]:
    # CPU time of this process, not wall time: on one thread it is the work done, whatever else runs on
    # the cores (a shared machine's load doubled wall times between runs here; see RESULTS.md).
    began = time.process_time()
    out = fn()
    return out, time.process_time() - began


def run_taehv(args: argparse.Namespace) -> list[TaehvRow]:
    """Child-process body of ``--taehv`` (CPU)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    weights = GOLDEN_DIR / "taew2_1_tiny" / "taew2_1.pth"
    rows = []
    for h, w in args.taehv_latents:
        latents = torch.randn(1, 1 + args.block_frames, 16, h, w, generator=torch.Generator().manual_seed(1))
        first, block = latents[:, :1], latents[:, 1:]
        for dtype_name in args.taehv_dtypes:
            dtype = DTYPES[dtype_name]
            ours: TAEHV = load_taehv(weights, dtype=dtype)
            walker = load_taehv(weights, dtype=dtype, channels_last=False)
            with torch.no_grad():
                warm = ours.new_decode_state()  # a throwaway stream: first calls pay for kernel set-up
                ours.decode_stream(first, warm)
                ours.decode_stream(block, warm)
                FramewiseDecoder(walker).decode_block(latents)
                state, framewise = ours.new_decode_state(), FramewiseDecoder(walker)
                ours_first_s = _timed(partial(ours.decode_stream, first, state))[1]
                framewise_first_s = _timed(partial(framewise.decode_block, first))[1]
                ours_out, ours_s = _timed(partial(ours.decode_stream, block, state))
                walked, framewise_s = _timed(partial(framewise.decode_block, block))
                for _ in range(args.repeats - 1):  # interleaved: both see the same load on the cores
                    ours_s = min(ours_s, _timed(partial(ours.decode_stream, block, state))[1])
                    framewise_s = min(framewise_s, _timed(partial(framewise.decode_block, block))[1])
                wan_s = None
                if not args.taehv_skip_wan:
                    torch.manual_seed(0)
                    wan = WanVAE(WanVAEConfig(dim=args.dim, num_res_blocks=args.num_res_blocks)).eval().to(dtype)
                    wan_state = wan.new_decode_state()
                    wan.decode_block(first.to(dtype), wan_state)
                    wan_s = _timed(partial(wan.decode_block, block.to(dtype), wan_state))[1]
                    del wan, wan_state
            dit_s = None if args.taehv_skip_dit else _dit_block_seconds((h, w), dtype, args.block_frames)
            diff = (ours_out.float() - walked.float()).abs().max().item()
            rows.append(
                TaehvRow(
                    (h, w), dtype_name, ours_out.shape[1], wan_s, ours_s, framewise_s, dit_s, diff,
                    ours_first_s, framewise_first_s,
                )
            )  # fmt: skip
            print(f"  row: {rows[-1]}", flush=True)  # the whole table comes at the end; a cut run keeps these
    return rows


def report_taehv(rows: list[TaehvRow]) -> None:
    def ms(s: float | None) -> str:
        return "n/a" if s is None else f"{1e3 * s:.0f}"

    def share(decode_s: float | None, dit_s: float | None) -> str:
        return "n/a" if decode_s is None or dit_s is None else f"{decode_s / (decode_s + dit_s):.1%}"

    print(
        f"{'pixels':>9} {'dtype':>5} {'frames':>6} {'DiT ms':>8} {'Wan VAE ms':>11} {'share':>6} {'TAEHV ms':>9} "
        f"{'share':>6} {'framewise ms':>13} {'Wan/ours':>9} {'framewise/ours':>15} {'max abs diff':>13}"
    )
    for r in rows:
        wan_ratio = "n/a" if r.wan_s is None else f"{r.wan_s / r.ours_s:.1f}x"
        print(
            f"{8 * r.latent_hw[0]}x{8 * r.latent_hw[1]:<5} {r.dtype:>5} {r.pixel_frames:>6} {ms(r.dit_s):>8} "
            f"{ms(r.wan_s):>11} {share(r.wan_s, r.dit_s):>6} {ms(r.ours_s):>9} {share(r.ours_s, r.dit_s):>6} "
            f"{ms(r.framewise_s):>13} {wan_ratio:>9} {r.framewise_s / r.ours_s:>14.2f}x {r.ours_vs_framewise:>13.2e}"
        )
    print("a stream's first block (one latent frame, one frame kept), once:")
    for r in rows:
        print(
            f"{8 * r.latent_hw[0]}x{8 * r.latent_hw[1]:<5} {r.dtype:>5}  TAEHV {ms(r.ours_first_s)} ms  framewise "
            f"{ms(r.framewise_first_s)} ms  framewise/ours {r.framewise_first_s / r.ours_first_s:.2f}x"
        )


def _mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / MiB:.1f}"


def report(results: dict[str, ModeResult]) -> None:
    print(f"{'mode':<8} {'call':>5} {'latent':>6} {'pixel':>6} {'ms':>10} {'ms/px frame':>12} {'peak MiB':>9}")
    for mode, res in results.items():
        for i, c in enumerate(res.calls):
            name = "all" if mode == "oneshot" else str(i)
            per_frame = 1e3 * c.seconds / c.pixel_frames
            print(
                f"{mode:<8} {name:>5} {c.latent_frames:>6} {c.pixel_frames:>6} {1e3 * c.seconds:>10.1f} "
                f"{per_frame:>12.2f} {_mib(c.peak_bytes):>9}"
            )
    stream, oneshot = results["stream"], results["oneshot"]
    t_stream = sum(c.seconds for c in stream.calls)
    t_oneshot = oneshot.calls[0].seconds
    print(
        f"\ntotal time     stream {1e3 * t_stream:.1f} ms, one-shot {1e3 * t_oneshot:.1f} ms, "
        f"ratio stream/one-shot {t_stream / t_oneshot:.3f}"
    )
    peaks = [c.peak_bytes for c in stream.calls if c.peak_bytes is not None]
    peak_oneshot = oneshot.calls[0].peak_bytes
    if peak_oneshot is not None and len(peaks) == len(stream.calls):
        print(
            f"peak memory    stream {_mib(max(peaks))} MiB (max over blocks), "
            f"one-shot {_mib(peak_oneshot)} MiB, ratio {max(peaks) / max(peak_oneshot, 1):.3f}"
        )
    print(f"decode state   {_mib(stream.state_bytes)} MiB carried between blocks")
    print(f"bit-identical  {'yes' if stream.sha256 == oneshot.sha256 else 'NO'} (sha256 of the video)")


def report_variants(results: dict[str, VariantResult]) -> None:
    first = next(iter(results.values()))
    print(f"{'variant':<22}{'ms/block min':>14}{'median':>10}{'ratio':>8}{'max abs diff':>14}{'warm-up s':>11}")
    for name, res in results.items():
        diff = (res.video.float() - first.video.float()).abs().max().item()
        print(
            f"{name:<22}{1e3 * min(res.seconds):>14.1f}{1e3 * statistics.median(res.seconds):>10.1f}"
            f"{min(res.seconds) / min(first.seconds):>8.3f}{diff:>14.2e}{res.warmup_s:>11.1f}"
        )


def report_share(rows: list[ShareRow]) -> None:
    print(f"{'model':<42}{'pixels':>10}{'denoise ms':>12}{'context ms':>12}{'VAE ms':>10}{'VAE share':>11}")
    for row in rows:
        pixels = f"{row.pixels[0]}x{row.pixels[1]}"
        print(
            f"{row.name:<42}{pixels:>10}{1e3 * row.denoise_s:>12.1f}{1e3 * row.context_s:>12.1f}"
            f"{1e3 * row.vae_s:>10.1f}{row.vae_share:>10.1%}"
        )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES), help="of the stream vs one-shot run")
    parser.add_argument("--dim", type=int, default=32, help="VAE base width (Wan2.1: 96)")
    parser.add_argument("--num-res-blocks", type=int, default=2)
    parser.add_argument(
        "--latent-hw",
        type=int,
        nargs=2,
        default=(16, 16),
        metavar=("H", "W"),
        help="latent height/width; pixels are 8x (Wan2.1 480p: 60 104)",
    )
    parser.add_argument("--blocks", type=int, default=4, help="number of latent blocks")
    parser.add_argument("--block-frames", type=int, default=3, help="latent frames per block")
    parser.add_argument("--repeats", type=int, default=1, help="timed passes per mode (median reported)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch default)")
    parser.add_argument(
        "--variants", type=Variant.parse, nargs="+", metavar="VARIANT", help="compare these decodes side by side"
    )
    parser.add_argument("--share", action="store_true", help="the VAE decode's share of a block (CPU, fp32)")
    parser.add_argument(
        "--share-latent", type=int, nargs=2, default=(28, 64), metavar=("H", "W"), help="latent of the --share DiT"
    )
    parser.add_argument("--share-blocks", type=int, default=3, help="blocks per --share session")
    parser.add_argument("--taehv", action="store_true", help="TAEHV vs the Wan VAE (--dim 96) and framewise (CPU)")
    parser.add_argument(
        "--taehv-latents",
        type=lambda v: tuple(int(x) for x in v.split("x")),
        nargs="+",
        default=[(28, 64), (60, 104)],
        metavar="HxW",
        help="latent sizes of --taehv (default 28x64 60x104: 224x512 and 480x832 pixels)",
    )
    parser.add_argument("--taehv-dtypes", nargs="+", default=["fp32", "bf16"], choices=sorted(DTYPES))
    parser.add_argument("--taehv-skip-wan", action="store_true", help="--taehv without the (slow) Wan VAE")
    parser.add_argument("--taehv-skip-dit", action="store_true", help="--taehv without the DiT (no shares)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    h, w = args.latent_hw
    ctx = mp.get_context("spawn")  # fresh process per mode, no inherited allocator state
    if args.share:
        sh, sw = args.share_latent
        print(
            f"VAE share of a block: cpu fp32, VAE dim {args.dim}, {args.share_blocks} blocks x {args.block_frames} "
            f"latent frames, min of {args.repeats} session(s); engine bench DiT at latent {sh}x{sw}\n"
        )
        with ctx.Pool(1) as pool:
            report_share(pool.apply(run_share, (args,)))
        return
    if args.taehv:
        print(
            f"TAEHV vs Wan VAE (dim {args.dim}) vs framewise TAEHV, cpu, {args.threads or 'default'} thread(s), one "
            f"block of {args.block_frames} latent frames after a first frame, TAEHV min of {args.repeats}\n"
        )
        with ctx.Pool(1) as pool:
            report_taehv(pool.apply(run_taehv, (args,)))
        return
    if args.variants:
        print(
            f"Wan VAE streaming decode variants, {args.device}, dim {args.dim}, latents {args.blocks}x"
            f"{args.block_frames} frames of {h}x{w} -> {8 * h}x{8 * w} px, {args.repeats} interleaved round(s)\n"
        )
        with ctx.Pool(1) as pool:
            report_variants(pool.apply(run_variants, (args,)))
        return
    print(
        f"Wan VAE decode, {args.device} {args.dtype}, dim {args.dim}, latents {args.blocks}x"
        f"{args.block_frames} frames of {h}x{w} -> {8 * h}x{8 * w} px, {args.repeats} timed pass(es)\n"
    )
    with ctx.Pool(1, maxtasksperchild=1) as pool:
        results = {mode: pool.apply(run_mode, (args, mode)) for mode in ("stream", "oneshot")}
    report(results)


if __name__ == "__main__":
    main()
