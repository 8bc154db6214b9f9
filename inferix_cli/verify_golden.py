"""`inferix verify-golden DIR`: run golden reference cases through the engine and compare."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from inferix.errors import UserError
from inferix.spec.parity import GOLDEN_TOLERANCE


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "verify-golden",
        help="compare the engine with reference golden vectors",
        description=(
            "Run every golden case in DIR (a case folder with config.json, or a folder of them) "
            "through the engine and print the max abs diff of every compared tensor. Exits 1 if "
            "any diff is above the tolerance."
        ),
    )
    parser.add_argument("directory", type=Path, metavar="DIR", help="golden case folder, or a folder of cases")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=GOLDEN_TOLERANCE,
        help=f"max abs diff allowed (default {GOLDEN_TOLERANCE})",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object per comparison")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1, as the reference)")
    parser.add_argument(
        "--device", default="cpu", help="cpu (default, as the reference), cuda, cuda:1, ...; TF32 is off on CUDA"
    )
    parser.add_argument(
        "--dtype",
        default="fp32",
        help="weights of the networks: fp32 (default, as the reference), bf16 or fp16 (expect diffs above 1e-5)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from engine.checkpoint import parse_dtype
    from engine.golden import find_cases
    from engine.registry import kind_of

    torch.set_num_threads(args.threads)
    dtype = parse_dtype(args.dtype)
    try:
        device = torch.device(args.device)
    except RuntimeError as exc:
        raise UserError(f"--device {args.device!r}: {exc}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"--device {args.device}: CUDA is not available here (torch {torch.__version__})")
        # The reference ran in true fp32: TF32 matmuls and convolutions (10-bit mantissa) would
        # add ~1e-3 errors and hide real differences behind them.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    failed = 0
    total = 0
    cases = find_cases(args.directory, device, dtype)
    reference_setting = device.type == "cpu" and dtype == torch.float32
    for case in cases:
        kind = kind_of(case)
        if kind.reference_only and not reference_setting:
            why = f"{kind.name} cases run on the CPU in fp32 (as the reference)"
            if len(cases) == 1:
                raise UserError(f"{case.folder}: {why}")
            print(f"skipped {case.name}: {why}", file=sys.stderr)  # a folder of cases: the others still run
            continue
        for comparison in kind.verify(case, args.tolerance):
            total += 1
            failed += not comparison.passed
            if args.json:
                record: dict[str, Any] = {
                    "case": comparison.case,
                    "tensor": comparison.name,
                    "max_abs_diff": comparison.max_abs_diff,
                    "tolerance": comparison.tolerance,
                    "passed": comparison.passed,
                }
                if comparison.error is not None:
                    record["error"] = comparison.error
                print(json.dumps(record))
            else:
                status = "ok  " if comparison.passed else "FAIL"
                verdict = comparison.error or f"{comparison.max_abs_diff:.3e}"
                print(f"{status} {comparison.case:<28} {comparison.name:<36} {verdict}")
    print(f"{total - failed} passed, {failed} failed", file=sys.stderr if args.json else sys.stdout)
    return 1 if failed else 0
