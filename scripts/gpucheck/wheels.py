"""The wheels gpu-check carries to a GPU machine without network: what is missing, what fits."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

from gpucheck.harness import REPO, TRAVEL_MAX_MIB, WHEELS


# ---- wheels (make gpu-wheels, gpu-check.sh) -----------------------------------------------------
def missing_wheels() -> list[str]:
    """The pinned requirements whose module this Python cannot import (what gpu-check.sh installs)."""
    return [requirement for requirement, module in WHEELS.items() if not _importable(module)]


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a dotted name whose parent package is missing
        return False


def check_wheels(folder: Path, max_mib: float) -> int:
    """Every pinned wheel is in `folder`, within `max_mib`, and with the working tree within what travels."""

    def normal(name: str) -> str:
        return re.sub(r"[-_.]+", "_", name).lower()

    wheels = sorted(folder.glob("*.whl"))
    missing = [
        r for r in WHEELS if not any(normal(w.name).startswith(normal(r.replace("==", "-")) + "_") for w in wheels)
    ]
    total = sum(w.stat().st_size for w in wheels) / 2**20
    for wheel in wheels:
        print(f"{wheel.stat().st_size / 2**20:8.2f} MiB  {wheel.name}")
    print(f"{total:8.2f} MiB  in {folder} (limit {max_mib:g} MiB)")
    tree = working_tree_mib()
    if tree is not None:
        print(f"{tree:8.2f} MiB  the working tree that travels with it (limit {TRAVEL_MAX_MIB:g} MiB together)")
    problems = []
    if missing:
        problems.append(f"no wheel in {folder} for {', '.join(missing)}")
    if total > max_mib:
        problems.append(f"{folder} holds {total:.1f} MiB, over the {max_mib:g} MiB limit")
    if tree is not None and tree + total > TRAVEL_MAX_MIB:
        problems.append(f"with the working tree ({tree:.1f} MiB) that is over the {TRAVEL_MAX_MIB:g} MiB that travel")
    for problem in problems:
        print(f"gpu-wheels: {problem}", file=sys.stderr)
    if problems and not missing:
        print("gpu-wheels: drop or re-pin a wheel in WHEELS (scripts/gpu_check.py)", file=sys.stderr)
    return 1 if problems else 0


def working_tree_mib() -> float | None:
    """Size of what the device tool sends: tracked and untracked-not-ignored files (None without git)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    files = (REPO / name for name in listed.decode().split("\0") if name)
    return sum(f.stat().st_size for f in files if f.is_file()) / 2**20
