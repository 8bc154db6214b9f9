"""Shared test fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

# One real redis-server for the whole run (fixture `redis_server`), shared by every test folder.
pytest_plugins = ["tests.store.redis_server"]

GOLDEN_DIR = Path(__file__).parent / "golden"
# Wan-family cases (Self Forcing, CausVid) keep their outputs in outputs.safetensors; MAGI-1's are staged;
# Matrix-Game 2.0's also have outputs.safetensors but their own stages (tests/engine/matrixgame).
MATRIXGAME_CASES = sorted(p.name for p in GOLDEN_DIR.iterdir() if p.name.startswith("matrixgame"))
# TAEHV decoder cases (taew2_1_tiny, ...) hold only a decoder's vectors (tests/engine/decoders).
TAEHV_CASES = sorted(p.name for p in GOLDEN_DIR.iterdir() if p.name.startswith("tae"))
GOLDEN_CASES = sorted(
    p.name
    for p in GOLDEN_DIR.iterdir()
    if (p / "outputs.safetensors").is_file() and p.name not in MATRIXGAME_CASES and p.name not in TAEHV_CASES
)
MAGI_CASES = sorted(p.name for p in GOLDEN_DIR.iterdir() if p.name.startswith("magi1_"))


# The test tiers (README "Testing"). A test that is more than quick in-process logic carries the marker
# of why (pyproject.toml registers them: process, external, multirank, slow); `make test-fast` runs
# every test with none of them, `make test` runs everything.
# Marked here, centrally, so that a new test is marked by where it lives and what it uses: every test of
# a folder whose tests all run real processes, and every test that uses a fixture that starts one. A
# file elsewhere whose own code starts processes says so with a module-level `pytestmark`.
FOLDER_MARKS: dict[str, tuple[str, ...]] = {
    "mesh": ("process",),  # every test runs a whole mesh of real processes
    "tls": ("process",),  # a mesh, a scheduler and the viewer over TLS, as processes
    "packaging": ("process",),  # builds the wheel, installs it into a venv and runs the installed CLI
}
FIXTURE_MARKS: dict[str, tuple[str, ...]] = {
    "redis_server": ("external",),  # tests/store/redis_server.py: a real redis-server
    "mesh": ("process",),
    "tls_mesh": ("process",),
    "tls_scheduler": ("process",),
    "streamer": ("process",),  # tests/streamer: a `python -m streamer` process
    "start_kvcache": ("process",),  # tests/kvcache_svc: `python -m kvcache_svc` processes
    "render": ("external",),  # tests/deploy: `helm template`
}
# Fixtures parametrized over the store backends: their "redis" case asks for `redis_server` at run time.
REDIS_PARAMS = ("backend", "store_url")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = Path(__file__).parent
    for item in items:
        marks: set[str] = set()
        folder = item.path.relative_to(tests).parts[0] if item.path.is_relative_to(tests) else ""
        marks.update(FOLDER_MARKS.get(folder, ()))
        for fixture in getattr(item, "fixturenames", ()):  # the fixtures it uses, directly or through others
            marks.update(FIXTURE_MARKS.get(fixture, ()))
        params = getattr(item, "callspec", None)
        if params is not None and any(params.params.get(name) == "redis" for name in REDIS_PARAMS):
            marks.add("external")
        for mark in sorted(marks):
            if item.get_closest_marker(mark) is None:
                item.add_marker(mark)


@pytest.fixture(autouse=True)
def _single_thread() -> None:
    # The golden vectors were made with one thread; it also keeps the suite steady on 2 cores.
    torch.set_num_threads(1)
