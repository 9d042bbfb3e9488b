"""check-dir on the directory-level cases of issue 43, the peers beside it, and its reading time.

    python benchmarks/modeldir/directory_cases.py [--scanners-python .venvs/scanners/bin/python]
        [--out measurements/modeldir/directory] [--big-7b]

Cases: tests/modeldir_cases.py (code paths, safetensors headers, chat templates, values, parsers,
layouts), each built from the tiny qwen2 model; "malicious" ones are those a loader runs code
for, refuses or mis-reads, the others are their healthy twins. Per class: refused / total and
false alarms on the twins, for check-dir (default check) and for the peers (picklescan,
modelscan, fickling on every file; ModelAudit where the scanners venv has it), one process per
peer. A peer "refuses" a directory when it reports any issue.

Timing (the machine's load average is written beside it): `python -m harness check-dir` as a
user runs it (a fresh process: imports included; best of 3 of wall and of CPU seconds, the
process and its children; cold = HARNESS_CACHE_DIR an empty folder, so the verdict cache is
empty; warm = the directory checked before with the same cache) on the healthy tiny qwen2
directory (config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
generation_config.json, chat_template.jinja) and on the sparse 100 GiB case; with --big-7b also on
a 13.5 GB three-shard Llama-2-7B layout whose shards hold data only where check-dir samples (the
rest are holes: check-dir reads the same bytes either way, and no 15 GB has to be written). On a
shared machine the CPU seconds are the figure to read; wall seconds grow with the load.
--timing-only builds only the directories it times and skips the cases and the peers.
Writes OUT.md and OUT.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from modeldir_cases import CASES, build_case  # noqa: E402

_PEER_DRIVER = r'''
import contextlib, io, json, os, sys
tool, dirs = sys.argv[1], json.load(sys.stdin)
out = {}
for d in dirs:
    try:
        sink = io.StringIO()
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            if tool == "picklescan":
                from picklescan.scanner import scan_directory_path
                r = scan_directory_path(d)
                out[d] = {"flagged": r.issues_count > 0 or r.infected_files > 0, "error": bool(r.scan_err)}
            elif tool == "modelscan":
                from modelscan.modelscan import ModelScan
                r = ModelScan().scan(d)
                out[d] = {"flagged": bool(r.get("issues")), "error": bool(r.get("errors"))}
            elif tool == "fickling":
                from fickling.cli import main
                flagged = error = False
                for base, _, names in os.walk(d):
                    for name in names:
                        p = os.path.join(base, name)
                        if os.path.isfile(p):
                            rc = main(["fickling", "--check-safety", p])
                            flagged |= rc == 1
                out[d] = {"flagged": flagged, "error": error}
            elif tool == "modelaudit":
                from modelaudit.core import scan_model_directory_or_file
                r = scan_model_directory_or_file(d)
                issues = r.get("issues", []) if isinstance(r, dict) else getattr(r, "issues", [])
                out[d] = {"flagged": bool(issues), "error": False}
    except BaseException as exc:
        out[d] = {"flagged": False, "error": True, "crash": f"{type(exc).__name__}: {exc}"[:200]}
json.dump(out, sys.stdout)
'''
PEERS = ("picklescan", "modelscan", "fickling", "modelaudit")


def _ours(dirs: dict[str, Path]) -> dict[str, dict]:
    from harness.modeldir import check_dir

    got = {}
    for name, d in dirs.items():
        start = time.monotonic()
        report = check_dir(d)
        got[name] = {"flagged": not report.ok, "errors": sorted({f.code for f in report.errors}),
                     "seconds": round(time.monotonic() - start, 3), "bytes_read": report.bytes_read}
    return got


def _peer(tool: str, python: str, dirs: dict[str, Path], cwd: Path) -> dict[str, dict] | None:
    probe = subprocess.run([python, "-c", f"import {tool}"], capture_output=True)
    if probe.returncode:
        return None
    run = subprocess.run([python, "-c", _PEER_DRIVER, tool], input=json.dumps([str(d) for d in dirs.values()]),
                         capture_output=True, text=True, cwd=cwd, timeout=1800)
    try:
        by_path = json.loads(run.stdout)
    except json.JSONDecodeError:
        return {name: {"flagged": False, "error": True, "crash": run.stderr[-200:]} for name in dirs}
    return {name: by_path.get(str(d), {"flagged": False, "error": True}) for name, d in dirs.items()}


def _cli_seconds(d: Path, work: Path, repeat: int = 3) -> dict:
    """`cold`: each run with its own empty HARNESS_CACHE_DIR (a first check: nothing judged before);
    `warm`: the same directory again with a cache one run filled (harness.modeldir.verdict_cache)."""
    cold = [_run_once(d, {"HARNESS_CACHE_DIR": tempfile.mkdtemp(prefix="cold-", dir=work)}) for _ in range(repeat)]
    warm_cache = tempfile.mkdtemp(prefix="warm-", dir=work)
    _run_once(d, {"HARNESS_CACHE_DIR": warm_cache})  # fills the cache
    warm = [_run_once(d, {"HARNESS_CACHE_DIR": warm_cache}) for _ in range(repeat)]
    return {"cold": _best(cold), "warm": _best(warm)}


def _run_once(d: Path, env: dict) -> dict:
    """One fresh `check-dir` process: wall seconds, CPU seconds (user + system, its reading children
    included: they do not depend on what else the machine runs), the 1-minute load average."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "harness", "check-dir", str(d)], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "HARNESS_CHECKDIR_CACHE": "1", **env})
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    verdict = (run.stdout.strip().splitlines() or [""])[-1].split(":", 1)[0]
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "load_average": round(os.getloadavg()[0], 2),
            "exit": run.returncode, "verdict": verdict}


def _best(runs: list[dict]) -> dict:
    """Best of the runs, wall and CPU each (the lowest is the least disturbed by other work), the
    load average during each run and every run as measured."""
    return {"wall_s": min(r["wall_s"] for r in runs), "cpu_s": min(r["cpu_s"] for r in runs),
            "load_average": [r["load_average"] for r in runs], "verdicts": sorted({r["verdict"] for r in runs}),
            "runs": runs}


def _table(results: dict[str, dict[str, dict] | None]) -> tuple[str, dict]:
    tools = [t for t, r in results.items() if r is not None]
    classes = list(dict.fromkeys(c.klass for c in CASES))
    rows = ["| class | cases (bad + twins) | " + " | ".join(f"{t} refused / false alarms" for t in tools) + " |",
            "|---|---|" + "---|" * len(tools)]
    summary: dict = {}
    for klass in classes + ["all"]:
        cases = [c for c in CASES if klass in ("all", c.klass)]
        bad = [c for c in cases if c.malicious]
        twins = [c for c in cases if not c.malicious]
        cells = []
        for tool in tools:
            refused = sum(results[tool][c.name]["flagged"] for c in bad)
            alarms = sum(results[tool][c.name]["flagged"] for c in twins)
            summary.setdefault(klass, {})[tool] = {"refused": refused, "bad": len(bad), "false_alarms": alarms,
                                                   "twins": len(twins)}
            cells.append(f"{refused}/{len(bad)} / {alarms}/{len(twins)}")
        rows.append(f"| {klass} | {len(bad)} + {len(twins)} | " + " | ".join(cells) + " |")
    return "\n".join(rows), summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scanners-python", type=lambda p: str(Path(p).absolute()),
                        default=str(ROOT / ".venvs" / "scanners" / "bin" / "python"))
    parser.add_argument("--out", type=Path, default=ROOT / "measurements" / "modeldir" / "directory")
    parser.add_argument("--big-7b", action="store_true", help="also time a 13.5 GB sharded 7B layout (sparse-backed)")
    parser.add_argument("--timing-only", action="store_true", help="skip the peers")
    args = parser.parse_args(argv)

    from harness.models import tiny_model_dir

    base = tiny_model_dir("qwen2")
    work = Path(tempfile.mkdtemp(prefix="checkdir-cases-"))
    try:
        chosen = [c for c in CASES if not args.timing_only or c.name == "sparse_100gib_tensor"]
        dirs = {c.name: build_case(c, base, work) for c in chosen}
        results: dict[str, dict | None] = {}
        if not args.timing_only:
            results["check-dir"] = _ours(dirs)
            for tool in PEERS:
                results[tool] = _peer(tool, args.scanners_python, dirs, work) if Path(args.scanners_python).exists() else None
        table, summary = _table(results) if results else ("", {})
        timing = {"load_average_before": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
                  "five_file_dir": _cli_seconds(base, work), "sparse_100gib": _cli_seconds(dirs["sparse_100gib_tensor"], work)}
        if args.big_7b:
            import big_layout

            timing["sharded_7b_13gb"] = _cli_seconds(big_layout.build(work / "llama-7b"), work)
        timing["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    missing = [t for t, r in results.items() if r is None]
    cases = (f"{table}\n\nCells: bad cases refused / total, then healthy twins flagged / total. Peers not installed: "
             f"{', '.join(missing) or 'none'}.\n\n") if results else ""
    text = f"# check-dir on the directory-level cases (issue 43)\n\n{cases}{_timing_table(timing)}"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps({"summary": summary, "timing": timing, "results": results},
                                                        indent=1))
    print(text)
    return 0


def _timing_table(timing: dict) -> str:
    names = {"five_file_dir": "tiny qwen2 directory (6 files)", "sparse_100gib": "sparse 100 GiB tensor",
             "sharded_7b_13gb": "Llama-2-7B, 3 shards, 13.5 GB"}
    rows = ["| directory | cold CPU s | cold wall s | warm CPU s | warm wall s | load (1 min) during cold runs |",
            "|---|---|---|---|---|---|"]
    for key, label in names.items():
        if key in timing:
            cold, warm = timing[key]["cold"], timing[key]["warm"]
            rows.append(f"| {label} | {cold['cpu_s']} | {cold['wall_s']} | {warm['cpu_s']} | {warm['wall_s']} | "
                        f"{', '.join(map(str, cold['load_average']))} |")
    return ("Timing: `python -m harness check-dir DIR`, a fresh process each, best of 3 (CPU = user + system of "
            f"the process and its children); {timing['cpus']} CPUs, load average before "
            f"{timing['load_average_before']}, after {timing['load_average_after']}.\n\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    sys.exit(main())
