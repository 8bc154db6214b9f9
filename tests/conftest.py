"""Shared test fixtures."""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
import torch

# One real redis-server for the whole run (fixture `redis_server`), shared by every test folder.
pytest_plugins = ["tests.store.redis_server"]

GOLDEN_DIR = Path(__file__).parent / "golden"
# Wan-family cases (Self Forcing, CausVid) keep their outputs in outputs.safetensors; MAGI-1's are staged;
# Matrix-Game 2.0's also have outputs.safetensors but their own stages (tests/engine/matrixgame).
MATRIXGAME_CASES = sorted(p.name for p in GOLDEN_DIR.iterdir() if p.name.startswith("matrixgame"))
# TAEHV decoder cases (taew2_1_tiny, ...) hold only a decoder's vectors (tests/engine/decoders).
TAEHV_CASES = sorted(p.name for p in GOLDEN_DIR.iterdir() if p.name.startswith("tae"))
GOLDEN_CASES = sorted(
    p.name
    for p in GOLDEN_DIR.iterdir()
    if (p / "outputs.safetensors").is_file() and p.name not in MATRIXGAME_CASES and p.name not in TAEHV_CASES
)
MAGI_CASES = sorted(p.name for p in GOLDEN_DIR.iterdir() if p.name.startswith("magi1_"))


# The test tiers (README "Testing"). A test that is more than in-process logic carries the marker of
# why (pyproject.toml registers them): `process` (it starts programs: our services, the CLI, a
# script), `external` (one of those is an external program: redis-server, ffmpeg, nginx, Chromium,
# coturn, helm, g++...), `multirank` (several torch.distributed ranks), `slow` (in-process but long:
# training, minute-long videos). `make test-fast` (`pytest --fast-tier`) runs the tests with none of
# them, `make test` everything.
#
# Marked here, centrally, so that a new test is marked by where it lives and what it uses:
# - every test of a folder whose tests all run real processes (FOLDER_MARKS);
# - every test whose code, a fixture it uses, or a helper of tests/ that either calls (followed
#   through tests/ functions and classes) names a way of starting programs (STARTS);
# - the store tests' "redis" parameter (a real redis-server);
# - `slow` only by hand (`@pytest.mark.slow`), as nothing tells a long loop from a short one.
# Under --fast-tier a test that starts a program all the same fails and names it: the rules missed it,
# so mark it (or move it) rather than let the fast tier wait for processes.
FOLDER_MARKS: dict[str, tuple[str, ...]] = {
    "mesh": ("process",),  # every test runs a whole mesh of real processes
    "tls": ("process",),  # a mesh, a scheduler and the viewer over TLS, as processes
    "packaging": ("process",),  # builds the wheel, installs it into a venv and runs the installed CLI
}
STARTS: dict[str, str] = {
    "subprocess": "process",
    "Popen": "process",
    "fork": "process",
    "start_service": "process",  # inferix_cli.mesh.launch: one service as a process
    "start_mesh": "process",  # inferix_cli.mesh: a whole mesh of processes
    "start_processes": "multirank",  # torch.multiprocessing: the ranks of a pod (tests/parallel/pod.py)
    "RedisServer": "external",
    "check_helm": "external",  # scripts/check_helm.py: helm lint / template
    "HELM": "external",
    "HADOLINT": "external",
    "start_nginx_rtmp": "external",  # inferix_cli.mesh.rtmp_relay: nginx with the RTMP module
    "check_wheels": "external",  # scripts/gpu_check.py: sizes the tree with `git ls-files`
    "sync_playwright": "external",  # drives Chromium
}
# Fixtures that only make sure a tool is installed (they run its installer where it is missing): using
# them is not starting a program.
ONLY_CHECK = {"deploy_tools", "_ffprobe_installed"}
# Fixtures parametrized over the store backends: their "redis" case asks for `redis_server` at run time.
REDIS_PARAMS = ("backend", "store_url")
TIER_MARKERS = ("process", "external", "multirank", "slow")
FAST_TIER = "not (process or external or multirank or slow)"


def _names(code: types.CodeType) -> Iterator[str]:
    """The global and attribute names a function's code (its nested functions included) uses."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


_starts_cache: dict[object, frozenset[str]] = {}


def _starts(obj: object) -> frozenset[str]:
    """The markers of what `obj` (a test, a fixture, or a function or class of tests/) starts, directly
    or through the functions and classes of tests/ it uses."""
    if obj in _starts_cache:
        return _starts_cache[obj]
    _starts_cache[obj] = frozenset()  # a cycle adds nothing
    found: set[str] = set()
    if inspect.isclass(obj):
        for member in vars(obj).values():
            if inspect.isfunction(member):
                found |= _starts(member)
    elif inspect.isfunction(obj):
        for name in _names(inspect.unwrap(obj).__code__):
            if name in STARTS:
                found.add(STARTS[name])
            used = obj.__globals__.get(name)
            if (inspect.isfunction(used) or inspect.isclass(used)) and used.__module__.startswith("tests."):
                found |= _starts(used)
    _starts_cache[obj] = frozenset(found)
    return _starts_cache[obj]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast-tier",
        action="store_true",
        help=f'run the logic tests only (-m "{FAST_TIER}"); a test that starts a program fails',
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--fast-tier"):
        config.option.markexpr = FAST_TIER
        sys.addaudithook(_audit)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = Path(__file__).parent
    for item in items:
        marks: set[str] = set()
        if item.path.is_relative_to(tests):
            marks.update(FOLDER_MARKS.get(item.path.relative_to(tests).parts[0], ()))
        if isinstance(item, pytest.Function):
            marks |= _starts(item.function)
            for name, definitions in item._fixtureinfo.name2fixturedefs.items():
                for definition in definitions:
                    marks |= set() if name in ONLY_CHECK else _starts(definition.func)
            params = getattr(item, "callspec", None)
            if params is not None and any(params.params.get(name) == "redis" for name in REDIS_PARAMS):
                marks.add("external")
        for mark in sorted(marks):
            if item.get_closest_marker(mark) is None:
                item.add_marker(mark)


# --fast-tier: the programs each test started (audit events), by the test running.
_running: list[str] = []
_started: dict[str, list[str]] = {}


def _audit(event: str, args: tuple[object, ...]) -> None:
    if _running and event in ("subprocess.Popen", "os.posix_spawn", "os.fork", "os.system"):
        program: object = event
        if event == "subprocess.Popen":  # (executable, args, cwd, env): the executable may be None
            command = args[1]
            program = args[0] or (command[0] if isinstance(command, list | tuple) and command else command)
        elif event != "os.fork":
            program = args[0]
        if isinstance(program, bytes):
            program = program.decode(errors="replace")
        _started.setdefault(_running[-1], []).append(Path(str(program).split(" ")[0]).name)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    _running.append(item.nodeid)
    try:
        return (yield)
    finally:
        _running.pop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    started = _started.pop(item.nodeid, None) if call.when == "teardown" else None
    if started and not any(item.get_closest_marker(mark) for mark in TIER_MARKERS):
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} started {sorted(set(started))} in the fast tier: mark it `process` (or `external`, "
            "`multirank`) where it lives, or teach tests/conftest.py's rules what it uses (README, Testing)"
        )
    return report


@pytest.fixture(autouse=True)
def _single_thread() -> None:
    # The golden vectors were made with one thread; it also keeps the suite steady on 2 cores.
    torch.set_num_threads(1)
