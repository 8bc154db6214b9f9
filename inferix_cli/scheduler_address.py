"""The flags that say where a client command finds the scheduler: --server, --tls, --ca (inferix/client/tls.py),
and how long it waits for one that is restarting: --retry-s (inferix/client/retry.py)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from inferix.errors import UserError

DEFAULT_RETRY_S = 30.0  # = inferix.client.retry.DEFAULT_RETRY_S, without importing grpc to build the parser

TLS_EPILOG = (
    "TLS: --server grpcs://HOST:PORT (or --tls) checks the server's certificate against the system's roots, or "
    "against --ca FILE (env INFERIX_CA) for a private CA; a plain HOST:PORT is plaintext."
)


def add_scheduler_address_arguments(parser: argparse.ArgumentParser) -> None:
    """`--server` (env INFERIX_SERVER), `--tls`, `--ca` (env INFERIX_CA), as `inferix.client.Client` takes them."""
    parser.add_argument(
        "--server",
        default=os.environ.get("INFERIX_SERVER", "127.0.0.1:50051"),
        help="scheduler address: HOST:PORT (plaintext) or grpcs://HOST:PORT (TLS); env INFERIX_SERVER",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        default=None,
        help="connect over TLS even to a plain HOST:PORT (grpcs:// implies it)",
    )
    parser.add_argument(
        "--ca",
        type=Path,
        default=os.environ.get("INFERIX_CA") or None,
        help="PEM file of the CA that signed the scheduler's certificate (implies --tls; default: the system's "
        "roots; env INFERIX_CA)",
    )
    retry_s = os.environ.get("INFERIX_RETRY_S", "").strip()
    parser.add_argument(
        "--retry-s",
        type=float,
        default=retry_s or None,  # a string default goes through `type`: a bad env value is a usage error
        help=f"seconds to keep retrying a scheduler or streamer that is restarting (refusing connections) "
        f"before giving up; 0 = fail at once (env INFERIX_RETRY_S; default {DEFAULT_RETRY_S:g}, and 120 between "
        "the events of `session watch`)",
    )


def retry_seconds(args: argparse.Namespace) -> float:
    """--retry-s, or its default; UserError when negative."""
    if args.retry_s is None:
        return DEFAULT_RETRY_S
    if args.retry_s < 0:
        raise UserError(f"--retry-s must be 0 or more, got {args.retry_s:g}")
    return float(args.retry_s)


def print_waiting(message: str) -> None:
    """The SDK's notice that a server is away (`Client(on_wait=...)`): one line on stderr per outage."""
    print(f"inferix: {message} ...", file=sys.stderr, flush=True)
