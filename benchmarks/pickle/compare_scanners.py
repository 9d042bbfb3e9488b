"""check-dir --allow-pickle against picklescan, modelscan and fickling on the same files, same run.

    python benchmarks/pickle/compare_scanners.py [--scanners-python .venvs/scanners/bin/python]

Files: the rebuilt public corpora (benchmarks/pickle/corpus.py, each with its peer's own
expectation), the hand-made evasions of issue 12 (tests/pickle_evasions.py: all malicious), the
parser differentials of issue 23 (tests/pickle_differentials.py, one source per class: all
malicious, each proven to run under its loader by tests/test_pickle_differentials.py) and benign
Trainer leftovers. The three peers run in their own venv (scripts/lib.sh
ensure_scanners_venv) through their Python APIs, one process per tool. Writes
reports/pickle-scanners.md and .json: malicious refused / total per tool and source, benign
files with a safety error, errors and crashes. A peer "refuses" a file when it reports an issue
(picklescan: a dangerous global; modelscan: any issue; fickling: check-safety not clean).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(Path(__file__).parent)]

import corpus  # noqa: E402

_PEER_DRIVER = r'''
import contextlib, io, json, sys, traceback
tool, paths = sys.argv[1], json.load(sys.stdin)
out = {}
for path in paths:
    try:
        sink = io.StringIO()
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            if tool == "picklescan":
                from picklescan.scanner import scan_file_path
                r = scan_file_path(path)
                out[path] = {"flagged": r.issues_count > 0 or r.infected_files > 0, "error": bool(r.scan_err)}
            elif tool == "fickling":
                from fickling.cli import main
                rc = main(["fickling", "--check-safety", path])
                out[path] = {"flagged": rc == 1, "error": rc not in (0, 1)}
            elif tool == "modelscan":
                from modelscan.modelscan import ModelScan
                r = ModelScan().scan(path)
                out[path] = {"flagged": bool(r.get("issues")), "error": bool(r.get("errors"))}
    except BaseException as exc:
        out[path] = {"flagged": False, "error": True, "crash": f"{type(exc).__name__}: {exc}"[:200]}
json.dump(out, sys.stdout)
'''


def _gather(work: Path) -> list[dict]:
    """Every file to compare: {path, source, expect}."""
    corpus_dir = corpus.build()
    files = [{"path": str(corpus_dir / f["path"]), "source": f["peer"], "expect": f["expect"]}
             for f in corpus.load_manifest(corpus_dir)]
    import pickle_evasions
    for name, directory in pickle_evasions.build_all(work / "evasions").items():
        rel = {**pickle_evasions.EVASIONS, **pickle_evasions.CRASHERS}[name][0]
        files.append({"path": str(directory / rel), "source": "issue-12 evasions", "expect": "malicious"})
    import pickle_differentials
    for fixture in pickle_differentials.build_all(work / "differentials", work / "markers").values():
        files.append({"path": str(fixture.path), "source": f"issue-23 {fixture.klass}", "expect": "malicious"})
    from test_modeldir_pickle import _benign_dir
    benign = _benign_dir(work / "benign")
    for path in sorted(p for p in benign.rglob("*") if p.is_file() and p.suffix in (".bin", ".pt", ".pth")):
        files.append({"path": str(path), "source": "benign checkpoints", "expect": "benign"})
    return files


def _ours(files: list[dict], work: Path) -> dict[str, dict]:
    from harness.modeldir import check_dir

    out = {}
    for index, item in enumerate(files):
        one = work / "ours" / str(index)
        one.mkdir(parents=True)
        shutil.copy(item["path"], one / Path(item["path"]).name)
        try:
            report = check_dir(one, allow_pickle=True)
            errors = [f for f in report.findings if f.severity == "error" and f.code.startswith("safety.")]
            out[item["path"]] = {"flagged": bool(errors), "error": False, "codes": sorted({f.code for f in errors})}
        except Exception as exc:  # noqa: BLE001 - a crash is a result here
            out[item["path"]] = {"flagged": False, "error": True, "crash": f"{type(exc).__name__}: {exc}"}
    return out


def _peer(tool: str, python: str, files: list[dict], work: Path) -> dict[str, dict]:
    paths = [f["path"] for f in files]
    done = subprocess.run([python, "-c", _PEER_DRIVER, tool], input=json.dumps(paths), capture_output=True,
                          text=True, timeout=1800, cwd=work)  # fickling writes safety_results.json into cwd
    if done.returncode != 0:
        raise SystemExit(f"{tool} driver failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def _table(files: list[dict], results: dict[str, dict[str, dict]]) -> tuple[str, dict]:
    sources = sorted({f["source"] for f in files})
    summary: dict = {}
    lines = ["| tool | " + " | ".join(f"{s}: malicious refused" for s in sources)
             + " | all malicious refused | benign with a safety error | errors | crashes |",
             "|---|" + "---|" * (len(sources) + 4)]
    for tool, res in results.items():
        row, entry = [], {}
        for source in sources:
            mal = [f for f in files if f["source"] == source and f["expect"] == "malicious"]
            hit = sum(res[f["path"]]["flagged"] for f in mal)
            row.append(f"{hit}/{len(mal)}" if mal else "-")
            entry[source] = [hit, len(mal)]
        mal = [f for f in files if f["expect"] == "malicious"]
        ben = [f for f in files if f["expect"] == "benign"]
        hit = sum(res[f["path"]]["flagged"] for f in mal)
        fp = [f["path"] for f in ben if res[f["path"]]["flagged"]]
        errors = sum(bool(res[f["path"]].get("error")) for f in files)
        crashes = [f["path"] for f in files if res[f["path"]].get("crash")]
        entry.update(malicious=[hit, len(mal)], benign_flagged=fp, benign_total=len(ben), errors=errors,
                     crashes=crashes, missed=[f["path"] for f in mal if not res[f["path"]]["flagged"]])
        summary[tool] = entry
        lines.append(f"| {tool} | " + " | ".join(row) + f" | {hit}/{len(mal)} | {len(fp)}/{len(ben)} | {errors} | {len(crashes)} |")
    return "\n".join(lines), summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="compare check-dir with picklescan, modelscan, fickling")
    parser.add_argument("--scanners-python", type=lambda p: str(Path(p).absolute()),  # the peers run in a temp cwd
                        default=str(ROOT / ".venvs" / "scanners" / "bin" / "python"))
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "pickle-scanners")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        files = _gather(work)
        print(f"{len(files)} files", file=sys.stderr)
        results: dict[str, dict] = {}
        started = time.monotonic()
        results["check-dir --allow-pickle"] = _ours(files, work)
        timings = {"check-dir --allow-pickle": time.monotonic() - started}
        for tool in ("picklescan", "modelscan", "fickling"):
            if not Path(args.scanners_python).exists():
                print(f"no {args.scanners_python}: peers skipped", file=sys.stderr)
                break
            started = time.monotonic()
            results[tool] = _peer(tool, args.scanners_python, files, work)
            timings[tool] = time.monotonic() - started
            print(f"{tool}: {timings[tool]:.1f} s", file=sys.stderr)
        table, summary = _table(files, results)
        versions = subprocess.run([args.scanners_python, "-c", "import importlib.metadata as m; print({p: m.version(p) "
                                   "for p in ('picklescan', 'modelscan', 'fickling')})"], capture_output=True,
                                  text=True).stdout.strip() if Path(args.scanners_python).exists() else ""
        names = {f["path"]: str(Path(f["path"]).relative_to(work)) if f["path"].startswith(str(work)) else
                 str(Path(f["path"]).relative_to(corpus.default_dir())) for f in files}
        for entry in summary.values():
            entry["missed"] = [names[p] for p in entry["missed"]]
            entry["benign_flagged"] = [names[p] for p in entry["benign_flagged"]]
            entry["crashes"] = [names[p] for p in entry["crashes"]]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = (f"# Pickle scanners on the same {len(files)} files\n\nPeers: {versions}\n\n{table}\n\n"
            f"Seconds per tool: {json.dumps({k: round(v, 1) for k, v in timings.items()})}\n\nSkipped from the "
            f"corpora: {json.dumps(corpus.SKIPPED, indent=1)}\n\nMissed / benign flagged per tool:\n\n"
            + "\n".join(f"- {tool}: missed {e['missed']}; benign flagged {e['benign_flagged']}"
                        for tool, e in summary.items()) + "\n")
    args.out.with_suffix(".md").write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps({"files": len(files), "summary": summary,
                                                         "seconds": timings, "peers": versions}, indent=1))
    print(table)
    print(f"written: {args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
