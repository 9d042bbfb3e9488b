"""How often the regression gate is wrong on a noisy machine (the serving issue's must-show).

On this machine, with a CPU hog running beside the server and the client the whole time:

- A/A: the same vLLM server (CPU build, tiny model), the same workload, benched twice per pair;
  the gate must say "regressed" in at most 1 of 10 pairs.
- A/B: the baseline benches against the same server restarted with --max-num-seqs halved (a real
  slowdown at this concurrency); the gate must say "regressed" in at least 9 of 10 pairs.

Both for the harness's policy and for --policy vllm-ci, side by side. One server at a time: the A
server serves 2 x PAIRS benches (A/A pairs, and the A/B baselines), then the B server PAIRS benches.
Each bench is short (3 runs of a small workload) so the whole script takes ~10-15 minutes.

Also measures, while the A server is up, requested against actual mean prompt tokens without a
local tokenizer (--prompt-lengths), both calibration methods, completions and chat.

Run:  .venv/bin/python benchmarks/serving/gate_error_rates.py [--vllm-python P] [--pairs 10] [--out reports]
Writes OUT/serving-gate-error-rates.{json,md} and OUT/serving-prompt-lengths.{json,md}.

--outsider: A/A only, as a user runs it against a server the harness did not start: a plain vLLM
process of the script's own, then `python -m harness bench --endpoint URL --model NAME` and
`python -m harness compare` as commands (default workers), 2 x --pairs benches; writes
OUT/serving-gate-outsider.{json,md}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness import models  # noqa: E402
from harness.atomic import write_text  # noqa: E402
from harness.serving import compare as cmp  # noqa: E402
from harness.serving.client import Target  # noqa: E402
from harness.serving.launcher import launch_vllm  # noqa: E402
from harness.serving.results import write_atomic  # noqa: E402
from harness.serving.runner import BenchConfig, run_bench  # noqa: E402
from harness.serving.workload import Workload  # noqa: E402

WORKLOAD = Workload(input_len=64, output_len=16, num_prompts=12, seed=3)
CONCURRENCY = 4
MAX_NUM_SEQS = 4  # A; B runs with half of it
REPEATS = 5  # the gate needs 3; 5 keep its interval usable when the machine is this noisy
BASE_FLAGS = ["--max-model-len", "2048", "--enforce-eager"]


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@contextlib.contextmanager
def cpu_hog(processes: int = 1):
    """Busy loops beside the server and the client, for the whole measurement."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def bench(server, out: Path) -> dict:
    cfg = BenchConfig(target=Target(server.base_url, server.model, timeout_s=120), workload=WORKLOAD,
                      concurrencies=[CONCURRENCY], repeats=REPEATS, warmup=2, out=out,
                      environment=server.environment() | {"model_id": "tiny"}, quiet=True)
    return run_bench(cfg)


def prompt_lengths(server, out_dir: Path) -> list[dict]:
    rows = []
    for method in ("server-tokenize", "usage-probes"):
        for api in ("completions", "chat"):
            for n in (32, 256, 1024):
                w = Workload(input_len=n, output_len=2, num_prompts=8, api=api, seed=n)
                cfg = BenchConfig(target=Target(server.base_url, server.model, api=api, timeout_s=120), workload=w,
                                  concurrencies=[4], warmup=0, quiet=True, prompt_calibration=method)
                data = run_bench(cfg)
                p = data["runs"][0]["prompt_tokens"]
                cal = data["prompt_calibration"]
                rows.append({"method": method, "api": api, "requested": n, "actual mean": p["actual_mean"],
                             "actual min": p["actual_min"], "actual max": p["actual_max"],
                             "chat template tokens": cal["chat_overhead"], "calibration requests": cal["requests"],
                             "valid": data["valid"]})
                say(f"prompt lengths {method} {api} {n}: actual mean {p['actual_mean']:.1f} "
                    f"({p['actual_min']}..{p['actual_max']}), valid {data['valid']}")
    write_atomic(out_dir / "serving-prompt-lengths.json", {"rows": rows, "machine": _machine()})
    lines = ["| calibration | api | requested | actual mean | min..max | chat template | requests | valid |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['method']} | {r['api']} | {r['requested']} | {r['actual mean']:.1f} | {r['actual min']}..{r['actual max']} "
              f"| {r['chat template tokens'] if r['chat template tokens'] is not None else '-'} | {r['calibration requests']} | {r['valid']} |"
              for r in rows]
    write_text(out_dir / "serving-prompt-lengths.md", "\n".join(lines) + "\n")
    return rows


def _machine() -> dict:
    from harness.serving.results import machine

    return machine()


def verdict_line(result) -> str:
    bad = sorted(f"{c.metric} {100 * c.change:+.0f}%" for c in result.changes if c.verdict == "regressed")
    bad += [b for b in result.behaviours if b.startswith("REGRESSION")]
    client = sorted(c.metric for c in result.changes if c.verdict == "inconclusive (client-bound)")
    return ("REGRESSED: " + ", ".join(bad) if bad else "pass") + (f" (client-bound: {', '.join(client)})" if client else "")


@contextlib.contextmanager
def plain_vllm(vllm_python: str, model: Path, log: Path, max_num_seqs: int = MAX_NUM_SEQS):
    """A vLLM server as a user starts theirs: its own session, not the harness's launcher."""
    import os
    import signal
    import urllib.request

    from harness.serving.launcher import free_port

    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen([vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                                 "--served-model-name", "outside-tiny", "--host", "127.0.0.1", "--port", str(port),
                                 *BASE_FLAGS, "--max-num-seqs", str(max_num_seqs)],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        started = time.monotonic()
        while True:
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() - started > 900:
                raise SystemExit(f"the outside server did not start: {log.read_text()[-1500:]}")
            time.sleep(1)
        say(f"outside server up after {time.monotonic() - started:.0f} s at {base}")
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def outsider(args, out: Path) -> int:
    runs = out / "serving-gate-outsider-runs"
    runs.mkdir(parents=True, exist_ok=True)
    w = WORKLOAD
    started = time.monotonic()
    files, rows = [], []
    cli = [sys.executable, "-m", "harness"]
    with cpu_hog(args.hogs), plain_vllm(args.vllm_python, models.tiny_model_dir("qwen2"), runs / "vllm.log") as base:
        for i in range(2 * args.pairs):
            path = runs / f"AA-{i:02d}.json"
            proc = subprocess.run(cli + ["bench", "--endpoint", base + "/v1", "--model", "outside-tiny",
                                         "--concurrency", str(CONCURRENCY), "--num-prompts", str(w.num_prompts),
                                         "--input-len", str(w.input_len), "--output-len", str(w.output_len),
                                         "--repeats", str(REPEATS), "--seed", str(w.seed), "--out", str(path), "-q"],
                                  capture_output=True, text=True, cwd=ROOT)
            files.append(path)
            say(f"outsider bench {i + 1}/{2 * args.pairs}: exit {proc.returncode} {proc.stderr.strip()[-200:]}")
    for i in range(args.pairs):
        base_file, cand_file = files[2 * i], files[2 * i + 1]
        proc = subprocess.run(cli + ["compare", str(base_file), str(cand_file)], capture_output=True, text=True,
                              cwd=ROOT)
        data = cmp.compare(json.loads(base_file.read_text()), json.loads(cand_file.read_text()))
        rows.append({"pair": i + 1, "exit": proc.returncode, "regressed": proc.returncode == 1,
                     "verdict": verdict_line(data),
                     "client_bound": sorted(c.metric for c in data.changes if c.verdict == "inconclusive (client-bound)"),
                     "lag_p99_max_ms": max((r.get("loop_lag_ms") or {}).get("p99") or 0
                                           for f in (base_file, cand_file) for r in json.loads(f.read_text())["runs"])})
        say(f"pair {i + 1}: compare exit {proc.returncode}: {rows[-1]['verdict']}")
    minutes = (time.monotonic() - started) / 60
    regressed = sum(r["regressed"] for r in rows)
    write_atomic(out / "serving-gate-outsider.json", {"regressed": regressed, "pairs": len(rows), "rows": rows,
                                                       "minutes": round(minutes, 1), "hogs": args.hogs,
                                                       "workload": w.to_json(), "machine": _machine()})
    lines = [f"Gate A/A as an outsider (--endpoint, plain vLLM process, {args.hogs} CPU hog(s), concurrency "
             f"{CONCURRENCY}, {REPEATS} runs per bench; {minutes:.1f} min): regressed {regressed}/{len(rows)}", "",
             "| pair | compare exit | verdict | loop lag p99 max (ms) |", "|---|---|---|---|"]
    lines += [f"| {r['pair']} | {r['exit']} | {r['verdict']} | {r['lag_p99_max_ms']:.1f} |" for r in rows]
    write_text(out / "serving-gate-outsider.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vllm-python", default=str(ROOT / ".venvs" / "vllm-0.32.0" / "bin" / "python"))
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--hogs", type=int, default=1, help="busy-loop processes beside the server (default 1)")
    parser.add_argument("--out", default=str(ROOT / "reports"))
    parser.add_argument("--no-prompt-lengths", action="store_true")
    parser.add_argument("--outsider", action="store_true", help="A/A only, through the commands, against a plain "
                                                                 "vLLM process (see the module doc)")
    args = parser.parse_args()
    out = Path(args.out)
    if args.outsider:
        return outsider(args, out)
    runs = out / "serving-gate-runs"
    runs.mkdir(parents=True, exist_ok=True)
    model = models.tiny_model_dir("qwen2")
    started = time.monotonic()
    a_files, b_files = [], []
    with cpu_hog(args.hogs):
        say(f"CPU hog: {args.hogs} busy loop(s); starting server A (--max-num-seqs {MAX_NUM_SEQS})")
        with launch_vllm(args.vllm_python, model, BASE_FLAGS + ["--max-num-seqs", str(MAX_NUM_SEQS)],
                         log_dir=runs, served_model_name="tiny") as server:
            if not args.no_prompt_lengths:
                prompt_lengths(server, out)
            for i in range(2 * args.pairs):
                path = runs / f"A-{i:02d}.json"
                data = bench(server, path)
                a_files.append(path)
                say(f"A bench {i + 1}/{2 * args.pairs}: output tok/s {[round(r['output_throughput']) for r in data['runs']]}"
                    f", contention {[round(r['client_noise'].get('cpu_contention') or 0, 2) for r in data['runs']]}")
        say(f"starting server B (--max-num-seqs {MAX_NUM_SEQS // 2})")
        with launch_vllm(args.vllm_python, model, BASE_FLAGS + ["--max-num-seqs", str(MAX_NUM_SEQS // 2)],
                         log_dir=runs, served_model_name="tiny") as server:
            for i in range(args.pairs):
                path = runs / f"B-{i:02d}.json"
                data = bench(server, path)
                b_files.append(path)
                say(f"B bench {i + 1}/{args.pairs}: output tok/s {[round(r['output_throughput']) for r in data['runs']]}")
    load = lambda p: json.loads(p.read_text())  # noqa: E731
    pairs = {"A/A": [(a_files[2 * i], a_files[2 * i + 1]) for i in range(args.pairs)],
             "A/B": [(a_files[2 * i], b_files[i]) for i in range(args.pairs)]}
    table, detail = [], []
    for kind, items in pairs.items():
        for policy in cmp.POLICIES:
            regressed = 0
            for base, cand in items:
                result = cmp.compare(load(base), load(cand), allow=("flags",), policy=policy)
                regressed += result.regressed
                detail.append({"pair": kind, "policy": policy, "baseline": base.name, "candidate": cand.name,
                               "regressed": result.regressed, "verdict": verdict_line(result),
                               "changes": [c.to_json() for c in result.changes]})
            table.append({"comparison": kind, "policy": policy, "regressed": regressed, "pairs": len(items),
                          "bar": "<= 1" if kind == "A/A" else f">= {len(items) - 1}",
                          "met": regressed <= 1 if kind == "A/A" else regressed >= len(items) - 1})
    minutes = (time.monotonic() - started) / 60
    write_atomic(out / "serving-gate-error-rates.json", {"table": table, "pairs": detail, "minutes": round(minutes, 1),
                                                          "workload": WORKLOAD.to_json(), "concurrency": CONCURRENCY,
                                                          "repeats": REPEATS, "hogs": args.hogs, "machine": _machine()})
    lines = [f"Gate error rates, {args.hogs} CPU hog(s), concurrency {CONCURRENCY}, {REPEATS} runs per bench, "
             f"A = --max-num-seqs {MAX_NUM_SEQS}, B = {MAX_NUM_SEQS // 2} ({minutes:.1f} min)", "",
             "| comparison | policy | regressed | bar | met |", "|---|---|---|---|---|"]
    lines += [f"| {r['comparison']} | {r['policy']} | {r['regressed']}/{r['pairs']} | {r['bar']} | {r['met']} |" for r in table]
    lines += ["", "| pair | policy | baseline | candidate | verdict |", "|---|---|---|---|---|"]
    lines += [f"| {d['pair']} | {d['policy']} | {d['baseline']} | {d['candidate']} | {d['verdict']} |" for d in detail]
    write_text(out / "serving-gate-error-rates.md", "\n".join(lines) + "\n")
    print("\n".join(lines[:6 + len(table)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
