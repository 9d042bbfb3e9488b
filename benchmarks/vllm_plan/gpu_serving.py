"""The harness's bench beside `vllm bench serve`, and the regression gate, against the GPU vLLM.

One server A (gpu_startups.py's s05: random-weight qwen2.5-1.5b, utilization 0.9, max-model-len
4096, CUDA graphs), started through the harness's launcher:

- bench: at each concurrency (1, 16, 64, 128, 256; 512 in / 128 out) `python3 -m harness bench`,
  then `vllm bench serve --backend openai` on the same server and workload; around each, the
  server's /metrics TTFT histogram is read, and its p50 over that run is interpolated from the
  buckets (what the server saw, without the client).
  The server's mean TTFT over the run is exact (the histogram's _sum / _count).
  The client runs BENCH_WORKERS processes: the server's own API process and engine core need
  cores of the same 16 (auto would take 15 while the server is idle).
- gate: servers A (eager, --max-num-seqs 32 at concurrency 32) and B = A with --max-num-seqs 16
  (half the batch: a real slowdown) started side by side (0.3 of the card each), then rounds of
  A, B, A benches: 2 x PAIRS on A (the A/A pairs and the A/B baselines), B_PAIRS on B; each pair
  compared under both policies (harness, vllm-ci).

    python3 benchmarks/vllm_plan/gpu_serving.py --models /tmp/vmodels --out OUT [--steps bench,gate]
Writes OUT/serving-bench.json, OUT/serving-gate.json (rewritten after every step), the bench
result files under OUT/runs/ and A's start-up record appended to OUT/startups.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_startups import SETTINGS, append, flag_args, startup_record  # noqa: E402
from harness.atomic import write_json  # noqa: E402
from harness.serving import compare as cmp  # noqa: E402
from harness.serving import metrics  # noqa: E402
from harness.serving.client import Target  # noqa: E402
from harness.serving.launcher import launch_vllm  # noqa: E402
from harness.serving.runner import BenchConfig, run_bench  # noqa: E402
from harness.serving.workload import Workload  # noqa: E402

CONCURRENCIES = (1, 16, 64, 128, 256)
PROMPTS = {1: 32, 16: 128, 64: 256, 128: 512, 256: 1024}
INPUT_LEN, OUTPUT_LEN = 512, 128
GATE_WORKLOAD = Workload(input_len=256, output_len=64, num_prompts=64, seed=5)
GATE_CONCURRENCY, GATE_REPEATS = 32, 3
BENCH_WORKERS, GATE_WORKERS, B_PAIRS = 4, 2, 5
# The gate's servers, eager (a start costs ~40 s, not ~100): B holds half of A's batch at the
# gate's concurrency, a real slowdown of every decode step.
GATE_A = {"gpu_memory_utilization": 0.3, "max_model_len": 2048, "enforce_eager": True, "max_num_seqs": 32}
GATE_B = {**GATE_A, "max_num_seqs": 16}
_BUCKET = re.compile(r'^vllm:time_to_first_token_seconds_bucket\{(?P<labels>[^}]*)\}\s+(?P<v>[\d.e+-]+)', re.M)
_LE = re.compile(r'le="([^"]+)"')


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def metrics_text(base_url: str) -> str:
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as r:
        return r.read().decode()


def ttft_buckets(text: str) -> dict[float, float]:
    """Cumulative TTFT bucket counts (upper bound in s -> count), summed over label sets
    (harness.serving.metrics.parse keeps only the histogram's sum and count)."""
    out: dict[float, float] = {}
    for m in _BUCKET.finditer(text):
        le = _LE.search(m.group("labels"))
        if le:
            bound = float("inf") if le.group(1) == "+Inf" else float(le.group(1))
            out[bound] = out.get(bound, 0.0) + float(m.group("v"))
    return out


def histogram_quantile(before: dict, after: dict, q: float) -> dict:
    """Prometheus-style quantile of the requests between two snapshots (linear within a bucket)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return {"ms": None, "count": 0}
    rank, prev_bound, prev_count = q * total, 0.0, 0.0
    for bound, count in zip(bounds, counts):
        if count >= rank:
            if bound == float("inf"):
                return {"ms": prev_bound * 1000, "count": total, "bucket_ms": [prev_bound * 1000, None]}
            share = (rank - prev_count) / (count - prev_count) if count > prev_count else 0.0
            return {"ms": 1000 * (prev_bound + share * (bound - prev_bound)), "count": total,
                    "bucket_ms": [prev_bound * 1000, bound * 1000]}
        prev_bound, prev_count = bound, count
    return {"ms": None, "count": total}


def harness_bench(server, model_dir: Path, c: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "harness", "bench", "--endpoint", server.base_url, "--model", server.model,
           "--tokenizer", str(model_dir), "--input-len", str(INPUT_LEN), "--output-len", str(OUTPUT_LEN),
           "--num-prompts", str(PROMPTS[c]), "--concurrency", str(c), "--workers", str(BENCH_WORKERS),
           "--out", str(out), "-q"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    if not out.is_file():
        return {"error": (proc.stderr or proc.stdout)[-600:], "exit_code": proc.returncode}
    run = json.loads(out.read_text())["runs"][0]
    keep = ("ttft_ms", "tpot_ms", "output_throughput", "schedule_lag_ms", "loop_lag_ms", "client_bound",
            "client_bound_reasons", "workers", "completed", "failed", "duration_s", "server_metrics")
    return {k: run.get(k) for k in keep} | {"exit_code": proc.returncode, "stderr_tail": proc.stderr[-300:]}


class VllmBench:
    """`vllm bench serve`, one persistent process for every level (vllm_bench_levels.py)."""

    def __init__(self, server, model_dir: Path, out_dir: Path):
        self.server, self.model_dir, self.out_dir = server, model_dir, out_dir
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("vllm_bench_levels.py"))],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(out_dir / "vllm-bench.log", "ab"),
                                     text=True, cwd=ROOT)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def run(self, c: int) -> dict:
        name = f"vllm-bench-c{c}.json"
        argv = ["--backend", "openai", "--base-url", self.server.base_url, "--model", self.server.model,
                "--tokenizer", str(self.model_dir), "--dataset-name", "random", "--random-input-len", str(INPUT_LEN),
                "--random-output-len", str(OUTPUT_LEN), "--num-prompts", str(PROMPTS[c]), "--max-concurrency", str(c),
                "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99",
                "--save-result", "--result-dir", str(self.out_dir), "--result-filename", name]
        self.proc.stdin.write(" ".join(shlex.quote(a) for a in argv) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        reply = json.loads(line) if line.strip() else {"error": f"vllm_bench_levels.py ended (exit {self.proc.poll()})"}
        path = self.out_dir / name
        if "error" in reply or not path.is_file():
            return {"error": reply.get("error", "no result file")}
        data = json.loads(path.read_text())
        keep = ("completed", "duration", "output_throughput", "median_ttft_ms", "p99_ttft_ms", "mean_ttft_ms",
                "median_tpot_ms", "p99_tpot_ms", "total_input_tokens", "total_output_tokens")
        return {k: data.get(k) for k in keep}


def bench_step(server, model_dir: Path, out: Path) -> None:
    rows, runs = [], out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    vllm = VllmBench(server, model_dir, runs)
    try:
        for c in CONCURRENCIES:
            rows.append(bench_level(server, model_dir, c, runs, vllm))
            write_json(out / "serving-bench.json", {"input_len": INPUT_LEN, "output_len": OUTPUT_LEN, "rows": rows,
                                                    "server": server.environment()}, indent=1, default=str)
    finally:
        vllm.close()


def bench_level(server, model_dir: Path, c: int, runs: Path, vllm: VllmBench) -> dict:
    """One concurrency: the harness's bench, then vLLM's, each between two reads of /metrics."""
    row = {"concurrency": c, "num_prompts": PROMPTS[c]}
    for tool, fn in (("harness", lambda: harness_bench(server, model_dir, c, runs / f"harness-c{c}.json")),
                     ("vllm", lambda: vllm.run(c))):
        before = metrics_text(server.base_url)
        started = time.monotonic()
        row[tool] = fn()
        row[tool]["wall_s"] = round(time.monotonic() - started, 1)
        after = metrics_text(server.base_url)
        row[tool]["server_ttft_p50"] = histogram_quantile(ttft_buckets(before), ttft_buckets(after), 0.5)
        row[tool]["server_ttft_p99"] = histogram_quantile(ttft_buckets(before), ttft_buckets(after), 0.99)
        # every request the server saw in the run, warm-up included (the clients' means are not)
        mean = metrics.delta(metrics.parse(before), metrics.parse(after))["ttft_mean_ms"]
        row[tool]["server_ttft_mean_ms"] = None if mean is None else round(mean, 3)
    h, v = row["harness"], row["vllm"]
    say(f"c={c}: harness ttft p50 {(h.get('ttft_ms') or {}).get('p50')} ms (server "
        f"{h['server_ttft_p50'].get('ms')}), {h.get('output_throughput')} tok/s, lag {h.get('schedule_lag_ms')}"
        f" | vllm bench ttft p50 {v.get('median_ttft_ms')} ms (server {v['server_ttft_p50'].get('ms')}), "
        f"{v.get('output_throughput')} tok/s")
    return row


def gate_bench(server, model_dir: Path, path: Path) -> dict:
    cfg = BenchConfig(target=Target(server.base_url, server.model, timeout_s=120), workload=GATE_WORKLOAD,
                      concurrencies=[GATE_CONCURRENCY], repeats=GATE_REPEATS, warmup=4, tokenizer_dir=model_dir,
                      out=path, environment=server.environment(), quiet=True, workers=GATE_WORKERS)
    return run_bench(cfg)


def verdict_line(result) -> str:
    bad = sorted(f"{c.metric} {100 * c.change:+.0f}%" for c in result.changes if c.verdict == "regressed")
    bad += [b for b in result.behaviours if b.startswith("REGRESSION")]
    return "REGRESSED: " + ", ".join(bad) if bad else "pass"


def gate_table(a_files: list[Path], b_files: list[Path], pairs: int) -> dict:
    load = lambda p: json.loads(p.read_text())  # noqa: E731
    groups = {"A/A": [(a_files[2 * i], a_files[2 * i + 1]) for i in range(min(pairs, len(a_files) // 2))],
              "A/B": [(a_files[2 * i], b_files[i]) for i in range(min(pairs, len(a_files) // 2, len(b_files)))]}
    table, detail = [], []
    for kind, items in groups.items():
        for policy in cmp.POLICIES:
            regressed = 0
            for base, cand in items:
                result = cmp.compare(load(base), load(cand), allow=("flags",), policy=policy)
                regressed += result.regressed
                detail.append({"pair": kind, "policy": policy, "baseline": base.name, "candidate": cand.name,
                               "verdict": verdict_line(result)})
            table.append({"comparison": kind, "policy": policy, "regressed": regressed, "pairs": len(items)})
    return {"table": table, "pairs": detail}


def gate_step(model_dir: Path, model: str, out: Path, pairs: int, deadline: float) -> None:
    import contextlib
    from concurrent.futures import ThreadPoolExecutor

    a_files, b_files, gate_dir = [], [], out / "gate"
    gate_dir.mkdir(exist_ok=True)
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(2) as pool:
        # side by side: their start-ups profile at the same time, so neither is a plan check
        starts = [pool.submit(stack.enter_context, launch_vllm(sys.executable, model_dir, flag_args(flags),
                                                              log_dir=out / "logs", served_model_name=model,
                                                              startup_timeout_s=240))
                  for flags in (GATE_A, GATE_B)]
        server_a, server_b = (f.result() for f in starts)
        say(f"gate: A ({' '.join(flag_args(GATE_A))}) and B ({' '.join(flag_args(GATE_B))}) ready")
        for i in range(pairs):
            plan = [("A", server_a, a_files), ("B", server_b, b_files), ("A", server_a, a_files)]
            for side, server, files in plan if i < B_PAIRS else plan[::2]:
                if time.monotonic() > deadline - 15:
                    break
                files.append(gate_dir / f"{side}-{len(files):02d}.json")
                gate_bench(server, model_dir, files[-1])
        say(f"gate: {len(a_files)} A and {len(b_files)} B benches")
    result = gate_table(a_files, b_files, pairs)
    result |= {"workload": GATE_WORKLOAD.to_json(), "concurrency": GATE_CONCURRENCY, "repeats": GATE_REPEATS,
               "workers": GATE_WORKERS, "a": flag_args(GATE_A), "b": flag_args(GATE_B)}
    write_json(out / "serving-gate.json", result, indent=1)
    for row in result["table"]:
        say(f"gate {row['comparison']} {row['policy']}: regressed {row['regressed']}/{row['pairs']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="/tmp/vmodels")
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", default="bench,gate")
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--time-limit-s", type=float, default=540)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to try the script on a CPU build")
    parser.add_argument("--flags", help="server flags instead of s05's (JSON object), e.g. for a CPU build")
    args = parser.parse_args()
    if args.smoke:
        global CONCURRENCIES, PROMPTS, INPUT_LEN, OUTPUT_LEN, GATE_WORKLOAD, GATE_CONCURRENCY
        CONCURRENCIES, PROMPTS, INPUT_LEN, OUTPUT_LEN = (1, 2), {1: 3, 2: 4}, 32, 8
        GATE_WORKLOAD, GATE_CONCURRENCY = Workload(input_len=32, output_len=4, num_prompts=6, seed=5), 2
    out, steps = Path(args.out), args.steps.split(",")
    deadline = time.monotonic() + args.time_limit_s
    out.mkdir(parents=True, exist_ok=True)
    model, flags = SETTINGS["s05"]
    flags = json.loads(args.flags) if args.flags else flags
    model_dir = Path(args.models) / model
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    if "bench" in steps:
        from gpu_startups import cuda_memory

        free, total = cuda_memory()
        started = time.monotonic()
        with launch_vllm(sys.executable, model_dir, flag_args(flags), log_dir=out / "logs",
                         served_model_name=model, startup_timeout_s=300) as server:
            append(out / "startups.json", startup_record("s05", model_dir, flags, True, "started",
                                                         round(time.monotonic() - started, 1), None, 0,
                                                         server.log_text(), free, total))
            bench_step(server, model_dir, out)
    if "gate" in steps:
        gate_step(model_dir, model, out, args.pairs, deadline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
