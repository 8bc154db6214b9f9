"""`inferix quantize`: write a model folder with an 8-bit DiT (see "Quantization" in the README)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "quantize",
        help="write a model folder whose DiT holds quantized weights and scales",
        description="Quantize a model folder's DiT (the block linears; see the README's Quantization table) and "
        "write a model folder that loads directly: model.yaml with 'quant: MODE', the DiT as safetensors, and "
        "the VAE, text encoder and tokenizer as hard links (or copies).",
    )
    parser.add_argument(
        "--model", default=None, help="model folder, or toyworld (default: the built-in toyworld weights)"
    )
    parser.add_argument(
        "--quant", required=True, help="int8 (W8A8), int8-wo (weights only), fp8 (per-row scales), fp8-tensor"
    )
    parser.add_argument("--out", type=Path, required=True, help="the new model folder (must not exist, or be empty)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from engine.capabilities import EngineRequest, check
    from engine.families.wan.quantized_folder import write_quantized_folder
    from engine.quant import parse_quant
    from engine.registry import family_capabilities

    mode = parse_quant(args.quant)
    check(family_capabilities(args.model), EngineRequest(quant=args.quant))  # before anything loads
    written = write_quantized_folder(args.model, mode, args.out)
    ratio = written.quantized_bytes / written.source_bytes
    print(
        f"wrote {written.path} ({mode.name}): DiT {written.source_bytes / 2**20:.1f} MiB -> "
        f"{written.quantized_bytes / 2**20:.1f} MiB ({ratio:.2f}x); run it with --model {written.path}",
        file=sys.stderr,
    )
    return 0
