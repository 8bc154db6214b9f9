"""`inferix serve` refuses bad input (an unknown --model, a bad restart policy, a negative --worker-threads)
before starting anything; its help; its note on workers whose threads outnumber the cores."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferix_cli.main import main
from inferix_cli.serve import oversubscription_note


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


def test_serve_refuses_negative_worker_threads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workdir = tmp_path / "serve"
    assert main(["serve", "--worker-threads", "-1", "--workdir", str(workdir)]) == 2
    assert "--worker-threads must be at least 1 (or 0: torch's default), got -1" in capsys.readouterr().err
    assert not workdir.exists()


def test_a_note_when_the_workers_threads_outnumber_the_cores() -> None:
    note = oversubscription_note(2, 0, {}, 2)  # torch's default: every core for each worker
    assert note is not None
    assert note.startswith("note: 2 workers of 2 CPU threads each on 2 cores: their OpenMP teams stall one another")
    assert "--worker-threads 1 serves more" in note and "inferix generate --threads 1" in note
    assert "--worker-threads 4 " in (oversubscription_note(4, 0, {"INFERIX_THREADS": "8"}, 16) or "")
    assert oversubscription_note(1, 0, {}, 2) is None  # one worker: its own team only
    assert oversubscription_note(2, 1, {}, 2) is None
    assert oversubscription_note(2, 0, {"INFERIX_THREADS": "1"}, 2) is None  # what the workers read
    assert oversubscription_note(2, 0, {"OMP_NUM_THREADS": "1"}, 2) is None
    assert oversubscription_note(2, 0, {"INFERIX_THREADS": "two"}, 2) is None  # the workers refuse it
    assert oversubscription_note(3, 0, {"OMP_NUM_THREADS": "1"}, 2) is None  # no fewer threads to give
    assert "--worker-threads 1 " in (oversubscription_note(2, 2, {}, 3) or "")
