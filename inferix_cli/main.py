"""The `inferix` command line: one sub-command per module in this package."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from inferix import __version__
from inferix.errors import UserError
from inferix.openmp import openmp_wait

# Each module exposes `register(subparsers)`, which adds one sub-command whose parser
# sets `func(args) -> int`.
_COMMAND_MODULES = [
    "inferix_cli.verify_golden",
    "inferix_cli.generate",
    "inferix_cli.serve",
    "inferix_cli.session",
    "inferix_cli.profile",
    "inferix_cli.lvbench",
    "inferix_cli.quantize",
    "inferix_cli.cluster",
]


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(
        prog="inferix",
        description="Inferix: block-diffusion video world models, from one laptop to a GPU cluster.",
    )
    parser.add_argument("--version", action="version", version=f"inferix {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.update(openmp_wait(os.environ))  # before a command loads torch (inferix/openmp.py)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except UserError as exc:
        print(f"inferix {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        # A failed TLS handshake with the scheduler, from any command that talks to it, is one line too.
        # Looked up only if the SDK was loaded: most commands never import grpc.
        tls = sys.modules.get("inferix.client.tls")
        if tls is None or not isinstance(exc, tls.TlsError):
            raise
        print(f"inferix {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"inferix {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
