"""gpu-check's shared parts: paths, budgets, sizes, the stage record and context, timing helpers."""

from __future__ import annotations

import contextlib
import io
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.py"
DEFAULT_OUT = REPO / "out" / "gpu-check"
DEFAULT_BUDGET_S = 450.0  # 7.5 min: the 8 minutes, less the wheel install and start-up
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


SIZES = {s.name: s for s in (REAL, TOY)}
