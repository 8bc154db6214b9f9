"""MAGI-1's chunk pipeline: seconds per chunk against the chunk's real-time budget, distilled (one pass
per step) beside base (three passes), with random weights of a preset's shapes.

    python bench/magi.py                                   # 4.5B-distill shapes scaled down, CPU
    python bench/magi.py --preset magi1-4.5b-distill --full --device cuda --dtype bf16 --latent 90x90

A chunk is emitted per stage once the window is full; the first chunk pays `window_size` stages
(warm-up). Printed side by side from one run: steady seconds per chunk for both dispatch modes, their
ratio, and the real-time factor (video seconds made per second of compute).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch

from engine.families.magi.dit import MagiDiT, MagiDiTConfig
from engine.families.magi.pipeline import MagiPipeline, SeededChunkNoise
from inferix.spec.families.magi import load_magi_preset, magi_chunk_frames, magi_presets

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=magi_presets(), default="magi1-4.5b-distill")
    p.add_argument("--full", action="store_true", help="the preset's real sizes (default: hidden 256, 4 layers)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--latent", default="8x8", help="latent HxW (720x720 video = 90x90)")
    p.add_argument("--steps", type=int, default=8, help="num_steps (a multiple of the window)")
    p.add_argument("--chunks", type=int, default=6, help="chunks to make (the first is warm-up)")
    p.add_argument("--modes", default="distill,base", help="dispatch modes to time: distill, base or both")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    p.add_argument("--json", type=Path, metavar="OUT", help="also write the figures to OUT as JSON")
    return p.parse_args()


def random_dit(config: MagiDiTConfig, device: torch.device, dtype: torch.dtype) -> MagiDiT:
    with torch.device("meta"):
        model = MagiDiT(config)
    model = model.to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(0)  # on the device: billions of draws
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name == "rope.bands":
                bands = config.rope_bands
                param.copy_(1 / 10000 ** (torch.arange(bands, dtype=torch.float32) / bands))
            else:
                param.normal_(0.0, 0.02, generator=generator)
    return model.to(dtype).eval()


def chunk_seconds(pipeline: MagiPipeline, height: int, width: int, chunks: int, device: torch.device) -> list[float]:
    caption = torch.randn(40, pipeline.null_rows.shape[1], device=device, dtype=pipeline.null_rows.dtype)
    session = pipeline.open_session(height, width, lambda _: caption, SeededChunkNoise(0), None, "bench")
    seconds = []
    for _ in range(chunks):
        began = time.perf_counter()
        session.generate_chunk()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - began)
    return seconds


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    preset = load_magi_preset(args.preset)
    model_config = dict(preset.model_config)
    if not args.full:
        model_config.update(hidden_size=256, num_attention_heads=4, num_query_groups=2, kv_channels=64)
        model_config.update(ffn_hidden_size=512, num_layers=4, caption_channels=64)
    config = MagiDiTConfig.from_reference(model_config)
    dit = random_dit(config, device, dtype)
    height, width = (int(v) for v in args.latent.split("x"))
    figures: dict[str, object] = {
        "preset": args.preset,
        "full": args.full,
        "latent": args.latent,
        "device": args.device,
    }
    steady: dict[str, float] = {}
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"distill", "base"}:
        raise SystemExit(f"--modes takes distill, base or both, got {args.modes!r}")
    for mode, cfg_number in (("distill", 1), ("base", 3)):
        if mode not in modes:
            continue
        distill = cfg_number == 1
        sampling = dataclasses.replace(preset.sampling, num_steps=args.steps, cfg_number=cfg_number, distill=distill)
        pipeline = MagiPipeline(dit, sampling)
        seconds = chunk_seconds(pipeline, height, width, args.chunks, device)
        steady[mode] = statistics.median(seconds[1:])
        figures[f"{mode}_first_chunk_s"] = seconds[0]
        figures[f"{mode}_steady_chunk_s"] = steady[mode]
    video_s = magi_chunk_frames(preset.sampling) / preset.video.fps
    print(f"{args.preset} {'full' if args.full else 'scaled-down'} DiT, latent {args.latent}, {args.steps} steps, "
          f"window {preset.sampling.window_size}, {args.device} {args.dtype}")  # fmt: skip
    for mode, value in steady.items():
        print(f"  {mode:8s} {value:.3f} s/chunk  (first chunk {figures[f'{mode}_first_chunk_s']:.3f} s)  "
              f"real-time factor {video_s / value:.2f} ({video_s:.2f} s of video per chunk)")  # fmt: skip
    figures["video_s_per_chunk"] = video_s
    if len(steady) == 2:
        ratio = steady["base"] / steady["distill"]
        figures["base_over_distill"] = ratio
        print(f"  base / distill per chunk: {ratio:.2f}x (three passes per step vs one)")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
