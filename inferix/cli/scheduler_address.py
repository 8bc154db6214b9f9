"""The flags that say where a client command finds the scheduler: --server, --tls, --ca (inferix/client/tls.py)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

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
