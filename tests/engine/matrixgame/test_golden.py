"""Matrix-Game 2.0 parity with the reference (SkyworkAI/Matrix-Game, Matrix-Game-2/) through
`inferix verify-golden`: every stage of MATRIXGAME2_README.md."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.families.matrixgame.conditioning import condition_on_image
from engine.families.matrixgame.golden import MatrixGameCase
from inferix_cli.main import main
from tests.conftest import GOLDEN_DIR, MATRIXGAME_CASES

STAGES = {
    "scheduler/warped steps",
    "action_rope/cos",
    "conditioning/visual_context",
    "conditioning/img_cond",
    "conditioning/cond_concat",
    "dit_forward/call0 taps",
    "dit_forward/call1 flow",
    "dit_forward/call2 flow",
    "pipeline/every xin",
    "pipeline/every flow",
    "pipeline/every x0",
    "pipeline/every flow ctx",
    "pipeline/latents",
    "cache/self-attn K/V",
    "cache/keyboard+mouse K/V",
    "cache/end indices",
    "vae/video",
}


def test_the_case_is_present() -> None:
    assert MATRIXGAME_CASES == ["matrixgame2_tiny"]


@pytest.mark.parametrize("case", MATRIXGAME_CASES)
def test_verify_golden_passes_every_stage(case: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify-golden", str(GOLDEN_DIR / case), "--json"]) == 0
    records = {r["tensor"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert set(records) >= STAGES
    assert all(r["passed"] for r in records.values())
    assert records["scheduler/warped steps"]["max_abs_diff"] == 0.0
    assert records["pipeline/latents"]["max_abs_diff"] < 1e-5


def test_a_tampered_step_fails_exactly_there(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = tmp_path / "matrixgame2_tampered"
    shutil.copytree(GOLDEN_DIR / "matrixgame2_tiny", case)
    for path in case.iterdir():
        path.chmod(0o644)
    outputs = load_file(str(case / "outputs.safetensors"))
    outputs["x0_b2_s1"] = outputs["x0_b2_s1"] + 1e-4
    save_file(outputs, str(case / "outputs.safetensors"))
    assert main(["verify-golden", str(case)]) == 1
    failing = [line for line in capsys.readouterr().out.splitlines() if line.startswith("FAIL")]
    assert len(failing) == 1 and "pipeline/every x0" in failing[0]


def test_condition_on_image_gives_the_golden_conditioning() -> None:
    case = MatrixGameCase(GOLDEN_DIR / "matrixgame2_tiny")
    golden = case.tensors("conditioning")
    image = case.tensors("inputs")["image"][:, :, 0]
    conditioning = condition_on_image(case.vae(), case.clip(), image, golden["cond_concat"].shape[2])
    assert torch.allclose(conditioning.cond_concat, golden["cond_concat"].transpose(1, 2), atol=1e-5, rtol=0)
    assert torch.allclose(conditioning.visual_context, golden["visual_context"], atol=1e-5, rtol=0)
