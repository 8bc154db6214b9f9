"""`inferix profile`: print a profile report, render it as HTML, or merge the reports of all ranks.

inferix profile REPORT.json [--regions N] [--html OUT.html]
inferix profile merge R0.json R1.json ... --out MERGED.json [--html OUT.html]
"""

from __future__ import annotations

import argparse
from typing import Any

from inferix.errors import UserError
from inferix.profiling.report import ProfileReport, merge_reports
from inferix.profiling.text import format_report

_USAGE = """inferix profile REPORT.json [--regions N] [--html OUT.html]
       inferix profile merge REPORT.json [REPORT.json ...] --out MERGED.json [--html OUT.html]"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "profile",
        usage=_USAGE,
        help="summarize a profiler report, or merge the reports of every rank",
        description=(
            "Print the summary table of a profile report written by the Inferix profiler "
            "(e.g. by `inferix generate --profile DIR`), or, with `merge`, combine the report of "
            "every rank of one multi-GPU worker into one report."
        ),
    )
    parser.add_argument("report", metavar="REPORT.json | merge", help="the report to summarize, or `merge`")
    parser.add_argument("more", nargs="*", metavar="REPORT.json", help="with merge: one report per rank")
    parser.add_argument("--out", metavar="MERGED.json", help="with merge: where to write the merged report")
    parser.add_argument("--html", metavar="OUT.html", help="also write the HTML report (plots) here")
    parser.add_argument(
        "--regions", type=int, default=20, metavar="N", help="show the N region names with most time (default 20)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.regions < 1:
        raise UserError(f"--regions must be at least 1, got {args.regions}")
    if args.report == "merge":
        report = _merge(args)
    else:
        if args.more:
            raise UserError(
                f"summarize one report at a time (got {1 + len(args.more)}); "
                "to combine ranks use `inferix profile merge R0.json R1.json ... --out MERGED.json`"
            )
        if args.out is not None:
            raise UserError("--out is for `inferix profile merge`; to convert a report to HTML use --html")
        report = ProfileReport.load(args.report)
    print(format_report(report, max_regions=args.regions))
    if args.html is not None:
        from inferix.profiling.html import write_html  # matplotlib: only paid by who writes HTML

        print(f"wrote {write_html(report, args.html)}")
    return 0


def _merge(args: argparse.Namespace) -> ProfileReport:
    if not args.more:
        raise UserError("merge needs the report of every rank: inferix profile merge R0.json R1.json ... --out M.json")
    if args.out is None:
        raise UserError("merge needs --out MERGED.json: where to write the merged report")
    merged = merge_reports([ProfileReport.load(path) for path in args.more])
    path = merged.write_json(args.out)
    print(f"merged {len(merged.ranks)} rank report(s) into {path}\n")
    return merged
