"""`python -m harness report RESULTS.json [...] --out FILE.html`: one self-contained HTML page.

Bench results files make the serving page (two with --compare: the gate's comparison); a pytest
run's results JSON (reports/<suite>-<time>.json) re-renders that run's report; `--index DIR`
writes DIR/index.html, the list of every run there with trends.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..errors import UsageError


def add_arguments(parser) -> None:
    parser.add_argument("results", nargs="*",
                        help="bench results JSON files (schema_version 1), or one pytest run's results JSON")
    parser.add_argument("--out", help="HTML file to write (default with --index: DIR/index.html)")
    parser.add_argument("--compare", action="store_true",
                        help="with exactly two files: add the comparison table (baseline first); "
                             "fingerprint differences are shown, not refused")
    parser.add_argument("--title", help="page title (default: said from what the files are)")
    parser.add_argument("--index", metavar="DIR", help="write the index of every run in DIR (e.g. reports/)")


def _kind(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError, RecursionError):
        return None  # the loader below says what is wrong with it
    return data.get("kind") if isinstance(data, dict) else None


def _index_href(out: Path) -> str | None:
    for folder in (out.parent, out.parent.parent):
        if (folder / "index.html").is_file() and (folder / "index.html") != out:
            return os.path.relpath(folder / "index.html", out.parent).replace(os.sep, "/")
    return None


def _check_out(out: Path, given: str | None) -> None:
    """The page goes into a folder that exists and can be written: a mistyped path is refused,
    never created."""
    from . import check_writable

    check_writable(out, "--out")


def run(args) -> int:
    from ..atomic import write_text

    if args.index:
        from ..report import index

        folder = Path(args.index)
        if not folder.is_dir():
            raise UsageError(f"--index: {args.index!r} is not a directory")
        out = Path(args.out) if args.out else folder / "index.html"
        _check_out(out, args.out)
        write_text(out, index.render(folder))
        print(f"wrote {out}", file=sys.stderr)
        return 0
    if not args.results:
        raise UsageError("give results JSON files, or --index DIR")
    if not args.out:
        raise UsageError("--out FILE.html is required")
    out = Path(args.out)
    _check_out(out, args.out)
    kinds = [_kind(p) for p in args.results]
    if "pytest-run" in kinds:
        if len(args.results) != 1:
            raise UsageError("a pytest run's results JSON is rendered alone (one file)")
        from ..report import run_html, run_load

        data = run_load.load(args.results[0])
        page = run_html.render(data, index_href=_index_href(out))
    else:
        from ..report.bench_html import render
        from ..serving import results

        twice = results.same_results(list(args.results))
        if twice:
            raise UsageError(f"{twice[0]} and {twice[1]} are the same results: give each file once")
        datas = [results.load(p) for p in args.results]
        for path, data in zip(args.results, datas):
            if data.get("valid") is False:
                print(f"harness report: warning: {path} is marked invalid: "
                      f"{(data.get('invalid_reasons') or ['?'])[0]}", file=sys.stderr)
        if args.compare and len(datas) != 2:
            raise UsageError("--compare needs exactly two results files")
        page = render(list(args.results), datas, compare=args.compare, title=args.title,
                      index_href=_index_href(out))
    write_text(out, page)
    print(f"wrote {out}", file=sys.stderr)
    return 0
