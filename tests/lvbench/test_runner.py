"""`inferix lvbench run` against a real mesh (the default toyworld model, one worker), then `eval` on what it made."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferix_cli.main import main
from inferix_cli.mesh import Mesh, MeshConfig, start_mesh

KEY = "lvbench-key-0123456789"


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    workdir = tmp_path_factory.mktemp("lvbench-mesh")
    keys = workdir / "api-keys"
    keys.write_text(f"{KEY} lvbench\n")
    running = start_mesh(
        MeshConfig(workdir=workdir, workers=1, worker_threads=1, api_keys_file=keys, realtime_streams=64)
    )
    yield running
    codes = running.stop()
    assert all(code == 0 for code in codes.values()), codes


def write_annotations(path: Path) -> Path:
    videos = [
        {
            "video_id": "ball",
            "captions": [
                {"start": 0.0, "end": 1.0, "text": "a red ball bouncing"},
                {"start": 1.0, "end": 2.0, "text": "the ball turns green"},
                {"start": 2.0, "end": 2.8, "text": "the ball turns blue"},
            ],
        },
        {  # 20000 s: more than the scheduler's limit of 100000 blocks (18750 s of toyworld), so it is refused
            "video_id": "too_long",
            "captions": [{"start": 0.0, "end": 20000.0, "text": "a very long walk"}],
        },
        {
            "video_id": "city",
            "captions": [
                {"start": 0.0, "end": 1.5, "text": "a city street at dawn"},
                {"start": 1.5, "end": 3.5, "text": "the street fills with traffic"},
            ],
        },
    ]
    path.write_text(json.dumps({"videos": videos}))
    return path


def test_run_generates_each_video_with_its_schedule_then_eval_scores_them(
    mesh: Mesh, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    annotations = write_annotations(tmp_path / "annotations.json")
    out = tmp_path / "videos"
    args = ["lvbench", "run", "--annotations", str(annotations), "--server", mesh.address, "--out", str(out)]
    assert main([*args, "--api-key", KEY, "--seed", "3", "--quiet"]) == 1  # one video failed, the others went on
    printed = capsys.readouterr().out
    assert "too_long: failed: INVALID_ARGUMENT: spec.num_blocks" in printed and "2 of 3 videos" in printed

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["timing"] == {"fps": 16.0, "first_block_frames": 3, "frames_per_block": 3}
    runs = {r["video_id"]: r for r in manifest["videos"]}
    assert [runs[v]["status"] for v in ("ball", "too_long", "city")] == ["ok", "failed", "ok"]
    ball, city = runs["ball"], runs["city"]
    assert (ball["num_blocks"], ball["frames"], city["num_blocks"], city["frames"]) == (15, 45, 19, 57)
    assert [(p["at_block"], p["text"]) for p in ball["prompts"]] == [
        (0, "a red ball bouncing"),
        (5, "the ball turns green"),  # 1 s = frame 16, nearest the start of block 5 (frame 15)
        (11, "the ball turns blue"),  # 2 s = frame 32, nearest block 11 (frame 33)
    ]
    assert [p["at_block"] for p in city["prompts"]] == [0, 8]  # 1.5 s = frame 24: block 8 starts there
    assert ball["blocks_match_plan"] and city["blocks_match_plan"]
    assert ball["first_block_s"] > 0 and ball["wall_s"] >= ball["first_block_s"] and ball["mean_block_ms"] > 0
    assert sorted(p.name for p in out.glob("*.mp4")) == ["ball.mp4", "city.mp4"]

    assert main([*args, "--api-key", KEY, "--skip-existing", "--quiet"]) == 1  # too_long is tried again
    rerun = {r["video_id"]: r for r in json.loads((out / "manifest.json").read_text())["videos"]}
    assert [rerun[v]["status"] for v in ("ball", "too_long", "city")] == ["skipped", "failed", "skipped"]
    assert rerun["ball"]["session_id"] == ball["session_id"] and rerun["ball"]["frames"] == 45  # kept
    capsys.readouterr()

    assert main(["lvbench", "eval", "--videos", str(out), "--chunks", "4", "--quiet"]) == 0
    results = json.loads((out / "lvbench-eval" / "results.json").read_text())
    assert [(v["video"], v["frames"], v["width"], v["height"]) for v in results["videos"]] == [
        ("ball.mp4", 45, 64, 64),
        ("city.mp4", 57, 64, 64),
    ]
    for video in results["videos"]:
        for metric in video["metrics"].values():
            assert not metric["errors"] and len(metric["chunk_scores"]) == 4 and metric["vde_linear"] >= 0
    assert all(s["videos_scored"] == 2 for s in results["summary"].values())
    assert (out / "lvbench-eval" / "report.html").is_file()


def test_run_dry_run_prints_the_schedules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    annotations = write_annotations(tmp_path / "annotations.json")
    args = ["lvbench", "run", "--annotations", str(annotations), "--out", str(tmp_path / "v"), "--dry-run"]
    assert main([*args, "--split", "eval"]) == 0
    printed = capsys.readouterr().out
    assert printed.count(" s -> ") == 1  # 20% of 3 videos rounds to 1
    assert main([*args, "--fps", "8"]) == 0  # overrides the preset: 2.8 s is 22.4 frames -> 8 blocks of 3
    assert "ball: 2.8 s -> 8 blocks, 24 frames" in capsys.readouterr().out
    assert not (tmp_path / "v").exists()


def test_run_without_a_scheduler_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    annotations = write_annotations(tmp_path / "annotations.json")
    args = ["lvbench", "run", "--annotations", str(annotations), "--out", str(tmp_path / "v"), "--quiet"]
    assert main([*args, "--server", "127.0.0.1:1", "--timeout", "5", "--retry-s", "0"]) == 2
    assert "no scheduler at 127.0.0.1:1" in capsys.readouterr().err
