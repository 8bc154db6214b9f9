"""The layers hold: import-linter's contracts are kept, and the control plane runs without torch.

The torch check watches real processes: a mesh whose services log every module they import
(`PYTHONPROFILEIMPORTTIME`), through start-up and a whole session, and `inferix session` commands
run the same way. An import that happens only on a request path is caught too.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferix.client import BlockDone, Client
from inferix_cli.mesh import Mesh, start_mesh
from tests.mesh.conftest import KEY_A, mesh_config

ROOT = Path(__file__).parents[1]
IMPORTS_LOGGED = {"PYTHONPROFILEIMPORTTIME": "1"}
TORCH_IMPORT = re.compile(r"^import time:.*\|\s+torch(\.|$)", re.MULTILINE)


def imported_modules(log: str) -> set[str]:
    return {line.rsplit("|", 1)[1].strip() for line in log.splitlines() if line.startswith("import time:")}


def test_import_contracts_are_kept() -> None:
    lint = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    result = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 4 kept, 0 broken." in result.stdout, result.stdout


# A family's engine, session or loaded-model class: only the registry and the family's own folder
# may test for one; every other caller goes through the contract (engine/contract.py).
FAMILY_CLASS = re.compile(
    r"isinstance\([^)]*\b(Wan|Magi|MatrixGame)(Engine|Session|Model)\b|isinstance\([^)]*\bLoadedModel\b"
)


def test_no_caller_branches_on_a_family_class() -> None:
    allowed = {ROOT / "engine" / "registry.py", ROOT / "engine" / "families"}
    found = []
    for folder in ("inferix", "inferix_cli", "engine", "workers", "scheduler", "streamer", "kvcache_svc", "bench",
                   "scripts", "lvbench", "toyworld_lab"):  # fmt: skip
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path in allowed or any(parent in allowed for parent in path.parents):
                continue
            text = path.read_text()
            found += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in FAMILY_CLASS.finditer(text)]
    assert not found, "\n".join(found)
    # the pattern itself finds what it is meant to
    assert FAMILY_CLASS.search("isinstance(engine, MatrixGameEngine)") and FAMILY_CLASS.search(
        "isinstance(m, LoadedModel)"
    )


@pytest.fixture(scope="module")
def logged_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    running = start_mesh(mesh_config(tmp_path_factory.mktemp("imports-mesh"), workers=1, env=IMPORTS_LOGGED))
    yield running
    running.stop()


def test_scheduler_kvcache_and_streamer_run_a_session_without_torch(logged_mesh: Mesh) -> None:
    with Client(logged_mesh.address, api_key=KEY_A, timeout=60) as client:
        info = client.create_session("a red ball", num_blocks=2)
        assert [e.block_index for e in client.events(info.session_id) if isinstance(e, BlockDone)] == [0, 1]
    logs = {
        name: (logged_mesh.config.workdir / f"{name}.log").read_text() for name in ("scheduler", "kvcache", "streamer")
    }
    worker_log = (logged_mesh.config.workdir / "worker0.log").read_text()
    assert "torch" in imported_modules(worker_log)  # the check sees imports: the worker does load torch
    for name, log in logs.items():
        assert "grpc" in imported_modules(log), f"{name}: no import log"
        assert not TORCH_IMPORT.search(log), f"{name} imported torch"


def test_inferix_session_commands_run_without_torch(logged_mesh: Mesh) -> None:
    base = [sys.executable, "-m", "inferix_cli", "session", "--server", logged_mesh.address, "--api-key", KEY_A]
    env = {**IMPORTS_LOGGED, "PATH": "/usr/bin:/bin"}
    created = subprocess.run(
        [*base, "create", "--prompt", "a red ball", "--prompt-at", '1:"a green ball"', "--blocks", "2"],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr[-2000:]
    session_id = created.stdout.strip()
    watched = subprocess.run([*base, "watch", session_id], capture_output=True, text=True, timeout=120, env=env)
    assert watched.returncode == 0 and "block" in watched.stdout, watched.stderr[-2000:]
    assert "inferix.spec.schedule" in imported_modules(created.stderr)  # the check sees the CLI's imports
    for run in (created, watched):
        assert not TORCH_IMPORT.search(run.stderr), "inferix session imported torch"


def test_no_script_shadows_a_package() -> None:
    # `python bench/X.py` puts bench/ first on sys.path: a bench/engine.py would be imported as `engine`.
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert {"engine", "inferix", "workers"} <= packages
    shadows = [
        f"{folder}/{script.name}"
        for folder in ("bench", "scripts")
        for script in (ROOT / folder).glob("*.py")
        if script.stem in packages
    ]
    assert not shadows, f"rename these scripts: they shadow a package when run: {shadows}"
