"""docker/*.Dockerfile: hadolint-clean (the real hadolint), and the conventions the images rely on."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.deploy.conftest import DOCKERFILES, HADOLINT, ROOT

SERVICE_IMAGES = {"scheduler", "kvcache-svc", "streamer", "worker-cuda", "worker-cpu"}
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
    # The entry point of a service image runs a module of the package, like the chart does.
    (entrypoint,) = [json.loads(args) for keyword, args in steps if keyword == "ENTRYPOINT"]
    if entrypoint[0] == "python":
        assert entrypoint[1] == "-m" and importlib.util.find_spec(f"{entrypoint[2]}.__main__") is not None
        healthcheck = next(args for keyword, args in steps if keyword == "HEALTHCHECK")
        exposed = next(args for keyword, args in steps if keyword == "EXPOSE")
        assert f'"inferix.health", "127.0.0.1:{exposed}"' in healthcheck, f"{name}: probe the exposed gRPC port"


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
    # The built-in default model is package data: the images must carry it.
    assert not _ignored("workers/engine/models/toyworld/weights/toyworld_dit.safetensors", patterns)
    for dockerfile in DOCKERFILES:
        for keyword, args in instructions(dockerfile.name):
            if keyword != "COPY" or args.startswith("--from"):
                continue
            for source in args.split()[:-1]:
                assert (ROOT / source).exists(), f"{dockerfile.name}: COPY {source}: not in the repository"
                assert not _ignored(source.rstrip("/"), patterns), f"{dockerfile.name}: COPY {source} is dockerignored"
