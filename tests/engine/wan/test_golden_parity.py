"""Parity with the reference Self Forcing / CausVid code: the definition of checkpoint compatibility."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from engine.golden import find_cases
from engine.registry import is_wan_case
from inferix_cli.main import main
from tests.conftest import GOLDEN_CASES, GOLDEN_DIR


@pytest.mark.parametrize("case", GOLDEN_CASES)
def test_verify_golden_passes(case: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify-golden", str(GOLDEN_DIR / case), "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    names = {r["tensor"] for r in records}
    # Every family of tensors is compared: single forward, every step of every block, cache.
    assert {
        "dit_forward.flow0",
        "dit_forward.flow1",
        "pipeline.latents",
        "text_encoder.embeds",
        "vae.streaming.first_block",
        "vae.streaming_vs_oneshot",
        "chain.video.first_block",
        "chain.video.frame_channel_mean",
    } <= names
    config = json.loads((GOLDEN_DIR / case / "config.json").read_text())
    blocks = config["pipeline"]["num_blocks"]
    steps = len(config["pipeline"]["denoising_step_list_used"])
    assert sum(n.startswith("pipeline.x0_") for n in names) == blocks * steps
    layers = config["kv_cache"]["layers_saved"]
    assert sum(n.startswith("kv_cache.") for n in names) == 2 * len(layers)
    assert all(r["passed"] and r["max_abs_diff"] <= 1e-5 for r in records)


def test_verify_golden_runs_every_case_in_a_folder(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify-golden", str(GOLDEN_DIR)]) == 0
    out = capsys.readouterr().out
    assert all(case in out for case in GOLDEN_CASES)
    assert out.strip().endswith("0 failed")


def test_verify_golden_fails_on_a_tampered_case(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = tmp_path / "tampered"
    shutil.copytree(GOLDEN_DIR / "selfforcing_tiny_rolling", case)
    outputs = load_file(str(case / "outputs.safetensors"))
    outputs["x0_b4_s2"] = outputs["x0_b4_s2"] + 1e-4
    save_file(outputs, str(case / "outputs.safetensors"))
    assert main(["verify-golden", str(case)]) == 1
    out = capsys.readouterr().out
    failing = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert len(failing) == 1 and "pipeline.x0_b4_s2" in failing[0]


def test_verify_golden_rejects_a_folder_without_cases(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify-golden", str(tmp_path)]) == 2
    assert "no golden case found" in capsys.readouterr().err


def test_cpu_fp32_only_cases_are_skipped_in_a_folder_and_refused_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for case in ("selfforcing_tiny_rolling", "magi1_tiny_distill", "matrixgame2_tiny"):
        (tmp_path / case).symlink_to(GOLDEN_DIR / case)
    main(["verify-golden", str(tmp_path), "--dtype", "bf16"])  # bf16 misses the fp32 tolerance: exit code 1
    captured = capsys.readouterr()
    assert "skipped magi1_tiny_distill: MAGI-1 cases run on the CPU in fp32" in captured.err
    assert "skipped matrixgame2_tiny: Matrix-Game 2.0 cases run on the CPU in fp32" in captured.err
    assert "selfforcing_tiny_rolling" in captured.out  # the Wan case still ran
    assert main(["verify-golden", str(tmp_path / "matrixgame2_tiny"), "--dtype", "bf16"]) == 2
    assert "Matrix-Game 2.0 cases run on the CPU in fp32" in capsys.readouterr().err


def test_the_wan_cases_are_told_from_the_other_families() -> None:
    """Benches that read Wan cases (bench/precision.py, bench/vae.py) broke once a Matrix-Game case landed."""
    wan = [case.name for case in find_cases(GOLDEN_DIR) if is_wan_case(case)]
    assert wan == ["causvid_tiny", "longlive_tiny", "selfforcing_tiny_global", "selfforcing_tiny_rolling"]


def test_a_window_longer_than_the_stand_alone_calls_is_verified(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: the stand-alone DiT check sized its pool for its two calls, not for the window the
    session takes at its first block, and crashed. The shared rolling case with its window widened
    beyond two blocks: its two calls never reach the window, so the recorded flows still hold."""
    case = tmp_path / "rolling_wide"
    case.mkdir()
    for name in ("dit", "dit_forward", "inputs", "scheduler"):
        shutil.copy(GOLDEN_DIR / "selfforcing_tiny_rolling" / f"{name}.safetensors", case)
    config = json.loads((GOLDEN_DIR / "selfforcing_tiny_rolling" / "config.json").read_text())
    frames = config["pipeline"]["num_frame_per_block"]
    config["pipeline"]["local_attn_size"] = 3 * frames
    (case / "config.json").write_text(json.dumps(config))
    assert main(["verify-golden", str(case), "--json"]) == 0
    names = {json.loads(line)["tensor"] for line in capsys.readouterr().out.splitlines()}
    assert {"dit_forward.flow0", "dit_forward.flow1", "dit_forward.x0_1"} <= names


def test_a_check_that_cannot_run_fails_with_its_reason_and_the_others_still_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    case = tmp_path / "broken_dit"
    shutil.copytree(GOLDEN_DIR / "selfforcing_tiny_rolling", case)
    dit = load_file(str(case / "dit.safetensors"))
    del dit["head.head.weight"]
    save_file(dit, str(case / "dit.safetensors"))
    assert main(["verify-golden", str(case)]) == 1
    lines = capsys.readouterr().out.splitlines()
    failing = [line for line in lines if line.startswith("FAIL")]
    # The three checks that build the DiT fail once each, with the loader's reason, not a traceback.
    assert len(failing) == 3
    assert all("could not run" in line and "head.head.weight" in line for line in failing)
    passing = {line.split()[2] for line in lines if line.startswith("ok")}
    assert {"scheduler.sigmas", "text_encoder.embeds", "vae.streaming.first_block"} <= passing
