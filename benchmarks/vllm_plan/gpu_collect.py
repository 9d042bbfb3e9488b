"""Gather what the GPU vLLM calls returned (each call's vres.tgz, unpacked) into the committed JSON
benchmarks/vllm_plan/measured/h200-vllm-0.26.0.json, and print the must-show tables:

- plan vs logged KV cache tokens per start-up (tests/test_vllm_plan_gpu.py recomputes them),
- the harness's bench beside `vllm bench serve` (TTFT p50/p99, output tok/s, client lag, the
  server's own TTFT p50 from its /metrics histogram),
- the gate's A/A and A/B verdict counts per policy, and the serving suite's outcome.

    python benchmarks/vllm_plan/gpu_collect.py VRES_DIR [--out benchmarks/vllm_plan/measured/h200-vllm-0.26.0.json]

The second hold (the pipeline of scripts/gpu/vllm_steps.sh, 0.25.1 beside 0.26.0) went to
h200-vllm-0.26.0-hold2.json: its install of the second version and the upgrade rehearsal's
comparison (the suite's upgrade.compare.json) are kept too.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.atomic import write_json  # noqa: E402
from harness.memory.vllm_logcheck import check_gpu_startup  # noqa: E402

OUT = ROOT / "benchmarks" / "vllm_plan" / "measured" / "h200-vllm-0.26.0.json"


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("vres", help="the unpacked /tmp/vres of the last call")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    vres = Path(args.vres)
    startups = load(vres / "startups.json") or []
    data = {"machine": (vres / "gpu.csv").read_text().strip() if (vres / "gpu.csv").is_file() else None,
            "vllm_version": "0.26.0", "install": (vres / "install.txt").read_text().strip()
            if (vres / "install.txt").is_file() else None,
            "models": [json.loads(line) for line in (vres / "models.txt").read_text().splitlines()
                       if line.startswith("{")] if (vres / "models.txt").is_file() else [],
            "startups": startups, "bench": load(vres / "serving-bench.json"), "gate": load(vres / "serving-gate.json"),
            "suite": suite_summary(vres)}
    if (vres / "install2.txt").is_file():  # the upgrade rehearsal's second version, and its comparison
        data["install_second"] = (vres / "install2.txt").read_text().strip()
        data["upgrade"] = load(vres / "suite" / "serving" / "upgrade.compare.json")
    if data["bench"]:
        data["bench"].pop("server", None)
    write_json(Path(args.out), data, indent=1)
    rows, summary = plan_rows(startups)
    for r in rows:
        err = "" if r["error_pct"] is None else f"{r['error_pct']:+.2f}%"
        print(f"{r['id']} {r['model']:<20} {r['flags']:<80} logged {r['logged_tokens']:>10,} predicted "
              f"{r['predicted_tokens']:>10,} {err:>8} started {r['started']}/{r['predicted_starts']}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
