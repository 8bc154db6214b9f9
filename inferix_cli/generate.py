"""`inferix generate`: run the engine in-process and write an MP4."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from inferix.errors import UserError
from inferix.frames_digest import FramesDigest
from inferix.spec import parse_prompt_schedule
from inferix.spec.families.matrixgame import TINY_MODEL
from inferix.spec.presets import DEFAULT_MODEL

# Flags that a model started from an image (Matrix-Game 2.0: no text) refuses when set, with why.
_IMAGE_MODEL_REFUSES = {
    "prompt": "takes no text; steer it with --actions",
    "prompt_at": "takes no text; steer it with --actions",
    "recache": "takes no text prompts to re-cache",
}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="generate a video in-process and write an MP4",
        description=(
            "Generate a video block by block with the engine in this process and write an H.264 MP4. "
            "Without --model, the built-in toyworld model runs: a tiny causal Wan model trained on a 2-D "
            "world of coloured balls and squares (64x64, 16 fps), faster than real time on one CPU core. "
            "Its prompts read like 'a red ball bouncing to the right' or 'two blue squares falling'; "
            "change colour mid-video with 'the ball turns green'. --model tiny runs random weights (a smoke test). "
            "--model toyworld-play adds a player object that --actions (arrow keys up, down, left, right) steer; "
            "--model toyworld-play-1f runs it with one-frame blocks (a key steers the next frame). "
            "Matrix-Game 2.0 models (a model folder, or matrixgame2-tiny: random weights) start from --image and "
            "are steered by --actions instead of a prompt."
        ),
        epilog=(
            'example: inferix generate --prompt "a red ball bouncing to the right" '
            '--prompt-at 16:"the ball turns green" --blocks 32 --seed 1 --out out/ball.mp4'
        ),
    )
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help=f"model folder, or built-in: toyworld (default), toyworld-play, toyworld-play-1f, tiny, {TINY_MODEL}",
    )
    parser.add_argument("--prompt", default=None, help="the prompt from block 0 (required, except for Matrix-Game)")
    parser.add_argument(
        "--image",
        type=Path,
        default=None,
        help="Matrix-Game: the start image (PNG or JPEG), center-cropped to the video's aspect ratio and resized "
        "to its size (--width/--height, default the model's)",
    )
    parser.add_argument(
        "--actions",
        type=Path,
        default=None,
        metavar="FILE",
        help="action-conditioned models (Matrix-Game, toyworld-play): an action track, .json or .csv (see the "
        "README); default: no key held, mouse still",
    )
    parser.add_argument(
        "--prompt-at",
        action="append",
        default=[],
        metavar='BLOCK:"TEXT"',
        help="switch to TEXT at block BLOCK (repeatable)",
    )
    parser.add_argument(
        "--recache",
        action="store_true",
        help="re-cache the KV cache at prompt changes as LongLive does (a model whose preset sets "
        "prompt_switch.recache always does)",
    )
    parser.add_argument("--blocks", type=int, default=7, help="number of blocks to generate (default 7)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--width", type=int, default=None, help="pixels (default: the model's)")
    parser.add_argument("--height", type=int, default=None, help="pixels (default: the model's)")
    parser.add_argument("--out", type=Path, default=Path("out/video.mp4"), help="MP4 path (default out/video.mp4)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--dtype", default=None, help="fp32, bf16 or fp16 (default: fp32 on CPU, bf16 on CUDA)")
    parser.add_argument("--attention", default="auto", help="attention backend: auto, sdpa, flash")
    parser.add_argument(
        "--quant",
        default=None,
        help="quantize the DiT's block linears: none, int8 (W8A8), int8-wo (weights only), fp8, fp8-tensor "
        "(default: the model folder's; see Quantization in the README)",
    )
    parser.add_argument(
        "--decoder",
        default=None,
        metavar="vae|taehv:PATH",
        help="decode latents with: vae (the model's own, default) or taehv:PATH (a TAEHV weight file, .pth or "
        ".safetensors; Wan-latent models; default: the model folder's 'decoder:')",
    )
    parser.add_argument(
        "--kv-dtype",
        default="auto",
        choices=("auto", "fp8", "int8"),
        help="KV cache storage: auto (the model's dtype), fp8 or int8 (8-bit pages with a scale per page and head)",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="compile the DiT step with torch.compile (inductor) and warm it up before the first block (minutes "
        "more start-up on a CPU); frames equal the eager ones within float rounding, not bit for bit",
    )
    parser.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="replay the DiT step from CUDA graphs captured before the first block (CUDA only; same bits as eager)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument(
        "--profile", type=Path, default=None, metavar="DIR", help="write a profile report (JSON + HTML) to DIR"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.blocks < 1:
        raise UserError(f"--blocks must be at least 1, got {args.blocks}")
    if args.out.suffix.lower() != ".mp4":
        raise UserError(f"--out must end in .mp4, got {args.out}")
    from engine.capabilities import EngineRequest, check
    from engine.registry import family_capabilities

    family = family_capabilities(args.model)
    request = EngineRequest(
        quant=args.quant,
        kv_dtype=args.kv_dtype,
        decoder=args.decoder,
        compile=args.compile,
        cuda_graphs=args.cuda_graphs,
    )
    if family.starts_from == "image":
        for flag, why in _IMAGE_MODEL_REFUSES.items():
            if getattr(args, flag) not in (None, False, []):
                raise UserError(f"--{flag.replace('_', '-')}: {family.name} {why}")
        check(family, request)
        schedule = []
    else:
        if args.image is not None:
            raise UserError(f"--image: model {args.model or DEFAULT_MODEL} takes no start image (Matrix-Game does)")
        if args.prompt is None:
            raise UserError("the following arguments are required: --prompt")
        schedule = parse_prompt_schedule(args.prompt, args.prompt_at, args.recache, num_blocks=args.blocks)
        check(family, request)

    import torch
    from tqdm import tqdm

    from engine.contract import SessionRequest
    from engine.registry import load_engine
    from inferix.media import Mp4Writer
    from inferix.profiling import Profiler
    from inferix.spec.actions import parse_action_track

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32")
    started = time.perf_counter()
    engine = load_engine(
        args.model,
        dtype=dtype,
        device=args.device,
        attention_backend=args.attention,
        quant=args.quant,
        kv_dtype=args.kv_dtype,
        decoder=args.decoder,
    )
    model = engine.model
    width, height = args.width or model.width, args.height or model.height
    if args.compile:
        warm = engine.compile(width=width, height=height, num_blocks=args.blocks)
        print(f"compiled the DiT step: {warm.graphs} graph(s) in {warm.seconds:.1f} s", file=sys.stderr)
    if args.cuda_graphs:
        warm = engine.use_cuda_graphs(width=width, height=height, num_blocks=args.blocks)
        print(f"captured the DiT step's CUDA graphs in {warm.seconds:.1f} s", file=sys.stderr)
    changes = {c.at_block: c for c in schedule[1:]}
    profiler = Profiler(enabled=args.profile is not None, fps=model.fps, label=f"{model.name} {width}x{height}")
    loaded = time.perf_counter()
    first_block_s = 0.0
    frames = 0
    digest = FramesDigest()  # the same digest the streamer reports
    track = None
    if args.actions is not None:
        if engine.action_schema is None:
            raise UserError(
                f"--actions: model {model.name} takes no actions (toyworld-play and Matrix-Game do); steer it "
                "with --prompt-at"
            )
        track = parse_action_track(args.actions, engine.action_schema, f"--actions {args.actions}")
    start = SessionRequest(
        prompt=schedule[0].text if schedule else None,
        image=args.image,
        width=width,
        height=height,
        seed=args.seed,
        num_blocks=args.blocks,
        actions=track,
    )
    with (
        engine.open_session(start) as video,
        Mp4Writer(args.out, width, height, model.fps) as writer,
        tqdm(total=args.blocks, unit="block", disable=args.quiet, file=sys.stderr) as bar,
        profiler.session(),
    ):
        profiler.add_gauge("kv_pool", lambda: {"used_pages": float(video.kv_usage().device_pages)})
        for index in range(args.blocks):
            with profiler.block(index) as scope:
                if index in changes:  # (an image model has no prompt schedule)
                    video.set_prompt(changes[index].text, recache=changes[index].recache)
                block = video.next_block()
                scope.pixel_frames = block.frames.shape[0]
            writer.write(block.frames)
            digest.update_frames(block.frames)
            frames += block.frames.shape[0]
            if index == 0:
                first_block_s = time.perf_counter() - loaded
            elapsed = time.perf_counter() - loaded
            bar.set_postfix(fps=f"{frames / elapsed:.1f}", frames=frames)
            bar.update(1)
    total = time.perf_counter() - loaded
    if args.profile is not None:
        profiler.write(args.profile)
    video_s = frames / model.fps
    print(
        f"wrote {args.out}: {frames} frames {width}x{height} @ {model.fps} fps ({video_s:.1f} s of video), "
        f"model {model.name}\n"
        f"load {loaded - started:.1f} s | time to first block {first_block_s:.2f} s | "
        f"{frames / total:.1f} frames/s | real-time factor {video_s / total:.2f}\n"
        f"frames sha256 {digest.hexdigest()}"
        + (f"\nprofile written to {args.profile}" if args.profile is not None else "")
    )
    return 0
