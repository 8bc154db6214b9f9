"""The public API definition: stubs in sync with proto/, buf lint clean."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_generated_stubs_match_the_protos() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/gen_proto.py", "--check"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr + result.stdout


def test_buf_lint_is_clean() -> None:
    buf = ROOT / ".tools" / "node_modules" / ".bin" / "buf"
    if not buf.exists():
        npm = shutil.which("npm")
        assert npm, "npm is needed to install buf (apt-get install -y npm, or `make install`)"
        subprocess.run(
            [npm, "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(ROOT / ".tools"), "@bufbuild/buf"],
            check=True,
            timeout=300,
        )
    result = subprocess.run([str(buf), "lint"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
