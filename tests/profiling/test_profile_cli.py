"""`inferix profile`: the summary table, merging rank reports, HTML output, and user errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from inferix.profiling import ProfileReport
from inferix_cli.main import main
from tests.profiling.helpers import rank_report

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def rank_files(tmp_path: Path) -> list[Path]:
    reports = [rank_report(0, 2, [0.4, 0.2], pixel_frames=9), rank_report(1, 2, [0.3, 0.5], pixel_frames=0)]
    return [report.write_json(tmp_path / f"profile-rank{report.ranks[0].rank}.json") for report in reports]


def test_summary_prints_the_standard_metrics_and_regions(
    rank_files: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["profile", str(rank_files[0])]) == 0
    out = capsys.readouterr().out
    assert "Inferix profile: tiny" in out and "ranks 0 of world size 2" in out
    assert "time to first block  0.400 s" in out
    assert "real-time factor     1.88" in out  # (18 frames / 16 fps) / 0.6 s
    assert "p50 200.00  p90 400.00  p99 400.00  max 400.00 ms  (n=2)" in out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] == ["block"] and "latency" not in line]
    assert rows == [["block", "2", "0.600", "0.000", "300.00", "200.00", "400.00", "400.00", "400.00", "0"]]


def test_merge_writes_a_merged_report_and_prints_it(
    rank_files: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_path = tmp_path / "merged" / "profile.json"
    assert main(["profile", "merge", *map(str, rank_files), "--out", str(out_path), "--regions", "1"]) == 0
    out = capsys.readouterr().out
    merged = ProfileReport.load(out_path)
    assert merged.merged and merged.summary.blocks == 2 and merged.summary.pixel_frames == 18
    assert f"merged 2 rank report(s) into {out_path}" in out
    assert "ranks 0,1 of world size 2" in out and "top 1 of 3" in out
    assert "Ranks" in out and "time to first block  0.400 s" in out


def test_html_output(rank_files: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    html = tmp_path / "report.html"
    assert main(["profile", str(rank_files[0]), "--html", str(html)]) == 0
    assert f"wrote {html}" in capsys.readouterr().out
    assert html.read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["profile", "absent.json"], "no such profile report: absent.json"),
        (["profile", "merge", "--out", "m.json"], "merge needs the report of every rank"),
        (["profile", "a.json", "b.json"], "summarize one report at a time"),
        (["profile", "a.json", "--out", "m.json"], "--out is for `inferix profile merge`"),
        (["profile", "a.json", "--regions", "0"], "--regions must be at least 1"),
    ],
)
def test_user_errors_are_one_line(
    argv: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("inferix profile: error: ") and message in err and err.count("\n") == 1


def test_merge_without_out_and_a_mismatched_rank_set(
    rank_files: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["profile", "merge", str(rank_files[0])]) == 2
    assert "merge needs --out" in capsys.readouterr().err
    assert main(["profile", "merge", str(rank_files[0]), "--out", "unused.json"]) == 2
    assert "got ranks [0]" in capsys.readouterr().err


def test_the_installed_command_runs_as_a_process(rank_files: list[Path], tmp_path: Path) -> None:
    merged = tmp_path / "merged.json"
    result = subprocess.run(
        [sys.executable, "-m", "inferix_cli", "profile", "merge", *map(str, rank_files), "--out", str(merged)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "merged 2 rank report(s)" in result.stdout and "time to first block" in result.stdout
    assert ProfileReport.load(merged).world_size == 2
