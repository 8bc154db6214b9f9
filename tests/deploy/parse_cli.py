"""Parse command lines with the services' own argparse parsers, without starting anything.

`python -m tests.deploy.parse_cli` reads a JSON list of cases `{"module", "argv", "env"}` on stdin,
runs each `module`'s `__main__` (as `python -m module` would) with `argv` and `env`, and stops it
the moment its parser returns. It prints one JSON result per case: `{"ok": true, "args": {...}}`
with the parsed namespace, or `{"ok": false, "error": "..."}` with argparse's message (unknown flag,
bad value). So a flag in the Helm chart that the entry point does not accept fails the test.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import runpy
import sys
from typing import Any


class Parsed(Exception):
    def __init__(self, namespace: argparse.Namespace) -> None:
        self.namespace = namespace


def _stop_after_parse() -> None:
    original = argparse.ArgumentParser.parse_args

    def parse_args(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise Parsed(original(self, *args, **kwargs))

    argparse.ArgumentParser.parse_args = parse_args  # type: ignore[method-assign]


def run_case(module: str, argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    saved_env = dict(os.environ)
    os.environ.update(env)
    sys.argv = [module, *argv]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except Parsed as parsed:
        args = {key: None if value is None else str(value) for key, value in vars(parsed.namespace).items()}
        return {"ok": True, "args": args}
    except SystemExit as exc:
        return {"ok": False, "error": f"exit {exc.code}: {stderr.getvalue().strip()}"}
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
    return {"ok": False, "error": f"{module} returned without parsing its command line"}


def main() -> None:
    _stop_after_parse()
    cases = json.load(sys.stdin)
    results = [run_case(case["module"], case["argv"], case.get("env", {})) for case in cases]
    print(json.dumps(results))


if __name__ == "__main__":
    main()
