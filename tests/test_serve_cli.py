"""`inferix serve` refuses a --model that is neither a folder nor a built-in name, before starting anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferix.cli.main import main


def test_serve_names_the_built_in_models_for_an_unknown_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workdir = tmp_path / "serve"
    assert main(["serve", "--model", "no-such-model", "--workdir", str(workdir)]) == 2
    err = capsys.readouterr().err
    assert "--model no-such-model: not a folder nor a built-in model (toyworld, tiny)" in err
    assert not workdir.exists()  # nothing was started
