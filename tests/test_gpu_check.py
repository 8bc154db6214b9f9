"""`make gpu-check` without a GPU: the real script, in a real subprocess, as its CPU dry run.

A GPU is lent to this project only now and then; this keeps the script that uses it working in
between: every stage must run its code path at toy sizes and record its figures.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "gpu_check.py"
STAGES = [
    "setup",
    "golden-fp32",
    "golden-bf16",
    "toyworld",
    "e2e",
    "attention",
    "kv-offload",
    "bench-engine",
    "batching",
    "extras",
    "pods",
    "engine-speed",
    "quant",
    "magi",
    "taehv",
]


def _gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(300)
def test_dry_run_runs_every_stage_and_records_its_figures(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OUT"}  # the device tool's folder is not ours
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--out", str(tmp_path), "--budget-s", "220"],
        capture_output=True,
        text=True,
        timeout=290,
        env=env,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["dry_run"] and results["device"] == "cpu" and results["sizes"] == "toy"
    stages = {s["name"]: s for s in results["stages"]}
    assert list(stages) == STAGES
    for stage in stages.values():
        assert stage["status"] in ("ok", "skipped"), (stage["name"], stage.get("reason"), stage.get("log_tail"))
    m = {name: stage["metrics"] for name, stage in stages.items()}

    assert m["setup"]["torch"] and m["setup"]["engine_attention_backend"] == "sdpa"
    assert all(where != "missing" for where in m["setup"]["wheel_modules"].values())
    # Parity is asserted in fp32; bf16 is measured, and cannot be within 1e-5.
    assert m["golden-fp32"]["comparisons"] > 30 and m["golden-fp32"]["above_tolerance"] == 0
    assert m["golden-bf16"]["comparisons"] == m["golden-fp32"]["comparisons"]
    assert m["golden-bf16"]["max_abs_diff"] > m["golden-fp32"]["tolerance"]
    toy = m["toyworld"]
    assert toy["cpu_bf16_vs_cpu_fp32"]["frames"] > 0 and toy["cpu_bf16_vs_cpu_fp32"]["psnr_db"] > 10
    assert toy["cli"]["frames_per_s"] > 0 and toy["cli"]["mp4_bytes"] > 0 and toy["cli"]["frames_sha256"]

    sdpa = m["e2e"]["sdpa"]
    assert sdpa["status"] == "ok" and sdpa["pixel_frames"] > 0
    for key in ("dit_ms_per_block", "vae_ms_per_block", "fps", "time_to_first_frame_s"):
        assert sdpa[key] > 0, key
    assert m["e2e"]["flash"]["status"] == "not available"
    assert m["attention"]["sdpa_default"]["ms"] > 0 and m["attention"]["sdpa_math"]["status"] == "ok"
    assert m["attention"]["paged_sdpa_gather"]["ms"] > 0
    kv = m["kv-offload"]
    assert kv["bit_exact"] and kv["offload_gb_per_s"] > 0 and kv["restore_gb_per_s"] > 0
    bench = m["bench-engine"]
    assert bench["ratios"]["paged/contiguous fp32 eager (rolling)"] > 0
    assert bench["ratios"]["paged/contiguous fp32 eager (fill)"] > 0
    assert bench["kv_mib_per_session"]["fp32 eager paged"] == bench["kv_mib_per_session"]["fp32 eager contiguous"]
    (row,) = m["batching"]["native"]["rows"]
    assert row["sessions"] == 2 and row["batched_fps"] > 0
    assert row["max_abs_diff"] == 0.0  # on a CPU, batched blocks are bit-identical to solo ones
    assert m["magi"]["distill_steady_chunk_s"] > 0 and m["magi"]["video_s_per_chunk"] == 1.0  # 24 frames at 24 fps
    assert m["extras"]["libx264"]["fps"] > 0
    taehv = m["taehv"]
    assert taehv["decode"]["taehv_ms_per_block"] > 0 and taehv["decode"]["wan_vae_ms_per_block"] > 0
    speed = m["engine-speed"]
    for mode in ("eager", "compiled", "cuda_graphs"):
        assert speed[mode]["rolling_ms_per_block"] > 0 and speed[mode]["fill_ms_per_block"] > 0, mode
    assert speed["cuda_graphs"]["max_abs_diff_vs_eager"] == 0.0  # the static-buffer step: the eager bits
    assert speed["compiled"]["max_abs_diff_vs_eager"] < 1e-4

    quant = m["quant"]
    assert quant["none"]["rel_l2_vs_none"] == 0.0 and quant["int8"]["dit_weight_gib"] < quant["none"]["dit_weight_gib"]
    for label in ("int8", "fp8", "fp8+kv-fp8"):
        assert quant[label]["dit_ms_per_block"] > 0 and 0 < quant[label]["rel_l2_vs_none"] < 0.2, label
    assert "### Quantization" in (tmp_path / "results.md").read_text()

    pods = m["pods"]
    assert pods["single"]["ms_per_block"] > 0
    for strategy in ("ulysses", "ring-pass-kv", "ring-pass-q"):
        assert pods[strategy]["ms_per_block"] > 0, strategy
        assert pods[strategy]["max_abs_diff_vs_single"] < 1e-4, strategy  # fp32 on gloo: rounding only

    report = (tmp_path / "results.md").read_text()
    for heading in ("## Correctness", "## Speed", "### Attention", "### KV host offload", "## Pods", "## Commands"):
        assert heading in report
    assert "Self Forcing 1.3B, one H100" in report and "Dry run" in report


def test_wheel_list_and_size_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gpu_check = _gpu_check()
    assert gpu_check.main(["--wheel-list"]) == 0
    pins = capsys.readouterr().out.split()
    assert pins == list(gpu_check.WHEELS) and all("==" in pin for pin in pins)
    assert gpu_check.missing_wheels() == []  # this environment runs the dry run: it has them all

    def wheel(pin: str) -> Path:  # the file name pip downloads for a pin, normalised as wheels are
        name, version = pin.split("==")
        return tmp_path / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"

    for pin in pins:
        wheel(pin).write_bytes(b"0" * 1024)
    assert gpu_check.check_wheels(tmp_path, max_mib=1.0) == 0
    with wheel(pins[0]).open("wb") as big:
        big.truncate(2 * 2**20)
    assert gpu_check.check_wheels(tmp_path, max_mib=1.0) == 1
    err = capsys.readouterr().err
    assert "over the 1 MiB limit" in err and "drop or re-pin a wheel" in err
    wheel(pins[0]).unlink()
    assert gpu_check.check_wheels(tmp_path, max_mib=1.0) == 1
    assert f"no wheel in {tmp_path} for {pins[0]}" in capsys.readouterr().err


def test_results_md_of_a_gpu_run_compares_with_the_public_targets() -> None:
    """The branches only a GPU run takes (flash-attn, pinned copies, targets, pods), on figures of that shape."""
    gpu_check = _gpu_check()
    sdpa: dict[str, Any] = {
        "status": "ok",
        "dit_ms_per_block": 180.0,
        "dit_ms_last_block": 260.0,
        "vae_ms_per_block": 90.0,
        "fps": 36.5,
        "time_to_first_frame_s": 0.28,
        "peak_memory_gib": 21.3,
    }
    shape: dict[str, Any] = {
        "preset": "self-forcing-dmd",
        "dit": "wan2.1-1.3b",
        "dim": 1536,
        "layers": 30,
        "heads": 12,
        "pixels": "480x832",
        "latent": "60x104",
        "tokens_per_frame": 1560,
        "frames_per_block": 3,
        "denoising_steps": 4,
        "attention_window": -1,
        "blocks": 7,
        "dtype": "bf16",
    }
    kv: dict[str, Any] = {
        "frames": 6,
        "session_bytes": 1725235200,
        "offload_gb_per_s": 20.5,
        "offload_gb_per_s_first": 3.1,
        "restore_gb_per_s": 22.0,
        "restore_gb_per_s_first": 19.0,
        "bit_exact": True,
        "raw_pinned": {"status": "ok", "d2h_gb_per_s": 50.1, "h2d_gb_per_s": 52.3},
    }
    pods: dict[str, Any] = {"backend": "nccl", "single": {"ms_per_block": 300.0}}
    for strategy in ("ulysses", "ring-pass-kv", "ring-pass-q"):
        pods[strategy] = {"plan": strategy, "ms_per_block": 170.0, "speedup_vs_single": 1.76}
        pods[strategy]["max_abs_diff_vs_single"] = 0.0
    setup = {"gpu": "NVIDIA H200", "device_count": 2, "driver": "580.159.03"}
    results: dict[str, Any] = {
        "command": "bash scripts/gpu-check.sh",
        "started": "now",
        "total_s": 300.0,
        "budget_s": 450.0,
        "device": "cuda",
        "sizes": "real",
        "dry_run": False,
        "stages": [
            {"name": "setup", "status": "ok", "metrics": setup},
            {"name": "e2e", "status": "ok", "metrics": {"shape": shape, "sdpa": sdpa, "flash": sdpa | {"fps": 40.0}}},
            {"name": "kv-offload", "status": "ok", "metrics": kv},
            {"name": "pods", "status": "ok", "metrics": pods, "commands": ["python -m torch.distributed.run ..."]},
        ],
    }
    report = gpu_check.render_markdown(results)
    assert "| Self Forcing 1.3B, one H100 | 17 FPS end to end | 40.0 FPS |" in report  # the faster attention
    assert "40.0 FPS (met), 0.28 s (met)" in report and "with flash" in report
    assert "host to device 52.30 GB/s" in report and "NVIDIA H200 x 2" in report
    assert "| ring-pass-q | ring-pass-q | 170.0 | 1.76x | 0.00 |" in report
