"""`python -m harness report RESULTS.json [...] --out FILE.html`: one self-contained HTML page."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import UsageError


def add_arguments(parser) -> None:
    parser.add_argument("results", nargs="+", help="bench results JSON files (schema_version 1)")
    parser.add_argument("--out", required=True, help="HTML file to write")
    parser.add_argument("--compare", action="store_true",
                        help="with exactly two files: add the comparison table (baseline first); "
                             "fingerprint differences are shown, not refused")


def run(args) -> int:
    from ..report.bench_html import render
    from ..serving import results

    out = Path(args.out)
    if out.is_dir():
        raise UsageError(f"--out: {args.out!r} is a directory")
    twice = results.same_results(list(args.results))
    if twice:
        raise UsageError(f"{twice[0]} and {twice[1]} are the same results: give each file once")
    datas = [results.load(p) for p in args.results]
    for path, data in zip(args.results, datas):
        if data.get("valid") is False:
            print(f"harness report: warning: {path} is marked invalid: {(data.get('invalid_reasons') or ['?'])[0]}",
                  file=sys.stderr)
    comparison = None
    if args.compare:
        if len(datas) != 2:
            raise UsageError("--compare needs exactly two results files")
        from ..serving import compare as cmp

        try:
            result = cmp.compare(datas[0], datas[1], allow=results.FINGERPRINT_FIELDS, min_repeats=1)
            comparison = cmp.format_table(result)
        except UsageError as exc:
            comparison = f"not compared: {exc}"
    page = render(list(args.results), datas, comparison)
    from ..atomic import write_text

    write_text(out, page)
    print(f"wrote {out}", file=sys.stderr)
    return 0
