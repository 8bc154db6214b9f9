"""`inferix generate --profile DIR`: the engine's regions land in a report that `inferix profile` reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferix_cli.main import main


def test_generate_writes_a_profile_with_engine_regions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "prof"
    args = ["generate", "--prompt", "a ball", "--blocks", "2", "--out", str(tmp_path / "v.mp4"), "--quiet"]
    assert main([*args, "--profile", str(out)]) == 0
    report = json.loads((out / "profile-rank0.json").read_text())
    assert (out / "profile-rank0.html").is_file()
    text = json.dumps(report)
    for region in ("denoise_step", "context_pass", "vae_decode"):
        assert region in text, region
    capsys.readouterr()
    assert main(["profile", str(out / "profile-rank0.json")]) == 0
    summary = capsys.readouterr().out
    assert "time to first block" in summary and "vae_decode" in summary and "pixel frames         6" in summary
