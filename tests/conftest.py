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
GOLDEN_CASES = sorted(
    p.name for p in GOLDEN_DIR.iterdir() if (p / "outputs.safetensors").is_file() and p.name not in MATRIXGAME_CASES
)
MAGI_CASES = sorted(p.name for p in GOLDEN_DIR.iterdir() if p.name.startswith("magi1_"))


@pytest.fixture(autouse=True)
def _single_thread() -> None:
    # The golden vectors were made with one thread; it also keeps the suite steady on 2 cores.
    torch.set_num_threads(1)
