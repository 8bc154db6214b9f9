"""`inferix generate`: a real MP4 read back by ffprobe, prompt schedules, one-line user errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inferix_cli.main import main
from tests.streamer.media import ffprobe


def inferix(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inferix_cli", *args], capture_output=True, text=True, timeout=300, check=False
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


# ---- Matrix-Game 2.0: --image and --actions ---------------------------------------------------------
WORLD_TRACK = [{"frame": 0, "keys": ["W"]}, {"block": 2, "keys": ["W", "A"], "mouse": [0, 0.05]}]


def _world_inputs(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A start image (PNG), a JSON track and the same track as CSV."""
    from PIL import Image

    image = tmp_path / "start.png"
    Image.fromarray((np.random.default_rng(0).random((120, 200, 3)) * 255).astype(np.uint8)).save(image)
    track = tmp_path / "track.json"
    track.write_text(json.dumps(WORLD_TRACK))
    table = tmp_path / "track.csv"
    table.write_text("frame,keys,pitch,yaw\n0,W,0,0\n21,W+A,0,0.05\n")  # block 2 starts at pixel frame 21
    return image, track, table


def _world(tmp_path: Path, *args: str) -> list[str]:
    return ["generate", "--model", "matrixgame2-tiny", "--blocks", "3", "--seed", "1", "--quiet", *args]


def _sha(out: str) -> str:
    return next(line.split()[-1] for line in out.splitlines() if line.startswith("frames sha256"))


def test_generate_a_matrixgame_world_from_an_image_and_a_track(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image, track, table = _world_inputs(tmp_path)
    out = tmp_path / "world.mp4"
    assert main(_world(tmp_path, "--image", str(image), "--actions", str(track), "--out", str(out))) == 0
    printed = capsys.readouterr().out
    stream = ffprobe(out)
    # 3 blocks of 3 latent frames: 9 + 12 + 12 pixel frames at the tiny model's 48x32
    assert {k: stream[k] for k in ("width", "height", "nb_read_frames")} == {"width": "48", "height": "32",
                                                                            "nb_read_frames": "33"}  # fmt: skip
    assert "33 frames" in printed and "model matrixgame2-tiny" in printed
    assert main(_world(tmp_path, "--image", str(image), "--actions", str(table), "--out", str(tmp_path / "c.mp4"))) == 0
    assert _sha(capsys.readouterr().out) == _sha(printed)
    assert main(_world(tmp_path, "--image", str(image), "--out", str(tmp_path / "still.mp4"))) == 0
    assert _sha(capsys.readouterr().out) != _sha(printed)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "matrixgame2-tiny"], "matrixgame2-tiny is image-to-world: it needs a start image (--image)"),
        (["--model", "matrixgame2-tiny", "--image", "{image}", "--actions", "{bad}"], "entry 0: keys: unknown key 'Q'"),
        (["--model", "matrixgame2-tiny", "--image", "{image}", "--actions", "{order}"], "entry 1: frame: starts at"),
        (
            ["--model", "matrixgame2-tiny", "--image", "{image}", "--actions", "{range}"],
            "line 2: mouse yaw: 0.2",
        ),
        (["--model", "matrixgame2-tiny", "--image", "{missing}"], "cannot read the start image"),
        (["--model", "matrixgame2-tiny", "--prompt", "a ball"], "--prompt: Matrix-Game 2.0 takes no text"),
        (["--model", "matrixgame2-tiny", "--prompt-at", '1:"x"'], "--prompt-at: Matrix-Game 2.0 takes no text"),
        (["--model", "matrixgame2-tiny", "--compile"], "--compile: Matrix-Game 2.0 runs eagerly"),
        (["--model", "matrixgame2-tiny", "--cuda-graphs"], "--cuda-graphs: Matrix-Game 2.0 runs eagerly"),
        (["--model", "matrixgame2-tiny", "--quant", "int8"], "--quant int8: Matrix-Game 2.0 runs unquantized"),
        (["--model", "matrixgame2-tiny", "--kv-dtype", "fp8"], "--kv-dtype is not supported for Matrix-Game 2.0"),
        (["--prompt", "a ball", "--actions", "{track}"], "--actions: model toyworld takes no actions"),
        (
            ["--model", "toyworld-play", "--prompt", "a red ball steered by the arrow keys", "--actions", "{bad}"],
            "entry 0: keys: unknown key 'Q' (this model takes ArrowUp, ArrowDown, ArrowLeft, ArrowRight)",
        ),
        (["--model", "toyworld-play", "--prompt", "a ball", "--cuda-graphs"], "--cuda-graphs: toyworld-play (a DiT"),
        (["--model", "tiny", "--prompt", "a ball", "--image", "{image}"], "--image: model tiny takes no start image"),
        ([], "the following arguments are required: --prompt"),
    ],
)
def test_matrixgame_user_errors_are_one_line(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image, track, _ = _world_inputs(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"frame": 0, "keys": ["Q"]}]))
    order = tmp_path / "order.json"
    order.write_text(json.dumps([{"block": 1}, {"frame": 3}]))
    out_of_range = tmp_path / "range.csv"
    out_of_range.write_text("frame,keys,yaw\n0,W,0.2\n")
    paths = {"image": image, "track": track, "bad": bad, "order": order, "range": out_of_range,
             "missing": tmp_path / "missing.png"}  # fmt: skip
    base = ["generate", "--blocks", "2", "--out", str(tmp_path / "v.mp4"), "--quiet"]
    assert main(base + [a.format(**{k: str(v) for k, v in paths.items()}) for a in args]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "v.mp4").exists()
