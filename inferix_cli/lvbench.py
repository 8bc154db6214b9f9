"""`inferix lvbench run|eval`: generate LV-Bench videos through a mesh, then score their drift."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from inferix.errors import UserError
from inferix_cli.scheduler_address import TLS_EPILOG, add_scheduler_address_arguments, print_waiting, retry_seconds

_SUMMARY_KEYS = ("vde_linear", "vde_linear_normalized", "vde_log", "vde_log_normalized", "vbench_score")
_COLUMNS = ("VDE lin", "norm", "VDE log", "norm", "VBench")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "lvbench",
        help="LV-Bench: generate long multi-prompt videos and measure their drift (VDE, VBench)",
        description=(
            "LV-Bench benchmarks long-video generation: `run` generates each annotated video through a running "
            "mesh with its captions as a prompt schedule, `eval` scores a folder of videos with the Video Drift "
            "Error of five metrics and the matching VBench dimensions."
        ),
    )
    commands = parser.add_subparsers(dest="lvbench_command", metavar="ACTION", required=True)

    run = commands.add_parser(
        "run",
        help="generate the annotated videos through a mesh",
        description=(
            "Generates one session per annotated video, its captions switching the prompt at the nearest block "
            "boundary, and saves <video_id>.mp4 plus manifest.json (schedules, timings, failures) in --out."
        ),
        epilog="example: inferix lvbench run --annotations lvbench.json --split eval --out out/lvbench.  " + TLS_EPILOG,
    )
    run.add_argument("--annotations", type=Path, required=True, help="LV-Bench-style JSON (see lvbench/dataset.py)")
    add_scheduler_address_arguments(run)
    run.add_argument("--out", type=Path, required=True, help="folder for <video_id>.mp4 and manifest.json")
    run.add_argument("--api-key", default=os.environ.get("INFERIX_API_KEY"), help="API key (env INFERIX_API_KEY)")
    run.add_argument("--model", default="toyworld", help="model served by the mesh (default toyworld)")
    run.add_argument(
        "--split",
        choices=("all", "train", "eval"),
        default="all",
        help="which videos of the 80/20 split (default all; LV-Bench reports eval)",
    )
    run.add_argument("--limit", type=int, default=0, help="at most this many videos (0 = all)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--width", type=int, default=0, help="pixels (default: the model's)")
    run.add_argument("--height", type=int, default=0, help="pixels (default: the model's)")
    run.add_argument("--fps", type=float, default=None, help="model frame rate (default: from the model preset)")
    run.add_argument("--first-block-frames", type=int, default=None, help="pixel frames of block 0 (default: preset)")
    run.add_argument(
        "--frames-per-block", type=int, default=None, help="pixel frames of later blocks (default: preset)"
    )
    run.add_argument("--timeout", type=float, default=60.0, help="seconds per call")
    run.add_argument("--skip-existing", action="store_true", help="keep videos whose MP4 is already in --out")
    run.add_argument("--dry-run", action="store_true", help="print the prompt schedules; generate nothing")
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    run.set_defaults(func=run_command)

    ev = commands.add_parser(
        "eval",
        help="score every MP4 in a folder",
        description=(
            "Scores every .mp4 in --videos. Without weights every metric uses its weight-free backend (runs "
            "anywhere; not comparable with published numbers); giving a metric's weights selects its deep backend."
        ),
    )
    ev.add_argument("--videos", type=Path, required=True, help="folder of .mp4 files")
    ev.add_argument("--out", type=Path, default=None, help="results folder (default: VIDEOS/lvbench-eval)")
    ev.add_argument("--chunks", type=int, default=10, help="VDE chunks per video (default 10)")
    ev.add_argument("--musiq", type=Path, default=None, help="clarity: musiq_spaq_ckpt-358bb6af.pth (needs pyiqa)")
    ev.add_argument("--clip-b32", type=Path, default=None, help="background: openai/clip-vit-base-patch32 folder")
    ev.add_argument("--clip-l14", type=Path, default=None, help="aesthetic: openai/clip-vit-large-patch14 folder")
    ev.add_argument("--aesthetic-head", type=Path, default=None, help="aesthetic: sa_0_4_vit_l_14_linear.pth")
    ev.add_argument("--dino", type=Path, default=None, help="subject: facebook/dino-vitb16 folder")
    ev.add_argument("--device", default="cpu", help="device of the deep backends: cpu, cuda, cuda:1, ...")
    ev.add_argument("--batch-size", type=int, default=16, help="frames per forward of the deep backends")
    ev.add_argument("--quiet", action="store_true", help="no progress bar")
    ev.set_defaults(func=eval_command)


def _timing(args: argparse.Namespace) -> Any:
    from lvbench.schedule import BlockTiming

    given = {"fps": args.fps, "first_block_frames": args.first_block_frames, "frames_per_block": args.frames_per_block}
    if all(v is not None for v in given.values()):
        return BlockTiming(**given)
    try:
        preset = BlockTiming.from_preset(args.model)
    except UserError as exc:
        raise UserError(
            f"{exc}; for a model without a preset pass --fps, --first-block-frames and --frames-per-block"
        ) from None
    return BlockTiming(**{k: v if v is not None else getattr(preset, k) for k, v in given.items()})


def run_command(args: argparse.Namespace) -> int:
    from inferix.client.tls import resolve
    from lvbench.dataset import load_annotations, split_videos
    from lvbench.runner import MANIFEST, RunConfig, run_benchmark
    from lvbench.schedule import plan_video

    if args.limit < 0:
        raise UserError(f"--limit must be >= 0, got {args.limit}")
    videos = load_annotations(args.annotations)
    if args.split != "all":
        videos = split_videos(videos)[args.split]
    if args.limit:
        videos = videos[: args.limit]
    if not videos:
        raise UserError(f"no videos in {args.annotations} for --split {args.split}")
    timing = _timing(args)
    if args.dry_run:
        for video in videos:
            plan = plan_video(video, timing)
            dropped = f", captions {list(plan.dropped)} dropped (too short)" if plan.dropped else ""
            size = f"{plan.num_blocks} blocks, {plan.num_frames} frames"
            print(f"{video.video_id}: {video.duration:.1f} s -> {size}{dropped}")
            for p in plan.prompts:
                print(f"  block {p.at_block:>4} ({p.start:6.1f} s)  {p.text}")
        return 0
    try:
        resolve(args.server, args.tls, args.ca)  # a CA file that does not read: one line, before any video
    except ValueError as exc:
        raise UserError(f"--server / --ca: {exc}") from None
    config = RunConfig(
        server=args.server,
        tls=args.tls,
        ca=args.ca,
        out=args.out,
        model=args.model,
        seed=args.seed,
        width=args.width,
        height=args.height,
        api_key=args.api_key,
        timeout=args.timeout,
        skip_existing=args.skip_existing,
        progress=not args.quiet,
        retry_s=retry_seconds(args),
        on_wait=print_waiting,
    )
    runs = run_benchmark(videos, timing, config)
    failed = [r for r in runs if r.status == "failed"]
    for r in failed:
        print(f"{r.video_id}: failed: {r.error}")
    print(f"{len(runs) - len(failed)} of {len(runs)} videos in {args.out}; manifest {args.out / MANIFEST}")
    return 1 if failed else 0


def eval_command(args: argparse.Namespace) -> int:
    from lvbench.evaluate import evaluate_videos
    from lvbench.metrics import DeepWeights, build_suite
    from lvbench.report import write_report

    if not args.videos.is_dir():
        raise UserError(f"--videos {args.videos}: not a folder")
    if args.chunks < 2:
        raise UserError(
            f"--chunks must be at least 2 (a drift compares later chunks with the first), got {args.chunks}"
        )
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {args.batch_size}")
    paths = sorted(p for p in args.videos.glob("*.mp4") if p.is_file())
    if not paths:
        raise UserError(f"--videos {args.videos}: no .mp4 files")
    weights = DeepWeights(args.musiq, args.clip_b32, args.clip_l14, args.aesthetic_head, args.dino)
    suite = build_suite(weights, device=args.device, batch_size=args.batch_size)
    out = args.out or args.videos / "lvbench-eval"
    out.mkdir(parents=True, exist_ok=True)
    evaluation = evaluate_videos(paths, suite, args.chunks, progress=not args.quiet)
    results = evaluation.write_json(out, {k: str(v) if v else None for k, v in vars(weights).items()})
    report = write_report(evaluation, out)
    widths = (10, 9, 10, 9, 11)
    header = "".join(f"{h:>{w}}" for h, w in zip(_COLUMNS, widths, strict=True))
    print(f"{'metric':<11}{'backend':<34}{'videos':>7}{header}")
    for name, s in evaluation.summary.items():
        backend = f"{s['backend']}{' (weight-free)' if s['weight_free'] else ''}"
        cells = "".join(
            f"{v:>{w}.4f}" if isinstance(v, float) else f"{'n/a':>{w}}"
            for v, w in zip((s[k] for k in _SUMMARY_KEYS), widths, strict=True)
        )
        print(f"{name:<11}{backend:<34}{s['videos_scored']:>7}{cells}")
    failures = evaluation.failures
    print(f"{len(paths)} videos, {failures} failures; results {results}; report {report}")
    return 1 if failures else 0
