"""`inferix generate`: a real MP4 read back by ffprobe, prompt schedules, one-line user errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from inferix.cli.main import main
from tests.streamer.media import ffprobe


def inferix(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inferix", *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_generate_writes_an_mp4_with_a_prompt_schedule(tmp_path: Path) -> None:
    out = tmp_path / "ball.mp4"
    result = inferix(
        "generate",
        "--prompt",
        "a red ball bouncing to the right",
        "--prompt-at",
        '2:"the ball turns green"',
        "--blocks",
        "3",
        "--seed",
        "3",
        "--out",
        str(out),
        "--quiet",
        "--threads",
        "1",
    )
    assert result.returncode == 0, result.stderr
    stream = ffprobe(out)
    # the default toyworld model: 3 video frames per block, 64x64 at 16 fps
    expected = {"codec_name": "h264", "width": "64", "height": "64", "r_frame_rate": "16/1", "nb_read_frames": "9"}
    assert {key: stream[key] for key in expected} == expected
    assert "time to first block" in result.stdout and "9 frames" in result.stdout and "model toyworld" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--blocks", "0"], "--blocks must be at least 1"),
        (["--prompt", "   "], "prompts[0].text: the prompt is empty"),
        (["--width", "100", "--height", "64"], "resolution 100x64 must be positive multiples of 16"),
        (["--model", "/does/not/exist"], "/does/not/exist"),
        (["--prompt-at", "nonsense"], '--prompt-at must look like 4:"the ball turns green"'),
        (["--prompt-at", '9:"later"'], "past the last block"),
        (["--out", "video.avi"], "--out must end in .mp4"),
        (["--cuda-graphs"], "--cuda-graphs needs the model on a CUDA device (--device cuda)"),
        (["--cuda-graphs", "--compile"], "--cuda-graphs: Wan-family models without --compile"),
    ],
)
def test_user_errors_are_one_line(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["generate", "--prompt", "a ball", "--blocks", "2", "--out", str(tmp_path / "v.mp4"), "--quiet"]
    assert main(base + args) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "v.mp4").exists()


def test_truncated_checkpoint_is_one_line_without_traceback(tmp_path: Path) -> None:
    golden = Path(__file__).parents[1] / "golden" / "selfforcing_tiny_global" / "dit_checkpoint.pt"
    folder = tmp_path / "model"
    folder.mkdir()
    data = golden.read_bytes()
    (folder / "self_forcing_dmd.pt").write_bytes(data[: len(data) // 2])
    result = inferix("generate", "--model", str(folder), "--prompt", "x", "--out", str(tmp_path / "v.mp4"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and str(folder) in lines[0], result.stderr
