"""`inferix lvbench eval` on MP4s made in the test, including broken ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from inferix.media import Mp4Writer
from inferix_cli.main import main
from tests.lvbench import synthetic


def write_mp4(path: Path, frames: np.ndarray) -> None:
    with Mp4Writer(path, frames.shape[2], frames.shape[1], fps=16, crf=0) as writer:
        writer.write(frames)


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("videos")
    write_mp4(folder / "blurring.mp4", synthetic.progressively_blurred())
    write_mp4(folder / "static.mp4", synthetic.static())
    write_mp4(folder / "short.mp4", synthetic.static(4))  # too short for 10 chunks
    (folder / "corrupt.mp4").write_bytes(b"this is not a video")
    return folder


def test_eval_scores_every_video_and_tolerates_bad_ones(
    videos: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "eval"
    assert main(["lvbench", "eval", "--videos", str(videos), "--out", str(out), "--quiet"]) == 1  # failures reported
    printed = capsys.readouterr().out
    assert "clarity    laplacian-variance (weight-free)" in printed and "4 videos, 6 failures" in printed

    results = json.loads((out / "results.json").read_text())
    by_name = {v["video"]: v for v in results["videos"]}
    assert results["num_chunks"] == 10 and set(by_name) == {"blurring.mp4", "static.mp4", "short.mp4", "corrupt.mp4"}
    assert "cannot decode" in by_name["corrupt.mp4"]["error"] and not by_name["corrupt.mp4"]["metrics"]

    short = by_name["short.mp4"]["metrics"]
    assert all("cannot be split into 10 chunks" in m["errors"][0] for m in short.values())
    assert short["motion"]["vbench_score"] == pytest.approx(1.0)  # the whole-video score still exists

    blurring, static = by_name["blurring.mp4"]["metrics"], by_name["static.mp4"]["metrics"]
    assert len(blurring["clarity"]["chunk_scores"]) == 10 and len(blurring["clarity"]["drifts"]) == 9
    assert blurring["clarity"]["vde_linear"] > 5 > static["clarity"]["vde_linear"]
    assert static["motion"]["vde_linear"] == pytest.approx(0.0, abs=1e-6)
    assert static["subject"]["vbench_score"] == pytest.approx(1.0, abs=1e-6)
    assert all(not m["errors"] and m["weight_free"] is True for m in blurring.values())

    summary = results["summary"]
    assert summary["clarity"]["videos_scored"] == 2 and summary["clarity"]["videos_failed"] == 2
    assert summary["clarity"]["vde_linear"] == pytest.approx(
        (blurring["clarity"]["vde_linear"] + static["clarity"]["vde_linear"]) / 2
    )
    page = (out / "report.html").read_text()
    assert "<h2>Summary</h2>" in page and "corrupt.mp4" in page and "Weight-free proxy backends" in page
    assert (out / "curves.png").stat().st_size > 1000
    assert sorted(p.name for p in (out / "plots").iterdir()) == ["0000_blurring.png", "0003_static.png"]


def test_eval_usage_errors_are_one_line(videos: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lvbench", "eval", "--videos", str(tmp_path)]) == 2
    assert "no .mp4 files" in capsys.readouterr().err
    assert main(["lvbench", "eval", "--videos", str(videos), "--chunks", "1"]) == 2
    assert "--chunks must be at least 2" in capsys.readouterr().err
    assert main(["lvbench", "eval", "--videos", str(videos), "--clip-l14", str(tmp_path)]) == 2
    assert "needs both --clip-l14 and --aesthetic-head" in capsys.readouterr().err
