"""MAGI-1 parity with the reference (SandAI-org/MAGI-1) through `inferix verify-golden`: every stage of
MAGI1_README.md, on both shared cases (distilled single pass; base model with three-pass guidance)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from inferix_cli.main import main
from tests.conftest import GOLDEN_DIR, MAGI_CASES

STAGES = {
    "text/caption_embs",
    "caption_rows/y",
    "caption_rows/mask",
    "caption_rows/null",
    "schedule/t",
    "schedule/calls (mismatching)",
    "dit/captured passes",
    "pipeline/every call x",
    "pipeline/every call pass_out",
    "pipeline/every call velocity",
    "pipeline/clean chunks",
    "pipeline/latents",
    "pipeline/clean KV cache",
    "vae/chunk0 raw",
    "vae/video uint8 (levels)",
}


def test_both_magi_cases_are_present() -> None:
    assert MAGI_CASES == ["magi1_tiny_cfg", "magi1_tiny_distill"]


@pytest.mark.parametrize("case", MAGI_CASES)
def test_verify_golden_passes_every_stage(case: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify-golden", str(GOLDEN_DIR / case), "--json"]) == 0
    records = {r["tensor"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert set(records) >= STAGES
    assert all(r["passed"] for r in records.values())
    # The schedule and the window bookkeeping are exact; the DiT agrees to a few fp32 ulps.
    assert records["schedule/t"]["max_abs_diff"] == 0.0
    assert records["schedule/calls (mismatching)"]["max_abs_diff"] == 0.0
    assert records["pipeline/latents"]["max_abs_diff"] < 1e-4


def test_a_tampered_clean_chunk_fails_exactly_there(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = tmp_path / "magi1_tampered"
    shutil.copytree(GOLDEN_DIR / "magi1_tiny_distill", case)
    tensors = load_file(str(case / "pipeline.safetensors"))
    tensors["clean_chunk3"] = tensors["clean_chunk3"] + 1e-3
    save_file(tensors, str(case / "pipeline.safetensors"))
    assert main(["verify-golden", str(case)]) == 1
    failing = [line for line in capsys.readouterr().out.splitlines() if line.startswith("FAIL")]
    assert len(failing) == 1 and "pipeline/clean chunks" in failing[0]
