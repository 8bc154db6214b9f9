"""Choosing the clock: CUDA events only where CUDA work can exist."""

from __future__ import annotations

import sys

import pytest
import torch

from inferix.errors import UserError
from inferix.profiling.clock import select_clock


def test_auto_uses_cuda_events_exactly_when_cuda_is_available() -> None:
    assert select_clock("auto").kind == ("cuda" if torch.cuda.is_available() else "cpu")
    assert select_clock("cpu").kind == "cpu"


def test_auto_does_not_import_torch_for_a_process_that_never_did(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch")
    assert select_clock("auto").kind == "cpu"
    assert "torch" not in sys.modules


def test_bad_devices_are_user_errors() -> None:
    with pytest.raises(UserError, match="'auto', 'cpu' or 'cuda'"):
        select_clock("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="needs a CUDA GPU"):
            select_clock("cuda")


def test_cpu_clock_counts_from_its_start() -> None:
    clock = select_clock("cpu")
    clock.start()
    first, second = clock.stamp(), clock.stamp()
    assert 0.0 <= clock.seconds(first) <= clock.seconds(second) < 1.0
    assert clock.seconds(clock.origin) == 0.0 and clock.is_ready(first)
