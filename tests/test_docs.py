"""The documentation: the README is the front page and docs/ holds the rest; together they must name
every command and flag a user can type, link to pages and sections that exist, and their in-process
Python examples must run."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from inferix_cli.main import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").rglob("*.md"))
DOCUMENTS = [README, *PAGES]


def _corpus() -> str:
    return "\n".join(path.read_text() for path in DOCUMENTS)


def _outside_fences(text: str) -> Iterator[str]:
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            yield line


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(m.group(1)) for line in _outside_fences(path.read_text()) if (m := re.match(r"#{1,6} (.*)", line))}


def _links(path: Path) -> Iterator[str]:
    for line in _outside_fences(path.read_text()):
        # Inline code may hold text that looks like a link (`[a](b)` in an example); it is not one.
        yield from re.findall(r"\]\(([^)\s]+)\)", re.sub(r"`[^`]*`", "", line))


def _documented(text: str, word: str) -> bool:
    """`word` (a flag such as --kv-dtype) appears as a whole word, not as the start of a longer flag."""
    return re.search(re.escape(word) + r"(?![\w-])", text) is not None


# ---- the pages and the links between them ----------------------------------------------------------


def test_every_docs_page_is_in_the_readme_index() -> None:
    index = README.read_text().split("\n## Documentation\n", 1)
    assert len(index) == 2, "README.md has no '## Documentation' section"
    linked = set(re.findall(r"\]\((docs/[^)#\s]+)", index[1]))
    pages = {str(page.relative_to(ROOT)) for page in PAGES}
    assert pages - linked == set(), "docs pages missing from the README's Documentation index"
    assert linked - pages == set(), "the README's Documentation index names pages that do not exist"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_page_opens_with_its_summary_and_a_link_back(page: Path) -> None:
    title, blank, summary = page.read_text().splitlines()[:3]
    back = Path(*[".."] * (len(page.relative_to(ROOT).parts) - 1), "README.md")
    assert title.startswith("# ") and blank == ""
    assert summary and f"]({back.as_posix()}" in summary, f"line 3 of {page.name} should summarize and link {back}"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(document: Path) -> None:
    broken = []
    for link in _links(document):
        if re.match(r"[a-z]+:", link):  # http(s), mailto: not ours to check offline
            continue
        target, _, anchor = link.partition("#")
        path = (document.parent / target).resolve() if target else document
        if not path.exists():
            broken.append(f"{link}: no {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{link}: no heading with anchor #{anchor} in {path.relative_to(ROOT)}")
    assert broken == [], f"{document.relative_to(ROOT)}: broken links"


# ---- every command and flag a user can type ------------------------------------------------------------


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], str | None]]:
    """(command path, long flag) for every option of every subcommand; (path, None) for the command itself."""
    yield path, None
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))
        else:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help":
                    yield path, option


CLI = sorted(set(_commands(build_parser(), ("inferix",))), key=lambda item: (item[0], item[1] or ""))


def _command_documented(corpus: str, path: tuple[str, ...]) -> bool:
    """`inferix session act` written out, or as one of a list: `inferix session create/act/...`."""
    *parent, last = path
    for listed in re.findall(re.escape(" ".join(parent)) + r" ([\w-]+(?:/[\w-]+)*)", corpus):
        if last in listed.split("/"):
            return True
    return False


def test_every_inferix_command_is_documented() -> None:
    corpus = _corpus()
    missing = [" ".join(path) for path, option in CLI if option is None and len(path) > 1]
    missing = [command for command in missing if not _command_documented(corpus, tuple(command.split()))]
    assert missing == [], "commands no README or docs page names"


def test_every_inferix_flag_is_documented() -> None:
    corpus = _corpus()
    missing = [f"{' '.join(path)} {option}" for path, option in CLI if option and not _documented(corpus, option)]
    assert missing == [], "flags no README or docs page names"


def _service_help(name: str) -> Callable[[], object]:
    if name == "scheduler":
        from scheduler.__main__ import parse_args as scheduler_args

        return scheduler_args
    if name == "workers":
        from workers.__main__ import parse_args as worker_args

        return worker_args
    if name == "kvcache_svc":
        from kvcache_svc.__main__ import build_parser as kvcache_parser

        return lambda: kvcache_parser().parse_args()
    from streamer.__main__ import _parser as streamer_parser

    return lambda: streamer_parser().parse_args()


@pytest.mark.parametrize("service", ["scheduler", "workers", "kvcache_svc", "streamer"])
def test_every_service_flag_is_documented(service: str, monkeypatch: pytest.MonkeyPatch) -> None:
    parse = _service_help(service)
    monkeypatch.setattr(sys, "argv", [service, "--help"])
    help_text = io.StringIO()
    with contextlib.redirect_stdout(help_text), pytest.raises(SystemExit):
        parse()
    flags = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", help_text.getvalue())) - {"--help"}
    assert flags, f"python -m {service} --help listed no flags"
    corpus = _corpus()
    assert f"python -m {service}" in corpus
    missing = sorted(flag for flag in flags if not _documented(corpus, flag))
    assert missing == [], f"python -m {service}: flags no README or docs page names"


# ---- the examples run ----------------------------------------------------------------------------------


def _python_examples(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), re.S | re.M)


# Examples that talk to a running mesh (the SDK's) are run against one by the mesh tests, not here.
IN_PROCESS = [
    (path, examples)
    for path in DOCUMENTS
    if (examples := [example for example in _python_examples(path) if "Client(" not in example])
]


@pytest.mark.parametrize(("path", "examples"), IN_PROCESS, ids=[str(p.relative_to(ROOT)) for p, _ in IN_PROCESS])
def test_in_process_python_examples_run(path: Path, examples: list[str]) -> None:
    # One namespace per page, in page order: a later example may use what an earlier one made.
    namespace: dict[str, object] = {"__name__": "__example__"}
    for number, example in enumerate(examples):
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(example, f"{path.relative_to(ROOT)} example {number}", "exec"), namespace)  # noqa: S102
