"""Install as users do: build the wheel, install it (not editable) into a fresh venv, and run
`inferix generate` with both built-in trained models from a folder outside the checkout.

The venv sees the system's site-packages (`--system-site-packages`), so torch and the other
dependencies come from there and nothing is downloaded; the package itself comes only from the
wheel (`--no-deps --no-index`). The frames must be the checkout's bit for bit, so a wheel that
lacks a model's weights, its tokenizer or a preset fails here, as it would fail a user or an image.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from inferix_cli.main import main

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "a red ball bouncing to the right"
BLOCKS = 2  # the first block and one that attends to it: a few seconds per model
# toyworld-play steered by the arrow keys from block 1, so the action path runs too.
TRACK = '[{"block": 1, "keys": ["ArrowRight"]}]'


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    elsewhere: Path  # a folder outside the checkout, the runs' working directory

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def inferix(self) -> Path:
        return self.venv / "bin" / "inferix"


def _run(command: list[str | Path], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    # PYTHONPATH would put other folders (the checkout) on the venv's sys.path: a user has none.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    result = subprocess.run(
        [str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, f"{command} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result


def _source_files() -> list[str]:
    """What a clone of the checkout holds (tracked, or new and not ignored) of what the wheel is built from."""
    includes = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    folders = sorted({pattern.rstrip("*") for pattern in includes["include"]})
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", *folders],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return ["pyproject.toml", "README.md"] + [path for path in listed.split("\0") if path and (ROOT / path).is_file()]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    work = tmp_path_factory.mktemp("wheel")
    # Built from a copy: a build in the checkout writes build/ and *.egg-info there, and files that a
    # clone would not have (untracked outputs) must not reach the wheel.
    source = work / "source"
    for path in _source_files():
        (source / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, source / path)
    dist = work / "dist"
    # No build isolation: the build backend (setuptools) is the one installed, so no network is needed.
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", source, "-w", dist], work)
    (wheel,) = dist.glob("inferix-*.whl")
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", venv], work)
    _run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel], work)
    elsewhere = work / "elsewhere"
    elsewhere.mkdir()
    return Installed(wheel, venv, elsewhere)


def test_the_wheel_carries_every_data_file_of_the_packages(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    # Module sources, tests data and docs aside: what the packages read at run time (weights, tokenizers,
    # presets, the viewer page) and the gRPC stubs' type stubs.
    data = [path for path in _source_files()[2:] if not path.endswith((".py", ".md"))]
    assert data, "no data files found: the package folders moved?"
    assert [path for path in data if path not in names] == []


def test_the_installed_package_is_the_wheel_not_the_checkout(installed: Installed) -> None:
    probe = "import sys, inferix, workers; print(inferix.__file__); print(workers.__file__); print(sys.path)"
    result = _run([installed.python, "-c", probe], installed.elsewhere)
    inferix_file, workers_file, path = result.stdout.splitlines()
    site = str(installed.venv)
    assert inferix_file.startswith(site) and workers_file.startswith(site), result.stdout
    assert str(ROOT) not in path, path


@pytest.mark.parametrize(
    ("model", "extra"),
    [("toyworld", []), ("toyworld-play", ["--actions", "track.json"])],
)
def test_inferix_generate_runs_from_the_wheel_like_the_checkout(
    installed: Installed, model: str, extra: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (installed.elsewhere / "track.json").write_text(TRACK)
    args = ["generate", "--model", model, "--prompt", PROMPT, "--blocks", str(BLOCKS), "--seed", "5"]
    args += ["--threads", "1", "--quiet", *extra]
    result = _run([installed.inferix, *args, "--out", f"{model}.mp4"], installed.elsewhere)
    assert (installed.elsewhere / f"{model}.mp4").stat().st_size > 0
    assert f"model {model}" in result.stdout, result.stdout

    # The same run from the checkout, in this process: the frames must be the same bits.
    checkout_args = [str(installed.elsewhere / a) if a == "track.json" else a for a in args]
    assert main([*checkout_args, "--out", str(tmp_path / "checkout.mp4")]) == 0
    expected = re.search(r"frames sha256 ([0-9a-f]{64})", capsys.readouterr().out)
    got = re.search(r"frames sha256 ([0-9a-f]{64})", result.stdout)
    assert expected and got, result.stdout
    assert got.group(1) == expected.group(1)
