"""docker/*.Dockerfile: hadolint-clean (the real hadolint), and the conventions the images rely on."""

from __future__ import annotations

import ast
import fnmatch
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.conftest import DOCKERFILES, HADOLINT, ROOT

SERVICE_IMAGES = {"scheduler", "kvcache-svc", "streamer", "worker-cuda", "worker-cpu"}
# The control plane runs without PyTorch; only the workers bring it (issue "layered architecture").
CONTROL_PLANE_IMAGES = ("scheduler", "kvcache-svc", "streamer")
WORKER_IMAGES = ("worker-cpu", "worker-cuda")
# The pyproject extra each image installs the project with.
IMAGE_EXTRAS = {"scheduler": "scheduler", "kvcache-svc": "kvcache", "streamer": "streamer"} | dict.fromkeys(
    WORKER_IMAGES, "worker"
)
FIRST_PARTY = frozenset(path.name for path in ROOT.iterdir() if (path / "__init__.py").is_file())
# pip / uv options followed by a value, not by a requirement.
_OPTIONS_WITH_VALUE = {"--index-url", "--extra-index-url", "--python", "-r", "--requirement", "-c", "--constraint"}
SECRET_WORDS = re.compile(r"(TOKEN|PASSWORD|PASSWD|SECRET|API_?KEY|CREDENTIAL|PRIVATE)", re.IGNORECASE)


def instructions(path: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (ROOT / "docker" / str(path)).read_text())
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def test_every_image_has_a_dockerfile() -> None:
    names = {p.name.removesuffix(".Dockerfile") for p in DOCKERFILES}
    assert names == SERVICE_IMAGES | {"rtmp-relay"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_clean(dockerfile: Path) -> None:
    # Default failure threshold: any finding (error, warning, info, style) fails.
    result = subprocess.run([str(HADOLINT), "--no-color", str(dockerfile)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_reports_violations(tmp_path: Path) -> None:
    """The lint is real: an unpinned base image and an unpinned, cached pip install are reported."""
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM python\nRUN pip install requests\n")
    result = subprocess.run([str(HADOLINT), "--no-color", str(bad)], capture_output=True, text=True)
    assert result.returncode != 0
    for rule in ("DL3006", "DL3013", "DL3042"):
        assert rule in result.stdout, result.stdout


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_conventions(dockerfile: Path) -> None:
    name = dockerfile.name
    steps = instructions(name)
    images = [args.split()[0] for keyword, args in steps if keyword == "FROM"]
    stages = [args.split()[-1] for keyword, args in steps if keyword == "FROM" and " AS " in f" {args.upper()} "]
    for image in images:
        if image in stages:
            continue
        # Pinned by tag: a version-looking tag, never latest.
        repository, _, tag = image.rpartition(":")
        assert repository and re.search(r"\d", tag) and "latest" not in tag, f"{name}: base image {image} not pinned"
    if name.removesuffix(".Dockerfile") in SERVICE_IMAGES:
        assert len(images) >= 2, f"{name}: expected a multi-stage build"
    users = [args for keyword, args in steps if keyword == "USER"]
    assert users and re.fullmatch(r"[1-9]\d*(:[1-9]\d*)?", users[-1]), f"{name}: must end as a numeric non-root USER"
    assert any(keyword == "HEALTHCHECK" for keyword, _ in steps), f"{name}: no HEALTHCHECK"
    for keyword, args in steps:
        if keyword in ("ARG", "ENV"):
            assert not SECRET_WORDS.search(args), f"{name}: build-time secret in {keyword} {args}"
        if keyword in ("ADD",):
            pytest.fail(f"{name}: use COPY, not ADD")
    # The project is installed as users install it: built into a wheel and installed, never editable (an
    # editable install would point into /src, which the final stage does not copy).
    for keyword, args in steps:
        if keyword == "RUN" and re.search(r"\bpip install\b", args):
            assert not re.search(r"(^|\s)(-e|--editable)(\s|=|$)", args), f"{name}: editable install: {args}"
    # The entry point of a service image runs a module of the package, like the chart does.
    (entrypoint,) = [json.loads(args) for keyword, args in steps if keyword == "ENTRYPOINT"]
    if entrypoint[0] == "python":
        assert entrypoint[1] == "-m" and importlib.util.find_spec(f"{entrypoint[2]}.__main__") is not None
        healthcheck = next(args for keyword, args in steps if keyword == "HEALTHCHECK")
        exposed = next(args for keyword, args in steps if keyword == "EXPOSE")
        probes = (f'"inferix.health", "127.0.0.1:{exposed}"', f"inferix.health 127.0.0.1:{exposed}")
        assert any(p in healthcheck for p in probes), f"{name}: probe the exposed gRPC port"


def _ignored(path: str, patterns: list[str]) -> bool:
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.removeprefix("!").rstrip("/")
        candidates = [pattern, pattern.removeprefix("**/")]
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(prefix, c) or fnmatch.fnmatch(parts[-1], c) for prefix in prefixes for c in candidates):
            ignored = not negate
    return ignored


def test_dockerignore_keeps_what_the_images_copy() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for secret_or_cache in (".git", ".tools", ".venv", "tests", "out", ".env", "models/wan.safetensors"):
        assert _ignored(secret_or_cache, patterns), f".dockerignore should exclude {secret_or_cache}"
    for dockerfile in DOCKERFILES:
        for keyword, args in instructions(dockerfile.name):
            if keyword != "COPY" or args.startswith("--from"):
                continue
            for source in args.split()[:-1]:
                assert (ROOT / source).exists(), f"{dockerfile.name}: COPY {source}: not in the repository"
                assert not _ignored(source.rstrip("/"), patterns), f"{dockerfile.name}: COPY {source} is dockerignored"
                # Every file of a copied package reaches the image: its package data (the built-in models'
                # weights, presets, the viewer page) is what `pip install` puts in the wheel.
                if (ROOT / source).is_dir():
                    files = [p for p in (ROOT / source).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
                    lost = [str(p.relative_to(ROOT)) for p in files if _ignored(str(p.relative_to(ROOT)), patterns)]
                    assert lost == [], f"{dockerfile.name}: COPY {source} leaves these out (.dockerignore): {lost}"


def _load_service_deps() -> Any:
    """bench/service_deps.py: the same requirement closure it reports per role (bench/ is no package)."""
    spec = importlib.util.spec_from_file_location("service_deps", ROOT / "bench" / "service_deps.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["service_deps"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


service_deps = _load_service_deps()


def pip_installs(path: str) -> list[list[str]]:
    """The requirements of each `pip install` / `uv pip install` of a Dockerfile's RUN steps, in order."""
    installs = []
    for keyword, args in instructions(path):
        if keyword != "RUN":
            continue
        words = shlex.split(args)
        commands: list[list[str]] = [[]]
        for word in words:
            if word in ("&&", ";", "||"):
                commands.append([])
            else:
                commands[-1].append(word)
        for command in commands:
            pip = next((i for i, word in enumerate(command) if word == "pip" or word.endswith("/pip")), None)
            if pip is None or command[pip + 1 : pip + 2] != ["install"]:
                continue
            requirements: list[str] = []
            rest = iter(command[pip + 2 :])
            for word in rest:
                if word in _OPTIONS_WITH_VALUE:
                    next(rest)
                elif not word.startswith("-"):
                    requirements.append(word)
            installs.append(requirements)
    return installs


def project_extras(path: str) -> list[str]:
    """The extras the project (a local path, `./[extra]`) is installed with; fails unless installed once."""
    projects = [
        requirement
        for requirements in pip_installs(path)
        for requirement in requirements
        if requirement.startswith((".", "/"))
    ]
    assert len(projects) == 1, f"{path}: expected one install of the project, got {projects}"
    match = re.fullmatch(r"[./\w-]*\[([\w,-]+)\]", projects[0])
    assert match, f"{path}: the project is installed as {projects[0]}, without its role's extra"
    return match.group(1).split(",")


def installs_torch_directly(path: str) -> bool:
    return any(re.match(r"torch($|[=<>!~;\[ ])", r) for requirements in pip_installs(path) for r in requirements)


def extra_closure(extra: str) -> tuple[str, ...]:
    """The distributions `pip install .[extra]` brings (base dependencies too), as installed here."""
    closure = service_deps.closure(ROOT, extra, service_deps.Environment())
    assert closure.declared, f"pyproject.toml declares no extra {extra!r}"
    return tuple(closure.dists)


@pytest.mark.parametrize("image", CONTROL_PLANE_IMAGES)
def test_control_plane_images_install_no_torch(image: str) -> None:
    name = f"{image}.Dockerfile"
    assert project_extras(name) == [IMAGE_EXTRAS[image]]
    assert not installs_torch_directly(name), f"{name}: installs torch"
    assert not [args for keyword, args in instructions(name) if keyword == "ARG" and "TORCH" in args.upper()]
    assert "torch" not in extra_closure(IMAGE_EXTRAS[image]), f"the {IMAGE_EXTRAS[image]} extra brings torch"


@pytest.mark.parametrize("image", WORKER_IMAGES)
def test_worker_images_install_torch_for_their_device_first(image: str) -> None:
    name = f"{image}.Dockerfile"
    installs = pip_installs(name)
    # torch from TORCH_INDEX_URL (CPU or CUDA build) before the project: the worker extra's own
    # `torch` requirement is then already met, and pip does not bring PyPI's build instead.
    assert installs and installs[0] == ["torch==${TORCH_VERSION}"], f"{name}: first install {installs[:1]}"
    run = next(args for keyword, args in instructions(name) if keyword == "RUN" and "torch==" in args)
    assert '--index-url "${TORCH_INDEX_URL}"' in run
    assert project_extras(name) == ["worker"]
    assert "torch" in extra_closure("worker")


def _module_file(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _is_optional(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """An import under `if TYPE_CHECKING:` or in a `try:` that handles ImportError is not required."""
    while node in parents:
        parent = parents[node]
        if isinstance(parent, ast.If) and "TYPE_CHECKING" in ast.unparse(parent.test) and node in parent.body:
            return True
        if isinstance(parent, ast.Try) and node in parent.body:
            caught = {ast.unparse(handler.type) for handler in parent.handlers if handler.type is not None}
            if caught & {"ImportError", "ModuleNotFoundError"}:
                return True
        node = parent
    return False


def _imports(path: Path) -> Iterator[tuple[str, bool]]:
    """(module, optional) for each import of a source file, function-level ones included. Optional
    too: a module the file looks for first with `find_spec("name")` (e.g. the flash-attn backend)."""
    tree = ast.parse(path.read_text(), str(path))
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    probed = {
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and ast.unparse(node.func).endswith("find_spec")
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, alias.name in probed or _is_optional(node, parents)
        elif isinstance(node, ast.ImportFrom):
            # The project imports absolutely; this walk would misread `from . import x`.
            assert not node.level and node.module, f"{path}:{node.lineno}: relative import"
            base = node.module
            optional = base in probed or _is_optional(node, parents)
            yield base, optional
            for alias in node.names:  # `from package import module`
                yield f"{base}.{alias.name}", optional


def service_imports(package: str) -> tuple[set[str], set[str]]:
    """First-party modules and required third-party top-level names of every module of `package`,
    following the first-party imports it makes (lazy, function-level ones too) through the tree."""
    pending = [
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for path in (ROOT / package).rglob("*.py")
    ]
    first_party: set[str] = set()
    third_party: set[str] = set()
    while pending:
        module = pending.pop()
        path = _module_file(module)
        if path is None or module in first_party:
            continue  # a name imported from a module, not a module
        first_party.add(module)
        parts = module.split(".")
        pending.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # parents run their __init__
        for name, optional in _imports(path):
            top = name.partition(".")[0]
            if top in FIRST_PARTY:
                pending.append(name)
            elif not optional and top and top not in sys.stdlib_module_names and top != "__future__":
                third_party.add(top)
    return first_party, third_party


@pytest.mark.parametrize("image", sorted(IMAGE_EXTRAS))
def test_image_carries_what_its_service_imports(image: str) -> None:
    """The service's first-party imports stay within the packages the image copies, and each of its
    third-party imports comes from a distribution its extra brings: the layering, as the image sees it."""
    name = f"{image}.Dockerfile"
    steps = instructions(name)
    (entrypoint,) = [json.loads(args) for keyword, args in steps if keyword == "ENTRYPOINT"]
    copied = {
        source.rstrip("/")
        for keyword, args in steps
        if keyword == "COPY" and not args.startswith("--from")
        for source in args.split()[:-1]
    }
    first_party, third_party = service_imports(entrypoint[2])
    outside = sorted(module for module in first_party if module.partition(".")[0] not in copied)
    assert not outside, f"{name}: the service imports packages the image does not copy: {outside}"
    owners = metadata.packages_distributions()
    brought = {service_deps.canonicalize_name(dist) for dist in extra_closure(IMAGE_EXTRAS[image])}
    missing = sorted(
        top for top in third_party if not {service_deps.canonicalize_name(d) for d in owners.get(top, [])} & brought
    )
    assert not missing, f"{name}: the {IMAGE_EXTRAS[image]} extra does not bring {missing}"
