"""`inferix serve` refuses bad input (an unknown --model, a bad restart policy) before starting anything; its help."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferix_cli.main import main


def test_serve_names_the_built_in_models_for_an_unknown_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workdir = tmp_path / "serve"
    assert main(["serve", "--model", "no-such-model", "--workdir", str(workdir)]) == 2
    err = capsys.readouterr().err
    assert (
        "--model no-such-model: not a folder nor a built-in model "
        "(toyworld, toyworld-play, toyworld-play-1f, tiny, matrixgame2-tiny)" in err
    )
    assert not workdir.exists()  # nothing was started


def test_serve_refuses_a_bad_restart_policy_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INFERIX_SERVE_CRASH_LOOP_RESTARTS", "many")
    workdir = tmp_path / "serve"
    assert main(["serve", "--workdir", str(workdir)]) == 2
    err = capsys.readouterr().err
    assert "restart policy: INFERIX_SERVE_CRASH_LOOP_RESTARTS='many' is not an integer" in err
    assert not workdir.exists()


def test_serve_help_explains_supervision(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "one that exits is restarted where the others expect it (same ports, same worker id)" in text
    assert "A service that exits again after 5 restarts within 60 s is in a crash loop" in text
    assert "INFERIX_SERVE_BACKOFF_S" in text
