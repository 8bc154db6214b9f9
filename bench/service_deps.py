"""Each service's dependency footprint and start-up cost, measured without Docker.

For each role (scheduler, kvcache_svc, streamer, worker) a fresh interpreter imports every module of
the service's package -- what its process can load: `python -m scheduler` imports its service
module lazily, inside main(), so importing `scheduler.__main__` alone would miss most of it -- plus
the ground-layer modules the service loads only on some paths (the Redis store, the HTML profile
report). The modules that import loaded are mapped, by the file each was loaded from, to the
installed distribution that owns that file (importlib.metadata: a namespace package such as
`google` or `opentelemetry` is shared by several distributions, so its top-level name alone does
not say which ones are in use). Printed per role: whether torch is loaded, those distributions and
their installed size (the sum of each distribution's files, `dist.files` resolved with
`dist.locate_file`), and what the role's image installs: the transitive closure, over this
environment's installed metadata, of pyproject's base dependencies plus the role's extra.

The project itself is not counted, and neither is what the interpreter loads before the import
(`site` and .pth hooks). `--root` measures another checkout, e.g. a `git worktree` of an older
commit, with its packages first on the path.

    python bench/service_deps.py                     # the four roles of this checkout
    python bench/service_deps.py --root /tmp/before  # ... of another checkout
    python bench/service_deps.py --roles scheduler --startup --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "inferix"
MIB = 1024 * 1024


@dataclass(frozen=True)
class Role:
    name: str
    package: str  # every module of it is imported
    extra: str  # the pyproject extra the role's image installs
    lazy: tuple[str, ...] = ()  # modules loaded only on some paths, that the image must still carry


ROLES = (
    Role("scheduler", "scheduler", "scheduler", ("inferix.store.redis_store",)),
    Role("kvcache_svc", "kvcache_svc", "kvcache", ("inferix.store.redis_store",)),
    Role("streamer", "streamer", "streamer"),
    Role("worker", "workers", "worker", ("inferix.profiling.html",)),
)

# Run in the child interpreter: argv[1] = "report" or "startup", argv[2] = package, argv[3:] = lazy
# modules. "report" prints the modules the imports added, with their files, as JSON; "startup"
# imports the package alone (what the service loads before it serves) and prints nothing.
_CHILD = """
import importlib, json, pkgutil, sys
mode, package, lazy = sys.argv[1], sys.argv[2], sys.argv[3:]
before = set(sys.modules)
root = importlib.import_module(package)
def fail(name):
    raise ImportError(f"cannot import {name}")
for info in pkgutil.walk_packages(root.__path__, package + ".", onerror=fail):
    importlib.import_module(info.name)
if mode == "report":
    for name in lazy:
        importlib.import_module(name)
    added = {
        name: getattr(module, "__file__", None)
        for name, module in list(sys.modules.items())
        if name not in before
    }
    print(json.dumps({"torch": "torch" in sys.modules, "modules": added}))
"""


@dataclass(frozen=True)
class Usage:
    torch: bool
    loaded: tuple[str, ...]  # distributions whose files the imports loaded
    unowned: tuple[str, ...]  # third-party top-level modules no installed distribution owns


@dataclass(frozen=True)
class Closure:
    declared: bool  # False: pyproject has no such extra, the image installs the base only
    dists: tuple[str, ...]
    missing: tuple[str, ...]  # required but not installed here: their size is unknown


@dataclass(frozen=True)
class Startup:
    seconds: float
    peak_rss_mib: float


class Environment:
    """The installed distributions of this interpreter: who owns which file, and their sizes."""

    def __init__(self) -> None:
        self.dists: dict[str, metadata.Distribution] = {}
        for dist in metadata.distributions():
            # The first one found wins, as importlib.metadata.distribution(name) resolves it.
            self.dists.setdefault(canonicalize_name(dist.metadata["Name"]), dist)
        self._owner: dict[str, str] | None = None
        self._sizes: dict[str, int] = {}

    def _files(self, name: str) -> list[str]:
        dist = self.dists[name]
        # One realpath per distribution, not per file: the index is built over every installed file.
        base = os.path.realpath(str(dist.locate_file("")))
        return [os.path.normpath(os.path.join(base, str(file))) for file in dist.files or ()]

    def owner(self, path: str) -> str | None:
        if self._owner is None:
            self._owner = {file: name for name in self.dists for file in self._files(name)}
        return self._owner.get(os.path.realpath(path))

    def size(self, name: str) -> int:
        if name not in self._sizes:
            self._sizes[name] = sum(os.path.getsize(file) for file in self._files(name) if os.path.isfile(file))
        return self._sizes[name]

    def mib(self, names: Iterable[str]) -> float:
        return sum(self.size(name) for name in names) / MIB


def _child_command(role: Role, mode: str) -> list[str]:
    return [sys.executable, "-c", _CHILD, mode, role.package, *role.lazy]


def _child_env(root: Path) -> dict[str, str]:
    # The measured checkout's packages first, ahead of an editable install of another checkout.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    return env


def measure_usage(role: Role, root: Path, env: Environment) -> Usage:
    result = subprocess.run(
        _child_command(role, "report"), cwd=root, env=_child_env(root), capture_output=True, text=True
    )
    if result.returncode != 0:
        raise SystemExit(f"{role.name}: importing {role.package} failed:\n{result.stderr}")
    report = json.loads(result.stdout)
    stdlib = set(sys.stdlib_module_names)
    project_root = os.path.realpath(root) + os.sep
    loaded: set[str] = set()
    unowned: set[str] = set()
    for name, file in report["modules"].items():
        top = name.partition(".")[0]
        if file is None or top in stdlib or os.path.realpath(file).startswith(project_root):
            continue  # built-in, standard library, or the project's own source
        owner = env.owner(file)
        if owner is None:
            unowned.add(top)
        elif owner != PROJECT:
            loaded.add(owner)
    return Usage(report["torch"], tuple(sorted(loaded)), tuple(sorted(unowned)))


def _declared(root: Path, extra: str) -> tuple[list[Requirement], bool]:
    """pyproject's base dependencies plus `extra` (its `inferix[...]` references expanded)."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    extras: dict[str, list[str]] = project.get("optional-dependencies", {})
    requirements = [Requirement(spec) for spec in project.get("dependencies", [])]
    pending, seen = [extra], set()
    while pending:
        name = pending.pop()
        if name in seen or name not in extras:
            continue
        seen.add(name)
        for spec in extras[name]:
            requirement = Requirement(spec)
            if canonicalize_name(requirement.name) == PROJECT:
                pending.extend(requirement.extras)
            else:
                requirements.append(requirement)
    return requirements, extra in extras


def closure(root: Path, extra: str, env: Environment) -> Closure:
    """The distributions `pip install .[extra]` brings, resolved over what is installed here."""
    requirements, is_declared = _declared(root, extra)
    found: set[str] = set()
    missing: set[str] = set()
    # (name, extras) pairs: the same distribution asked for with other extras brings more.
    visited: set[tuple[str, frozenset[str]]] = set()
    pending = [(requirement, frozenset(requirement.extras)) for requirement in requirements]
    while pending:
        requirement, wanted = pending.pop()
        name = canonicalize_name(requirement.name)
        dist = env.dists.get(name)
        if dist is None:
            missing.add(name)
            continue
        if (name, wanted) in visited:
            continue
        visited.add((name, wanted))
        found.add(name)
        for spec in dist.requires or ():
            dependency = Requirement(spec)
            # A dependency whose marker names an extra comes only with that extra; "" stands for none.
            if dependency.marker is None or any(dependency.marker.evaluate({"extra": e}) for e in {"", *wanted}):
                pending.append((dependency, frozenset(dependency.extras)))
    return Closure(is_declared, tuple(sorted(found)), tuple(sorted(missing)))


def measure_startup(role: Role, root: Path, runs: int) -> Startup:
    """Best of `runs`: wall time and peak RSS of a fresh interpreter importing the service."""
    times, peaks = [], []
    for _ in range(runs):
        start = time.perf_counter()
        process = subprocess.Popen(_child_command(role, "startup"), cwd=root, env=_child_env(root))
        # wait4, not RUSAGE_CHILDREN: the latter is the maximum over every child waited for so far.
        _, status, usage = os.wait4(process.pid, 0)
        times.append(time.perf_counter() - start)
        process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode != 0:
            raise SystemExit(f"{role.name}: start-up import exited with {process.returncode}")
        peaks.append(usage.ru_maxrss / 1024)  # KiB on Linux
    return Startup(min(times), min(peaks))


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout to measure (default: this one)")
    parser.add_argument(
        "--roles", nargs="+", choices=[role.name for role in ROLES], default=[role.name for role in ROLES]
    )
    parser.add_argument("--no-extras", action="store_true", help="skip the closure of each role's declared extra")
    parser.add_argument("--startup", action="store_true", help="also time each role's start-up import")
    parser.add_argument("--runs", type=int, default=3, help="start-up runs per role; the best is reported")
    args = parser.parse_args(argv)
    root: Path = args.root.resolve()
    roles = [role for role in ROLES if role.name in args.roles]
    env = Environment()

    usages = {role.name: measure_usage(role, root, env) for role in roles}
    closures = {} if args.no_extras else {role.name: closure(root, role.extra, env) for role in roles}
    print(f"checkout: {root}\n")
    header = "| role | torch loaded | distributions loaded | MiB loaded |"
    rule = "|---|---|---|---|"
    if closures:
        header += " extra | torch in extra | distributions in extra | MiB of extra |"
        rule += "---|---|---|---|"
    print(header)
    print(rule)
    for role in roles:
        usage = usages[role.name]
        row = f"| {role.name} | {_yes(usage.torch)} | {len(usage.loaded)} | {env.mib(usage.loaded):.1f} |"
        if closures:
            extra = closures[role.name]
            label = role.extra if extra.declared else f"{role.extra} (undeclared: base only)"
            row += f" {label} | {_yes('torch' in extra.dists)} | {len(extra.dists)} | {env.mib(extra.dists):.1f} |"
        print(row)
    for role in roles:
        usage = usages[role.name]
        print(f"\n{role.name} loads: {', '.join(usage.loaded)}")
        if usage.unowned:
            print(f"{role.name} loads modules no installed distribution owns: {', '.join(usage.unowned)}")
        if closures:
            extra = closures[role.name]
            print(f"{role.name} installs: {', '.join(extra.dists)}")
            # Either an optional import that found the package installed here (grpc tries grpc_tools,
            # redis tries cryptography), or a dependency the extra forgot: worth a look either way.
            undeclared = sorted(set(usage.loaded) - set(extra.dists))
            if undeclared:
                print(f"{role.name} loads, not in its extra: {', '.join(undeclared)}")
            if extra.missing:
                print(f"{role.name} requires, not installed here (size unknown): {', '.join(extra.missing)}")

    if args.startup:
        print(f"\n| role | start-up s (best of {args.runs}) | peak RSS MiB (best of {args.runs}) |")
        print("|---|---|---|")
        for role in roles:
            startup = measure_startup(role, root, args.runs)
            print(f"| {role.name} | {startup.seconds:.2f} | {startup.peak_rss_mib:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
