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
                  KV host offload / restore; bench/engine_speed.py; eager vs --compile vs --cuda-graphs;
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
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the gpucheck package beside this script

from gpucheck.harness import (  # noqa: E402
    DEFAULT_BUDGET_S,
    DEFAULT_OUT,
    MIN_STAGE_S,
    REAL,
    REPO,
    RESERVE_S,
    SCRIPT,
    SIZES,
    TARGETS,
    TOY,
    WHEELS,
    WHEELS_MAX_MIB,
    CheckFailed,
    Context,
    Recorder,
    Sizes,
    Skip,
    first_line,
)
from gpucheck.report import render_markdown  # noqa: E402
from gpucheck.stages_correctness import stage_golden_bf16, stage_golden_fp32, stage_setup, stage_toyworld  # noqa: E402
from gpucheck.stages_pods import pod_rank, stage_pods, stage_taehv  # noqa: E402
from gpucheck.stages_speed import (  # noqa: E402
    stage_attention,
    stage_batching,
    stage_bench_engine,
    stage_e2e,
    stage_engine_speed,
    stage_extras,
    stage_kv_offload,
    stage_magi,
    stage_quant,
)
from gpucheck.wheels import check_wheels, missing_wheels  # noqa: E402


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
    Stage("bench-engine", "Speed: bench/engine_speed.py, paged vs contiguous KV", stage_bench_engine, 120),
    Stage("batching", "Speed: continuous batching, N sessions per device", stage_batching, 120),
    Stage("extras", "fp8, NVENC", stage_extras, 45),
    Stage("pods", "Pods: 2-rank Ulysses / Ring vs one device", stage_pods, 180),
    Stage("engine-speed", "Speed: DiT eager vs --compile vs --cuda-graphs, fill and rolling", stage_engine_speed, 150),
    Stage("quant", "Speed: --quant int8 / fp8 and --kv-dtype fp8 vs unquantized, per block", stage_quant, 120),
    Stage("magi", "Speed: MAGI-1 chunk pipeline, seconds per chunk (4.5B-distill shapes)", stage_magi, 90),
    Stage("taehv", "Speed: TAEHV tiny decoder vs the Wan VAE decode, one block at 480x832", stage_taehv, 60),
]


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
