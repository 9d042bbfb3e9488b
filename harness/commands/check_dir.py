"""`python -m harness check-dir DIR`: is a (merged) model directory complete, consistent, safe?"""

from __future__ import annotations

from . import print_verdict


def add_arguments(parser) -> None:
    parser.add_argument("directory", metavar="DIR", help="the model directory to check")
    parser.add_argument("--deep", action="store_true",
                        help="also read every tensor (in bounded memory): NaN, Inf, all-zero weights, tied lm_head")
    parser.add_argument("--json", action="store_true", help='print {"ok": bool, "findings": [...]} as JSON')
    parser.add_argument("--allow-remote-code", action="store_true",
                        help="report auto_map and Python files as warnings instead of errors (they are never run)")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="report pickle weights as warnings (dangerous imports stay errors; nothing is unpickled)")


def run(args) -> int:
    from ..errors import UsageError
    from ..modeldir import check_dir

    try:
        report = check_dir(args.directory, deep=args.deep, allow_remote_code=args.allow_remote_code,
                           allow_pickle=args.allow_pickle, progress=True)
    except UsageError as exc:  # harness.__main__ prints the JSON error object; these fields join it
        exc.json_fields = {"findings": [], "directory": str(args.directory)}
        raise
    return print_verdict(report, args.json, _print_text)


def _print_text(report) -> None:
    for f in report.findings:
        print(f"{f.severity.upper():7} {f.code:32} {f.path}: {f.message}")
    errors = len(report.errors)
    warnings = len(report.findings) - errors
    verdict = "OK" if report.ok else "REFUSED"
    mode = "headers and tensors" if report.deep else "headers only"
    print(f"{verdict}: {report.directory} ({errors} error(s), {warnings} warning(s); {mode}, "
          f"{report.bytes_read} bytes read)")
