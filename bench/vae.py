"""Benchmark the Wan VAE decoder: streaming (block by block) vs one-shot decode of the same latents.

    python bench/vae.py --device cpu --threads 1
    python bench/vae.py --device cuda --dim 96 --latent-hw 60 104 --blocks 7   # real Wan2.1 480p shape

Random weights (speed and memory do not depend on their values).  Each mode runs in a fresh child
process so that one mode's allocator state cannot flatter the other.  Inside a child: one untimed
pass measures peak memory (on CPU that pass must be the first, see below), then ``--repeats`` passes
are timed and the median per call is reported.

Peak memory, per call:

* CUDA: ``torch.cuda.max_memory_allocated()`` (reset before the call) minus the bytes allocated just
  before it, i.e. exactly what the decode needs on top of weights, inputs and (streaming) its state.
* CPU: the process peak resident set size (``VmHWM``, reset through ``/proc/self/clear_refs``) minus
  the RSS measured after building the model and inputs, before any decode.  It counts real resident
  memory including allocator slack and memory the allocator retained from earlier blocks, so it is a
  coarse, upper-bound-ish number; Linux only ("n/a" elsewhere).

Streaming outputs are hashed and dropped (as the streamer would consume them); one-shot keeps the
whole video, as it must.  The sha256 of both outputs is compared to confirm they are bit-identical.
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

from inferix.spec.architectures import WanVAEConfig
from workers.engine.models.wan.vae import WanVAE

MiB = 2**20


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
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    model = WanVAE(WanVAEConfig(dim=args.dim, num_res_blocks=args.num_res_blocks)).eval().to(device, dtype)
    h, w = args.latent_hw
    latents = torch.randn(1, args.blocks * args.block_frames, 16, h, w, device=device)
    memory = PeakMemory(device)
    mem_calls, sha, state_bytes = _decode_pass(model, latents, mode, args.block_frames, memory)
    timed = [_decode_pass(model, latents, mode, args.block_frames, None)[0] for _ in range(args.repeats)]
    calls = [
        Call(c.latent_frames, c.pixel_frames, statistics.median(r[i].seconds for r in timed), c.peak_bytes)
        for i, c in enumerate(mem_calls)
    ]
    return ModeResult(calls, sha, state_bytes)


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
    print(f"bit-identical  {'yes' if stream.sha256 == oneshot.sha256 else 'NO'} (sha256 of the fp32 video)")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
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
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    h, w = args.latent_hw
    print(
        f"Wan VAE decode, {args.device} {args.dtype}, dim {args.dim}, latents {args.blocks}x"
        f"{args.block_frames} frames of {h}x{w} -> {8 * h}x{8 * w} px, {args.repeats} timed pass(es)\n"
    )
    ctx = mp.get_context("spawn")  # fresh process per mode, no inherited allocator state
    with ctx.Pool(1, maxtasksperchild=1) as pool:
        results = {mode: pool.apply(run_mode, (args, mode)) for mode in ("stream", "oneshot")}
    report(results)


if __name__ == "__main__":
    main()
