"""The harness's bench beside `vllm bench serve`, and the regression gate, against the GPU vLLM.

One server A (gpu_startups.py's s05: random-weight qwen2.5-1.5b, utilization 0.9, max-model-len
4096, CUDA graphs), started through the harness's launcher with the HTTP-layer TTFT middleware
(harness/serving/http_ttft.py):

- bench: at each concurrency (1, 16, 64, 128, 256; 512 in / 128 out) `python3 -m harness bench`,
  then `vllm bench serve --backend openai` on the same server and workload; around each, the
  server's /metrics is read: vLLM's TTFT histogram (from the renderer's start to the engine
  output reaching the API process) and the middleware's `harness:http_ttft_seconds` (ASGI arrival
  to the first token chunk sent), each run's p50 interpolated from the buckets and its exact mean
  (_sum / _count). The harness's run also matches the middleware's stamps request by request:
  client TTFT - server HTTP TTFT is the client's own error (`server_http_ttft.client_excess_ms`),
  its send delay split at the client's `written_s` stamp into `client_write_ms` (the client's own
  send path) and `server_read_ms` (kernel and server up to the ASGI app), p50s on each `c=` line;
  vllm bench's requests are matched the same way (server_stamps.summarize, from its per-request
  ttfts: no send stamps, so no split).
  The client runs bench_workers(c) processes (at most 32 slots each: at c=256 4 workers sent
  64 requests each at t0 and lag p99 went over 10 ms; the server's API process and engine core
  need ~2-3 of the 16 cores). No ramp-up: `vllm bench serve --ramp-up-strategy` ramps a request
  *rate* (open loop), not closed-loop slots, so a harness-only ramp would make the two runs
  different workloads.
- gate: servers A (eager, --max-num-seqs 32 at concurrency 32) and B = A with --max-num-seqs 16
  (half the batch: a real slowdown) started side by side (0.3 of the card each), then rounds of
  A, B, A benches (the first B_PAIRS rounds), then A, A: 2 x PAIRS benches on A (the A/A pairs;
  the first B_PAIRS of them are also the A/B baselines), B_PAIRS on B; each pair compared under
  both policies (harness, vllm-ci), within --gate-time-s including both starts.

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
from harness.serving import metrics, server_stamps  # noqa: E402
from harness.serving.client import Target  # noqa: E402
from harness.serving.launcher import launch_vllm  # noqa: E402
from harness.serving.runner import BenchConfig, run_bench  # noqa: E402
from harness.serving.workload import Workload  # noqa: E402

CONCURRENCIES = (1, 16, 64, 128, 256)
PROMPTS = {1: 32, 16: 128, 64: 256, 128: 512, 256: 1024}
INPUT_LEN, OUTPUT_LEN = 512, 128
# One wave of 32 at A's batch of 32 (B serves it in two): hold 2's 64 prompts gave 4+4 pairs in
# 330 s. 3 runs per bench is compare's minimum (its Welch interval is over runs, not requests).
GATE_WORKLOAD = Workload(input_len=256, output_len=64, num_prompts=32, seed=5)
GATE_CONCURRENCY, GATE_REPEATS, GATE_WARMUP = 32, 3, 2
# The gate's 32 slots over 0.1 s, the same on both sides: at t0 all at once they were a burst of
# schedule lag (p50 1.4 ms, client-bound in 2 of 3 runs of hold 2) that the gate then discounts.
GATE_RAMP_S = 0.1
GATE_WORKERS, B_PAIRS = 1, 5
MAX_SLOTS_PER_WORKER, MAX_BENCH_WORKERS = 32, 8
# The gate's servers, eager (a start costs ~40 s, not ~100): B holds half of A's batch at the
# gate's concurrency, a real slowdown of every decode step.
GATE_A = {"gpu_memory_utilization": 0.3, "max_model_len": 2048, "enforce_eager": True, "max_num_seqs": 32}
GATE_B = {**GATE_A, "max_num_seqs": 16}
VLLM_TTFT, HTTP_TTFT = "vllm:time_to_first_token_seconds", "harness:http_ttft_seconds"
_LE = re.compile(r'le="([^"]+)"')


def bench_workers(c: int) -> int:
    """Client worker processes at concurrency c: 4 as in hold 2 (not client-bound up to 128 with
    32 slots per worker), more where a worker would hold more than 32 slots."""
    return min(c, MAX_BENCH_WORKERS, max(4, -(-c // MAX_SLOTS_PER_WORKER)))


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def metrics_text(base_url: str) -> str:
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as r:
        return r.read().decode()


def ttft_buckets(text: str, name: str = VLLM_TTFT) -> dict[float, float]:
    """Cumulative bucket counts of histogram `name` (upper bound in s -> count), summed over label
    sets (harness.serving.metrics.parse keeps only vLLM's TTFT sum and count)."""
    out: dict[float, float] = {}
    pattern = re.compile(r'^' + re.escape(name) + r'_bucket\{(?P<labels>[^}]*)\}\s+(?P<v>[\d.e+-]+)', re.M)
    for m in pattern.finditer(text):
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


def http_stamps(base_url: str, after: int) -> dict:
    """The middleware's stamps after sequence number `after` (http_ttft.py's GET endpoint)."""
    with urllib.request.urlopen(f"{base_url}/harness/http_ttft?after={after}", timeout=10) as r:
        return json.loads(r.read())


def http_ttft_exact(data: dict) -> dict:
    """Exact p50/p99/mean of the server's HTTP TTFT over the stamped requests (not the buckets')."""
    from harness.serving.stats import summary

    s = summary(x["ttft_s"] for x in data["requests"] if x.get("ttft_s") is not None)
    return {"p50_ms": s["p50"], "p99_ms": s["p99"], "mean_ms": s["mean"], "count": s["count"]}


def histogram_mean_ms(before: str, after: str, name: str) -> float | None:
    """The exact mean of histogram `name` over the requests between two /metrics texts."""
    def total(text: str, part: str) -> float:
        pattern = re.compile(r'^' + re.escape(f"{name}_{part}") + r'(?:\{[^}]*\})?\s+([\d.e+-]+)', re.M)
        return sum(float(v) for v in pattern.findall(text))

    count = total(after, "count") - total(before, "count")
    return round(1000 * (total(after, "sum") - total(before, "sum")) / count, 3) if count > 0 else None


def harness_bench(server, model_dir: Path, c: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "harness", "bench", "--endpoint", server.base_url, "--model", server.model,
           "--tokenizer", str(model_dir), "--input-len", str(INPUT_LEN), "--output-len", str(OUTPUT_LEN),
           "--num-prompts", str(PROMPTS[c]), "--concurrency", str(c), "--workers", str(bench_workers(c)),
           "--out", str(out), "-q"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    if not out.is_file():
        return {"error": (proc.stderr or proc.stdout)[-600:], "exit_code": proc.returncode}
    run = json.loads(out.read_text())["runs"][0]
    keep = ("ttft_ms", "tpot_ms", "output_throughput", "schedule_lag_ms", "loop_lag_ms", "client_bound",
            "client_bound_reasons", "workers", "completed", "failed", "duration_s", "server_metrics",
            "server_http_ttft")
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
                "--save-result", "--save-detailed", "--result-dir", str(self.out_dir), "--result-filename", name,
                "--request-id-prefix", f"vb-c{c}-"]
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
        # the random dataset's request i has id prefix + i, and the detailed lists are in request order
        ttfts = {f"vb-c{c}-{i}": t for i, (t, err) in enumerate(zip(data.get("ttfts") or [], data.get("errors") or []))
                 if not err and t}
        return {k: data.get(k) for k in keep} | {"_ttfts": ttfts}


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
    row = {"concurrency": c, "num_prompts": PROMPTS[c], "harness_workers": bench_workers(c)}
    for tool, fn in (("harness", lambda: harness_bench(server, model_dir, c, runs / f"harness-c{c}.json")),
                     ("vllm", lambda: vllm.run(c))):
        before, seq = metrics_text(server.base_url), http_stamps(server.base_url, 2**62)["seq"]
        started = time.monotonic()
        row[tool] = fn()
        row[tool]["wall_s"] = round(time.monotonic() - started, 1)
        after = metrics_text(server.base_url)
        stamps = http_stamps(server.base_url, seq)
        row[tool]["server_http_ttft_exact"] = http_ttft_exact(stamps)
        if "_ttfts" in row[tool]:  # vllm bench's own error per request, as the harness's run records it
            row[tool]["server_http_ttft"] = server_stamps.summarize(row[tool].pop("_ttfts"), None, stamps)
        # every request the server saw in the run, warm-up included (the clients' figures are not)
        for key, name in (("server_ttft", VLLM_TTFT), ("server_http_ttft", HTTP_TTFT)):
            b, a = ttft_buckets(before, name), ttft_buckets(after, name)
            row[tool][f"{key}_p50"] = histogram_quantile(b, a, 0.5)
            row[tool][f"{key}_p99"] = histogram_quantile(b, a, 0.99)
            row[tool][f"{key}_mean_ms"] = histogram_mean_ms(before, after, name)
    say(level_line(row))
    return row


def _f(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _matched_p50(run: dict) -> float | None:
    """The server's HTTP TTFT p50 over the client's own requests (warm-ups left out)."""
    return (((run.get("server_http_ttft") or {}).get("ttft_ms") or {}).get("p50")
            or (run.get("server_http_ttft_exact") or {}).get("p50_ms"))


def level_line(row: dict) -> str:
    """harness TTFT p50/p99, vllm bench's, the server's HTTP TTFT p50 and vLLM's histogram p50/mean
    in each client's run, both throughputs, the harness's lag, each client's excess over the
    server's HTTP TTFT, the harness's send delay and its split (client write, server read), and
    whether it was client-bound."""
    h, v = row["harness"], row["vllm"]
    ttft, lag = h.get("ttft_ms") or {}, h.get("schedule_lag_ms") or {}
    http = h.get("server_http_ttft") or {}
    excess, send, write, read = ((http.get(k) or {}).get("p50") for k in ("client_excess_ms", "send_delay_ms",
                                                                          "client_write_ms", "server_read_ms"))
    v_excess = ((v.get("server_http_ttft") or {}).get("client_excess_ms") or {}).get("p50")
    bound = h.get("client_bound")
    return (f"c={row['concurrency']}: TTFT p50/p99 harness {_f(ttft.get('p50'))}/{_f(ttft.get('p99'))} ms, "
            f"vllm bench {_f(v.get('median_ttft_ms'))}/{_f(v.get('p99_ttft_ms'))} ms | server HTTP TTFT p50 "
            f"{_f(_matched_p50(h))} (harness run) {_f(_matched_p50(v))} (vllm run) ms | vLLM histogram p50/mean {_f(h['server_ttft_p50'].get('ms'))}/"
            f"{_f(h['server_ttft_mean_ms'])} (harness run) {_f(v['server_ttft_p50'].get('ms'))}/"
            f"{_f(v['server_ttft_mean_ms'])} (vllm run) ms | out tok/s harness {_f(h.get('output_throughput'), 0)} "
            f"vllm {_f(v.get('output_throughput'), 0)} | harness lag p50/p99 {_f(lag.get('p50'), 2)}/"
            f"{_f(lag.get('p99'), 2)} ms, {row['harness_workers']} workers | client excess p50 harness "
            f"{_f(excess, 2)} vllm {_f(v_excess, 2)} ms | harness send delay p50 {_f(send, 2)} ms (client write "
            f"{_f(write, 2)}, server read {_f(read, 2)}) | "
            + ("CLIENT-BOUND: " + "; ".join(h.get("client_bound_reasons") or []) if bound
               else "not client-bound" if bound is False else "client-bound: unknown"))


def gate_bench(server, model_dir: Path, path: Path) -> dict:
    cfg = BenchConfig(target=Target(server.base_url, server.model, timeout_s=120), workload=GATE_WORKLOAD,
                      concurrencies=[GATE_CONCURRENCY], repeats=GATE_REPEATS, warmup=GATE_WARMUP,
                      tokenizer_dir=model_dir, out=path, environment=server.environment(), quiet=True,
                      workers=GATE_WORKERS, ramp_up_s=GATE_RAMP_S)
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


def gate_plan(pairs: int) -> list[str]:
    """The order of the gate's benches: A, B, A rounds while A/B pairs are wanted, then A, A; cut
    anywhere, what was run still makes whole pairs of both kinds."""
    return [side for i in range(pairs) for side in (("A", "B", "A") if i < B_PAIRS else ("A", "A"))]


def gate_step(model_dir: Path, model: str, out: Path, pairs: int, deadline: float) -> None:
    import contextlib
    from concurrent.futures import ThreadPoolExecutor

    files, gate_dir, started = {"A": [], "B": []}, out / "gate", time.monotonic()
    gate_dir.mkdir(exist_ok=True)
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(2) as pool:
        # side by side: their start-ups profile at the same time, so neither is a plan check
        starts = [pool.submit(stack.enter_context, launch_vllm(sys.executable, model_dir, flag_args(flags),
                                                              log_dir=out / "logs", served_model_name=model,
                                                              startup_timeout_s=240))
                  for flags in (GATE_A, GATE_B)]
        servers = dict(zip("AB", (f.result() for f in starts)))
        say(f"gate: A ({' '.join(flag_args(GATE_A))}) and B ({' '.join(flag_args(GATE_B))}) ready after "
            f"{time.monotonic() - started:.0f} s")
        longest = 0.0
        for side in gate_plan(pairs):
            if time.monotonic() + longest > deadline:
                say(f"gate: out of time before bench {len(files['A']) + len(files['B']) + 1}")
                break
            files[side].append(gate_dir / f"{side}-{len(files[side]):02d}.json")
            one = time.monotonic()
            gate_bench(servers[side], model_dir, files[side][-1])
            longest = max(longest, time.monotonic() - one)
        say(f"gate: {len(files['A'])} A and {len(files['B'])} B benches in {time.monotonic() - started:.0f} s "
            f"(starts included; longest bench {longest:.1f} s)")
    result = gate_table(files["A"], files["B"], pairs)
    result |= {"workload": GATE_WORKLOAD.to_json(), "concurrency": GATE_CONCURRENCY, "repeats": GATE_REPEATS,
               "ramp_up_s": GATE_RAMP_S, "workers": GATE_WORKERS, "a": flag_args(GATE_A), "b": flag_args(GATE_B),
               "wall_s": round(time.monotonic() - started, 1)}
    write_json(out / "serving-gate.json", result, indent=1)
    for row in result["table"]:
        say(f"gate {row['comparison']} {row['policy']}: regressed {row['regressed']}/{row['pairs']}")
    say(summary_line(result))


def summary_line(result: dict) -> str:
    """One line: regressed counts per policy and comparison (A/A should be ~0, A/B all)."""
    per = {}
    for row in result["table"]:
        per.setdefault(row["policy"], []).append(f"{row['comparison']} {row['regressed']}/{row['pairs']}")
    return ("gate summary (regressed): " + " | ".join(f"{policy} " + ", ".join(v) for policy, v in per.items())
            + f" ({result['wall_s']:.0f} s)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="/tmp/vmodels")
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", default="bench,gate")
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--time-limit-s", type=float, default=660, help="both steps together")
    parser.add_argument("--gate-time-s", type=float, default=300, help="the gate step, both server starts included")
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
                         served_model_name=model, startup_timeout_s=300, http_ttft=True) as server:
            append(out / "startups.json", startup_record("s05", model_dir, flags, True, "started",
                                                         round(time.monotonic() - started, 1), None, 0,
                                                         server.log_text(), free, total))
            bench_step(server, model_dir, out)
    if "gate" in steps:
        gate_step(model_dir, model, out, args.pairs, min(deadline, time.monotonic() + args.gate_time_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
