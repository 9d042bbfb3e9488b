"""Gather what the GPU vLLM calls returned (each call's vres.tgz, unpacked) into the committed JSON
measurements/vllm_plan/h200-vllm-0.26.0.json, and print the must-show tables:

- plan vs logged KV cache tokens per start-up (tests/test_vllm_plan_gpu.py recomputes them),
- the harness's bench beside `vllm bench serve` (TTFT p50/p99, output tok/s, client lag, the
  server's own TTFT p50 from its /metrics histogram),
- the gate's A/A and A/B verdict counts per policy, and the serving suite's outcome.

    python benchmarks/vllm_plan/gpu_collect.py VRES_DIR [VRES_DIR ...] [--out OUT.json] [--raw OUT-raw.tgz]

The second hold (the pipeline of scripts/gpu/vllm_steps.sh, 0.25.1 beside 0.26.0) went to
h200-vllm-0.26.0-hold2.json: its install of the second version and the upgrade rehearsal's
comparison (the suite's upgrade.compare.json) are kept too.

Several VRES folders (the third hold ran on two machines: the first was given back while its gate
ran, a fresh one ran the gate and the last start-ups): the start-ups are gathered from all of them
(the first complete record of each id), every other step is taken from the first folder that has
it complete (serving-bench.json with every level, serving-gate.json, suite.txt), and `sources`
says which. `--raw` writes the tarball of the results files beside the JSON, one folder per
machine (machine1/, machine2/, ...): start-ups, their logs and probes, the bench's result files,
the gate's, the client's capacity run. Per request it drops what no figure is recomputed from
(the harness's chunk arrival list, kept as its length `chunks`; vllm bench's per-token `itls` and
`generated_texts`), so the tarball stays small.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import statistics
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.atomic import write_json  # noqa: E402
from harness.memory.vllm.vllm_logcheck import check_gpu_startup  # noqa: E402

OUT = ROOT / "measurements" / "vllm_plan" / "h200-vllm-0.26.0.json"


def load(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def suite_summary(vres: Path) -> dict | None:
    text = (vres / "suite.txt").read_text(errors="replace") if (vres / "suite.txt").is_file() else None
    if text is None:
        return None
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error|errors)", text.splitlines()[-2]
                                                if len(text.splitlines()) > 1 else "")}
    wall = re.search(r"wall (\d+) s", text)
    outcomes = re.findall(r"^(PASSED|FAILED|ERROR|SKIPPED) (\S+)(?: - (.*))?$", text, re.M)
    return {"counts": counts, "wall_s": int(wall.group(1)) if wall else None,
            "tests": [{"outcome": o, "test": t, "why": (w or "")[:300]} for o, t, w in outcomes]}


def plan_rows(startups: list[dict]) -> tuple[list[dict], dict]:
    rows = []
    for rec in startups:
        if rec["outcome"] == "timeout":  # cut by the hold's time before vLLM decided: no truth to check
            continue
        c = check_gpu_startup(rec)
        err = c.error * 100 if c.logged_tokens else None
        rows.append({"id": rec["id"], "model": rec["model"], "flags": " ".join(rec["argv"]),
                     "logged_tokens": c.logged_tokens, "predicted_tokens": c.predicted_tokens,
                     "error_pct": None if err is None else round(err, 2), "started": c.logged_started,
                     "predicted_starts": c.predicted_starts, "seconds": rec["seconds"]})
    errors = [abs(r["error_pct"]) for r in rows if r["error_pct"] is not None]
    summary = {"startups": len(rows), "median_abs_error_pct": round(statistics.median(errors), 2) if errors else None,
               "worst_abs_error_pct": round(max(errors), 2) if errors else None,
               "starts_matched": sum(r["started"] == r["predicted_starts"] for r in rows)}
    return rows, summary


BENCH_LEVELS = 5  # 1, 16, 64, 128, 256 (gpu_serving.CONCURRENCIES)


def _complete(vres: Path, step: str) -> bool:
    if step == "bench":
        bench = load(vres / "serving-bench.json")
        return bool(bench) and len(bench.get("rows") or []) >= BENCH_LEVELS
    return (vres / {"gate": "serving-gate.json", "suite": "suite.txt"}[step]).is_file()


def merge_startups(folders: list[Path]) -> tuple[list[dict], dict]:
    """Every folder's start-ups, in order; an id seen twice keeps its first complete record (a
    start cut by the hold's time is replaced by a later one that decided)."""
    out, where = {}, {}
    for i, vres in enumerate(folders):
        for rec in load(vres / "startups.json") or []:
            if rec["id"] not in out or (out[rec["id"]]["outcome"] == "timeout" and rec["outcome"] != "timeout"):
                out[rec["id"]], where[rec["id"]] = rec, i
    return list(out.values()), where


def collect(folders: list[Path]) -> dict:
    first = lambda name: next((v for v in folders if (v / name).is_file()), None)  # noqa: E731
    startups, where = merge_startups(folders)
    pick = {step: next((i for i, v in enumerate(folders) if _complete(v, step)), None)
            for step in ("bench", "gate", "suite")}
    gpu, install, models = first("gpu.csv"), first("install.txt"), first("models.txt")
    data = {"machine": (gpu / "gpu.csv").read_text().strip() if gpu else None,
            "vllm_version": "0.26.0", "install": (install / "install.txt").read_text().strip() if install else None,
            "models": [json.loads(line) for line in (models / "models.txt").read_text().splitlines()
                       if line.startswith("{")] if models else [],
            "startups": startups,
            "bench": load(folders[pick["bench"]] / "serving-bench.json") if pick["bench"] is not None else None,
            "gate": load(folders[pick["gate"]] / "serving-gate.json") if pick["gate"] is not None else None,
            "suite": suite_summary(folders[pick["suite"]]) if pick["suite"] is not None else None}
    if len(folders) > 1:  # which machine each figure came from (machine1 = the first folder)
        data["sources"] = {"startups": {sid: f"machine{i + 1}" for sid, i in where.items()}}
        data["sources"] |= {step: None if i is None else f"machine{i + 1}" for step, i in pick.items()}
    second = first("install2.txt")
    if second:  # the upgrade rehearsal's second version, and its comparison where the suite ran
        data["install_second"] = (second / "install2.txt").read_text().strip()
        upgrade = first("suite/serving/upgrade.compare.json")
        data["upgrade"] = load(upgrade / "suite" / "serving" / "upgrade.compare.json") if upgrade else None
    if data["bench"]:
        data["bench"].pop("server", None)
    return data


# the results files of a VRES folder the tarball keeps (gate/ only where its gate completed)
RAW_FILES = ("gpu.csv", "models.txt", "gptq.txt", "pipeline.log", "startups.json", "startups.txt", "p-startups.txt",
             "serving-bench.json", "p-bench.txt", "serving-gate.json", "p-gate.txt", "serving.txt", "suite.txt",
             "capacity.txt")
RAW_DIRS = ("startup-logs", "runs", "capacity")


def _slim(path: Path) -> bytes:
    """A results file without the per-token lists no figure is recomputed from."""
    if path.suffix != ".json":
        return path.read_bytes()
    data = json.loads(path.read_text())
    if isinstance(data, dict) and isinstance(data.get("runs"), list):  # the harness's results file
        for run in data["runs"]:
            for req in run.get("requests") or []:
                if "chunk_s" in req:
                    req["chunks"] = len(req.pop("chunk_s"))
            run.pop("server_timeseries", None)
    elif isinstance(data, dict) and "itls" in data:  # vllm bench serve --save-detailed
        data.pop("itls", None)
        data.pop("generated_texts", None)
    else:
        return path.read_bytes()
    return json.dumps(data, separators=(",", ":")).encode()


def write_raw(folders: list[Path], out: Path) -> None:
    with tarfile.open(out, "w:gz", compresslevel=9) as tar:
        for i, vres in enumerate(folders):
            root, files = f"machine{i + 1}", [vres / n for n in RAW_FILES if (vres / n).is_file()]
            for d in RAW_DIRS + (("gate",) if _complete(vres, "gate") else ()):
                files += sorted(p for p in (vres / d).rglob("*") if p.is_file() and p.suffix != ".svg"
                                and p.stat().st_size > 0)
            for path in files:
                blob = _slim(path)
                info = tarfile.TarInfo(f"{root}/{path.relative_to(vres)}")
                info.size, info.mtime, info.mode = len(blob), int(path.stat().st_mtime), 0o644
                tar.addfile(info, io.BytesIO(blob))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("vres", nargs="+", help="the unpacked /tmp/vres of each machine's last call, in order")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--raw", help="also write the results files into this .tgz")
    args = parser.parse_args()
    folders = [Path(v) for v in args.vres]
    data = collect(folders)
    write_json(Path(args.out), data, indent=1)
    if args.raw:
        write_raw(folders, Path(args.raw))
    rows, summary = plan_rows(data["startups"])
    for r in rows:
        err = "" if r["error_pct"] is None else f"{r['error_pct']:+.2f}%"
        print(f"{r['id']} {r['model']:<20} {r['flags']:<80} logged {r['logged_tokens']:>10,} predicted "
              f"{r['predicted_tokens']:>10,} {err:>8} started {r['started']}/{r['predicted_starts']}")
    print(json.dumps(summary))
    if data.get("sources"):
        print(json.dumps(data["sources"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
