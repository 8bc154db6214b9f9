"""Golden-vector verification: run a reference case folder through our engine and compare.

A case folder (see tests/golden/README.md) holds `config.json` plus safetensors files produced
by the reference code on tiny random models. `find_cases` accepts a case folder or a folder of
case folders; `verify_case` returns one `Comparison` per compared tensor.

The reference ran in fp32 on the CPU, the default here. A case may run on another device and in
another weight dtype (`WanCase(..., device="cuda", dtype=torch.bfloat16)`): its tensors are
loaded there and the networks built there, so the same checks measure a CUDA or bf16 engine.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import Tensor

from inferix.errors import UserError


@dataclass(frozen=True)
class Comparison:
    case: str
    name: str
    max_abs_diff: float
    tolerance: float
    error: str | None = None  # why the check could not run (it then counts as failed)

    @property
    def passed(self) -> bool:
        return self.error is None and self.max_abs_diff <= self.tolerance


def run_checks(case_name: str, checks: Iterable[tuple[str, Callable[[], Iterable[Comparison]]]]) -> list[Comparison]:
    """Every check's comparisons; a check that raises is one failed comparison carrying the reason,
    and the checks after it still run (a verdict per check, never a traceback)."""
    results: list[Comparison] = []
    for name, check in checks:
        try:
            results.extend(check())
        except Exception as exc:  # noqa: BLE001 - any failure of a check is that check's verdict
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())  # one line, as the verdict is printed
            results.append(Comparison(case_name, f"{name} (could not run)", float("inf"), 0.0, error=reason))
    return results


class GoldenCase:
    """One golden case folder of any family or decoder: its config.json and safetensors files, each
    read once, onto the case's device. `dtype` is the weight dtype the checks build networks in."""

    def __init__(self, folder: Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> None:
        self.folder = folder
        self.name = folder.name
        self.device = torch.device(device)
        self.dtype = dtype  # of the networks' weights; inputs and references stay as stored
        try:
            self.config: dict[str, Any] = json.loads((folder / "config.json").read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise UserError(f"{folder / 'config.json'}: cannot read the golden config ({exc})") from exc
        self._files: dict[str, dict[str, Tensor]] = {}

    def tensors(self, stem: str) -> dict[str, Tensor]:
        if stem not in self._files:
            path = self.folder / f"{stem}.safetensors"
            if not path.is_file():
                raise UserError(f"{path}: missing golden file (expected next to config.json)")
            self._files[stem] = load_file(str(path), device=str(self.device))
        return self._files[stem]

    def has(self, stem: str) -> bool:
        return (self.folder / f"{stem}.safetensors").is_file()


def find_cases(root: Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> list[GoldenCase]:
    """The case folders at `root`: itself if it has a config.json, else its sub-folders that do."""
    if not root.is_dir():
        raise UserError(f"{root}: not a directory; pass a golden case folder or a folder of them")
    if (root / "config.json").is_file():
        return [GoldenCase(root, device, dtype)]
    cases = [GoldenCase(p, device, dtype) for p in sorted(root.iterdir()) if (p / "config.json").is_file()]
    if not cases:
        raise UserError(f"{root}: no golden case found (a case is a folder with config.json)")
    return cases


def max_abs_diff(a: Tensor, b: Tensor) -> float:
    """Max abs difference in float64 (inf when the shapes differ: a failed comparison, not an error)."""
    if a.shape != b.shape:
        return float("inf")
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def _diff(a: Tensor, b: Tensor) -> float:
    if a.shape != b.shape:
        raise AssertionError(f"shape mismatch: ours {list(a.shape)} vs golden {list(b.shape)}")
    if a.numel() == 0:
        return 0.0
    # Some of ours are computed on the CPU whatever the device (the schedule); compare there then.
    return float((a.double() - b.to(a.device).double()).abs().max())
