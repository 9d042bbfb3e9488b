"""The serving issue's must-show benchmarks (figures, not timed tests). Writes into --out:

1. stand-in: one client process against the calibration stand-in at 64..512 concurrent streams,
   schedule lag p50/p99 (bar: p50 <= 1 ms, p99 <= 10 ms), and measured TTFT/ITL against the known
   values the stand-in streams at.
2. vLLM (CPU build, tiny model): the client's mean TTFT against the server's own TTFT histogram
   (bar: within max(15 ms, 30%)), token counts against the server's counters (bar: equal), and
   side by side with vLLM's own benchmark (vllm/benchmarks/serve.py from the vLLM venv) on the same
   server and workload (bar: TTFT p50 and throughput within 10%, or explained).

Run:  .venv/bin/python benchmarks/serving/must_show.py [--vllm-python P] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.atomic import write_text  # noqa: E402
from harness.report import html, plots  # noqa: E402
from harness.serving.client import Target, run_load  # noqa: E402
from harness.serving.results import write_atomic  # noqa: E402
from harness.serving.stats import summarize_run  # noqa: E402
from harness.serving.workload import Workload, specs_without_tokenizer  # noqa: E402

VLLM_BENCH = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""


# The slots' first sends are spread 1 ms apart: 512 sends at one instant are a burst no single
# process can issue on time (measured: first-wave lag p50 25 ms, p99 62 ms at 512).
RAMP_PER_STREAM_S = 0.001


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def standin_part(out: Path, levels=(64, 128, 256, 512), ttft_ms=50.0, interval_ms=100.0, output_len=32) -> dict:
    from harness.serving.standin import run_standin

    rows = []
    lag_at_max = []
    for c in levels:
        with run_standin(ttft_ms=ttft_ms, token_interval_ms=interval_ms, log_dir=out / "logs") as server:
            specs = specs_without_tokenizer(Workload(input_len=16, output_len=output_len, num_prompts=2 * c))
            target = Target(server.base_url, "standin", timeout_s=120)
            load = asyncio.run(run_load(target, specs, concurrency=c, ramp_up_s=c * RAMP_PER_STREAM_S))
            run = summarize_run(load, concurrency=c, request_rate=None, keep_requests=False)
        lag, loop = run["schedule_lag_ms"], run["loop_lag_ms"]
        row = {"concurrency": c, "requests_ok": run["requests_ok"], "failed": run["requests_failed"],
               "lag p50 ms": lag["p50"], "lag p99 ms": lag["p99"], "lag max ms": lag["max"],
               "loop lag p50 ms": loop["p50"], "loop lag p99 ms": loop["p99"],
               "TTFT p50 ms (known >= %g)" % ttft_ms: run["ttft_ms"]["p50"],
               "ITL p50 ms (known %g)" % interval_ms: run["itl_ms"]["p50"],
               "output tok/s": run["output_throughput"],
               "bar met": "pass" if (lag["p50"] <= 1.0 and lag["p99"] <= 10.0) else "fail"}
        rows.append(row)
        say(f"stand-in c={c}: lag p50 {lag['p50']:.3f} ms p99 {lag['p99']:.3f} ms; loop lag p99 {loop['p99']:.2f} ms; "
            f"ITL p50 {run['itl_ms']['p50']:.1f} ms; {run['requests_failed']} failed")
        if c == max(levels):
            lag_at_max = [1000 * r.schedule_lag_s for r in load.records]
    xs = [r["concurrency"] for r in rows]
    fig = plots.line_plot({"schedule lag p50": (xs, [r["lag p50 ms"] for r in rows]),
                           "schedule lag p99": (xs, [r["lag p99 ms"] for r in rows]),
                           "event-loop lag p99": (xs, [r["loop lag p99 ms"] for r in rows]),
                           "bar p99 (10 ms)": (xs, [10.0] * len(xs)), "bar p50 (1 ms)": (xs, [1.0] * len(xs))},
                          title="One client process against the stand-in", xlabel="concurrent streams",
                          ylabel="ms", logx=True)
    hist = plots.histogram(lag_at_max, title=f"Schedule lag per request at {max(levels)} streams", xlabel="ms")
    return {"rows": rows, "svg": [fig, hist],
            "setup": f"stand-in TTFT {ttft_ms:g} ms + random phase < {interval_ms:g} ms, then one token every "
                     f"{interval_ms:g} ms, {output_len} tokens per request, 2 x concurrency requests per level, "
                     f"first sends ramped {1000 * RAMP_PER_STREAM_S:g} ms apart; lag = actual - scheduled send time"}


def _bench_level(server, model: Path, vllm_python: Path, out: Path, c: int, n: int, input_len: int,
                 output_len: int) -> tuple[list[dict], list[dict]]:
    """Harness, vllm bench serve, harness, vllm bench serve at concurrency c: (our runs, theirs)."""
    from harness.serving.runner import BenchConfig, run_bench

    ours, theirs_runs = [], []
    for attempt in ("ours", "theirs", "ours", "theirs"):
        if attempt == "ours":
            cfg = BenchConfig(target=Target(server.base_url, "tiny-qwen2", timeout_s=120),
                              workload=Workload(input_len=input_len, output_len=output_len, num_prompts=n,
                                                seed=len(ours) + 10 * c),
                              concurrencies=[c], warmup=2, tokenizer_dir=model, keep_requests=False,
                              environment=server.environment(), quiet=True)
            data = run_bench(cfg)
            write_atomic(out / f"vllm-ours-c{c}-{len(ours)}.json", data)
            ours.append(data["runs"][0])
            continue
        result_file = out / f"vllm-bench-serve-c{c}-{len(theirs_runs)}.json"
        cmd = [str(vllm_python), "-c", VLLM_BENCH, "--backend", "openai", "--base-url", server.base_url,
               "--endpoint", "/v1/completions", "--model", "tiny-qwen2", "--tokenizer", str(model),
               "--dataset-name", "random", "--random-input-len", str(input_len),
               "--random-output-len", str(output_len), "--num-prompts", str(n),
               "--max-concurrency", str(c), "--ignore-eos", "--num-warmups", "2", "--disable-tqdm",
               "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
               "--save-result", "--result-dir", str(out), "--result-filename", result_file.name]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            say(f"vLLM bench serve failed: {proc.stderr[-800:]}")
        else:
            theirs_runs.append(json.loads(result_file.read_text()))
    return ours, theirs_runs


def _ttft_row(c: int, i: int, run: dict) -> dict:
    server_mean = run["server_metrics"]["ttft_mean_ms"]
    client_mean = run["ttft_ms"]["mean"]
    acct = run["token_accounting"]
    allowed = max(15.0, 0.3 * server_mean)
    return {
        "concurrency": c, "run": i + 1, "client TTFT mean ms": client_mean,
        "server histogram TTFT mean ms": server_mean, "difference ms": client_mean - server_mean,
        "allowed ms": allowed,
        "TTFT bar": "pass" if abs(client_mean - server_mean) <= allowed else "fail",
        "usage in/out": f"{acct['usage_input_tokens']}/{acct['usage_output_tokens']}",
        "/metrics in/out": f"{acct['metrics_prompt_tokens']:g}/{acct['metrics_generation_tokens']:g}",
        "tokenizer in": acct["tokenizer_input_tokens"],
        "tokens bar": "pass" if acct["agree"] else "fail",
        "client-bound": run["client_bound"], "loop lag p99 ms": run["loop_lag_ms"]["p99"],
    }


def _side_row(c: int, n: int, ours: list[dict], theirs_runs: list[dict]) -> dict:
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    ours_p50 = mean([r["ttft_ms"]["p50"] for r in ours])
    ours_tput = mean([r["output_throughput"] for r in ours])
    their_p50 = mean([t["median_ttft_ms"] for t in theirs_runs])
    their_tput = mean([t["output_throughput"] for t in theirs_runs])
    return {
        "concurrency": c, "requests per run": n,
        "harness TTFT p50 ms (2 runs)": " / ".join(f"{r['ttft_ms']['p50']:.1f}" for r in ours),
        "vllm bench TTFT p50 ms (2 runs)": " / ".join(f"{t['median_ttft_ms']:.1f}" for t in theirs_runs),
        "TTFT p50 diff % (means)": 100 * (ours_p50 / their_p50 - 1),
        "harness output tok/s (2 runs)": " / ".join(f"{r['output_throughput']:.0f}" for r in ours),
        "vllm bench output tok/s (2 runs)": " / ".join(f"{t['output_throughput']:.0f}" for t in theirs_runs),
        "throughput diff % (means)": 100 * (ours_tput / their_tput - 1),
        "harness TPOT p50 ms": mean([r["tpot_ms"]["p50"] for r in ours]),
        "vllm bench TPOT p50 ms": mean([t["median_tpot_ms"] for t in theirs_runs]),
        "vllm bench input tokens / request": theirs_runs[0]["total_input_tokens"] / theirs_runs[0]["completed"],
        "vllm bench output tokens": theirs_runs[0].get("total_output_tokens"),
        "_ours_p50": ours_p50, "_their_p50": their_p50, "_ours_tput": ours_tput, "_their_tput": their_tput,
    }


def _svgs(rows_ttft: list[dict], rows_side: list[dict]) -> list[str]:
    xs = sorted({r["concurrency"] for r in rows_ttft})

    def mean_of(key):
        return [sum(r[key] for r in rows_ttft if r["concurrency"] == x) / max(1, sum(1 for r in rows_ttft if r["concurrency"] == x)) for x in xs]

    svgs = [plots.line_plot({"client mean TTFT": (xs, mean_of("client TTFT mean ms")),
                             "server histogram mean TTFT": (xs, mean_of("server histogram TTFT mean ms"))},
                            title="Client TTFT against vLLM's own histogram", xlabel="concurrency", ylabel="ms", logx=True)]
    if rows_side:
        sx = [r["concurrency"] for r in rows_side]
        svgs.append(plots.line_plot({
            "harness TTFT p50": (sx, [r["_ours_p50"] for r in rows_side]),
            "vllm bench serve TTFT p50": (sx, [r["_their_p50"] for r in rows_side])},
            title="TTFT p50: harness against vLLM's benchmark", xlabel="concurrency", ylabel="ms", logx=True))
        svgs.append(plots.line_plot({
            "harness output tok/s": (sx, [r["_ours_tput"] for r in rows_side]),
            "vllm bench serve output tok/s": (sx, [r["_their_tput"] for r in rows_side])},
            title="Output throughput: harness against vLLM's benchmark", xlabel="concurrency", ylabel="tokens/s", logx=True))
    return svgs


def vllm_part(out: Path, vllm_python: Path, levels=(1, 4, 16), num_prompts=64, input_len=128, output_len=64) -> dict:
    from harness.models import tiny_model_dir
    from harness.serving.launcher import launch_vllm

    model = tiny_model_dir("qwen2")
    rows_ttft, rows_side = [], []
    flags = ["--max-model-len", "1024", "--max-num-seqs", "64"]
    with launch_vllm(vllm_python, model, flags, log_dir=out / "logs", served_model_name="tiny-qwen2") as server:
        for c in levels:
            n = max(num_prompts, 16 * c)  # runs of a few seconds: a 1-second run is mostly ramp and tail
            ours, theirs_runs = _bench_level(server, model, vllm_python, out, c, n, input_len, output_len)
            rows_ttft += [_ttft_row(c, i, run) for i, run in enumerate(ours)]
            if theirs_runs:
                rows_side.append(_side_row(c, n, ours, theirs_runs))
            say(f"vLLM c={c}: {rows_ttft[-1]} | {rows_side[-1] if rows_side else 'no vllm bench'}")
    return {"ttft_rows": rows_ttft, "side_rows": rows_side, "svg": _svgs(rows_ttft, rows_side),
            "startup": server.startup.to_json(),
            "setup": f"vLLM {server.startup.version} CPU build, tiny qwen2 (hidden 256, 2 layers), flags {' '.join(flags)}, "
                     f"max({num_prompts}, 16 x concurrency) prompts x {input_len} in / {output_len} out per run; order per "
                     f"level: harness, vllm bench serve, harness, vllm bench serve; the client shares the server's "
                     f"session (autogroup) as the launcher arranges"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vllm-python", default=str(ROOT / ".venvs" / "vllm-0.32.0" / "bin" / "python"))
    parser.add_argument("--out", default=str(ROOT / "reports" / "serving-benchmarks"))
    parser.add_argument("--skip-standin", action="store_true")
    parser.add_argument("--skip-vllm", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "machine_load_at_start": _loadavg()}
    body = []
    if not args.skip_standin:
        part = standin_part(out)
        summary["standin"] = {k: v for k, v in part.items() if k != "svg"}
        body.append(html.table("Stand-in: schedule lag of one client process (" + part["setup"] + ")", part["rows"]))
        body.append(html.section("Stand-in figures", "".join(part["svg"])))
        for i, svg in enumerate(part["svg"]):
            (out / f"standin-{i}.svg").write_text(svg)
    if not args.skip_vllm:
        part = vllm_part(out, Path(args.vllm_python))
        summary["vllm"] = {k: v for k, v in part.items() if k != "svg"}
        body.append(html.table("vLLM: client TTFT against the server's histogram, tokens three ways (" + part["setup"] + ")",
                               part["ttft_rows"]))
        body.append(html.table("vLLM: harness against vllm/benchmarks/serve.py, same server and workload",
                               [{k: v for k, v in r.items() if not k.startswith("_")} for r in part["side_rows"]]))
        body.append(html.section("vLLM figures", "".join(part["svg"])))
        for i, svg in enumerate(part["svg"]):
            (out / f"vllm-{i}.svg").write_text(svg)
    summary["machine_load_at_end"] = _loadavg()
    write_atomic(out / "must_show.json", summary)
    write_text(out / "must_show.html", html.page("Serving: must-show benchmarks", "".join(body)))
    say(f"wrote {out / 'must_show.html'} and {out / 'must_show.json'}")
    return 0


def _loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()
    except OSError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
