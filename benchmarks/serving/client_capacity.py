"""The load client's own capacity on this machine: where its schedule lag p99 crosses 1 ms.

Drives the calibration stand-in server (harness/serving/standin.py, not a model: it streams one
token every --interval-ms after --ttft-ms, from --standin-processes processes on one port) at
rising concurrency, so at rising token rates, with 1, 2, 4 and 8 client worker processes. For
each worker count it reports the highest output token rate whose schedule lag p99 stayed at or
below 1 ms, and saves that as this machine's calibration (OUT/client-capacity.json), which
`bench` reads to warn before a run that asks more of the client than it can give.

Also times the per-chunk parsing work with orjson and with the standard json module (the client
uses orjson when it is installed), and what the client's write trace (RequestRecord.written_s)
costs per request.

Run:  .venv/bin/python benchmarks/serving/client_capacity.py [--workers 1,2,4,8] [--out reports]
Writes OUT/client-capacity.{json,md,svg}.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.atomic import write_text  # noqa: E402
from harness.report import plots  # noqa: E402
from harness.env import usable_cores  # noqa: E402
from harness.serving import capacity  # noqa: E402
from harness.serving.client import Target, run_load  # noqa: E402
from harness.serving.results import machine  # noqa: E402
from harness.serving.standin import run_standin  # noqa: E402
from harness.serving.stats import summarize_run  # noqa: E402
from harness.serving.workers import run_load_workers  # noqa: E402
from harness.serving.workload import Workload, specs_without_tokenizer  # noqa: E402

LOOSE_BAR_MS = 10.0  # bench's client-bound limit for lag p99; reported beside the 1 ms bar
LEVELS = (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def one_level(target: Target, workers: int, c: int, output_len: int, ramp_ms: float) -> dict:
    specs = specs_without_tokenizer(Workload(input_len=8, output_len=output_len, num_prompts=max(32, 2 * c)))
    ramp = c * ramp_ms / 1000
    if workers == 1:
        load = asyncio.run(run_load(target, specs, concurrency=c, ramp_up_s=ramp))
    else:
        load = asyncio.run(run_load_workers(target, specs, workers=workers, concurrency=c, ramp_up_s=ramp))
    run = summarize_run(load, concurrency=c, request_rate=None, keep_requests=False)
    lag, loop = run["schedule_lag_ms"], run["loop_lag_ms"]
    return {"workers": workers, "concurrency": c, "requests_ok": run["requests_ok"],
            "failed": run["requests_failed"], "output_tokens_per_s": run["output_throughput"],
            "lag_p50_ms": lag["p50"], "lag_p99_ms": lag["p99"], "loop_lag_p99_ms": loop["p99"],
            "itl_p50_ms": run["itl_ms"]["p50"],
            "client_cpu_share": (run["client_noise"] or {}).get("client_cpu_share")}


def series(target: Target, workers: int, output_len: int, ramp_ms: float, max_level: int) -> list[dict]:
    rows, over = [], 0
    for c in (c for c in LEVELS if c <= max_level):
        row = one_level(target, workers, c, output_len, ramp_ms)
        rows.append(row)
        say(f"  workers {workers} c={c}: {row['output_tokens_per_s']:,.0f} tok/s, lag p50 {row['lag_p50_ms']:.3f} "
            f"p99 {row['lag_p99_ms']:.3f} ms, loop lag p99 {row['loop_lag_p99_ms']:.2f} ms, {row['failed']} failed")
        over = over + 1 if (row["lag_p99_ms"] > LOOSE_BAR_MS or row["failed"]) else 0
        if over >= 2:
            break
    return rows


def best(rows: list[dict], bar_ms: float = capacity.LAG_P99_BAR_MS) -> dict | None:
    ok = [r for r in rows if r["lag_p99_ms"] <= bar_ms and not r["failed"]]
    return max(ok, key=lambda r: r["output_tokens_per_s"]) if ok else None


def parse_speed() -> dict:
    import json as std_json

    from harness.serving import client

    out = {}
    for name, loads in (("orjson", client._loads), ("json", std_json.loads)):
        saved = capacity._loads
        capacity._loads = loads
        try:
            cap = capacity.quick_estimate(1, frames=20000)
        finally:
            capacity._loads = saved
        out[name] = cap.source.split("; ")[-1].rstrip(")")
    return out


def trace_overhead(target: Target, batches: int = 3, requests: int = 200) -> dict:
    """What the client's write trace (client.write_trace) costs per request. `replay_us`: aiohttp's
    trace work for one pooled streaming POST replayed in a loop (a Trace and its context; the
    request-start, connection-reuse, headers-sent, chunk-sent and request-end signals, the URL
    copies two of them make; the stamp): the added CPU, exactly. `client_cpu_us`: this process's
    CPU per request (c=4, 1 token) with and without the trace, batches alternated, medians."""
    from aiohttp.tracing import Trace
    from multidict import CIMultiDict
    from yarl import URL

    from harness.serving.client import RequestRecord, make_session, write_trace

    async def replay(n: int) -> float:
        cfg = write_trace()
        cfg.freeze()
        url, headers, rec = URL(target.base_url + "/v1/completions"), CIMultiDict(), RequestRecord(0, 0.0)
        start = time.perf_counter()
        for _ in range(n):
            trace = Trace(None, cfg, cfg.trace_config_ctx(trace_request_ctx=(rec, 0.0)))
            await trace.send_request_start("POST", url.update_query(None), headers)
            await trace.send_connection_reuseconn()
            await trace.send_request_headers("POST", url, headers)
            await trace.send_request_chunk_sent("POST", url, b"{}")
            await trace.send_request_end("POST", url.update_query(None), headers, None)
        return (time.perf_counter() - start) / n * 1e6

    async def batch(traced: bool) -> float:
        specs = specs_without_tokenizer(Workload(input_len=8, output_len=1, num_prompts=requests))
        session = make_session(trace=traced)
        try:
            start = time.process_time()
            await run_load(target, specs, concurrency=4, session=session)
            return (time.process_time() - start) / requests * 1e6
        finally:
            await session.close()

    cpu = {True: [], False: []}
    for _ in range(batches):
        for traced in (False, True):
            cpu[traced].append(asyncio.run(batch(traced)))
    med = {k: sorted(v)[len(v) // 2] for k, v in cpu.items()}
    return {"replay_us": round(asyncio.run(replay(20000)), 2),
            "client_cpu_us": {"traced": round(med[True], 1), "untraced": round(med[False], 1)},
            "batches": {"traced": [round(x, 1) for x in cpu[True]], "untraced": [round(x, 1) for x in cpu[False]]}}


def markdown(summary: dict, rows: list[dict]) -> str:
    lines = [f"# Client capacity on {summary['machine']['cpu_model']} ({summary['machine']['cpu_count']} cores)", "",
             summary["setup"], "",
             "| workers | highest tok/s with lag p99 <= 1 ms (at c) | highest tok/s with lag p99 <= 10 ms (at c) "
             "| 1 ms limit reached |", "|---|---|---|---|"]
    for w, b in summary["best"].items():
        loose = summary["best_10ms"][w]
        cell = f"{b['output_tokens_per_s']:,.0f} (c={b['concurrency']})" if b else "none"
        cell10 = f"{loose['output_tokens_per_s']:,.0f} (c={loose['concurrency']})" if loose else "none"
        reached = "yes" if summary["limit_reached"][w] else "no (stand-in or levels ran out first)"
        lines.append(f"| {w} | {cell} | {cell10} | {reached} |")
    lines += ["", "| workers | concurrency | tok/s | lag p50 ms | lag p99 ms | loop lag p99 ms | ITL p50 ms | failed |",
              "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['workers']} | {r['concurrency']} | {r['output_tokens_per_s']:,.0f} | {r['lag_p50_ms']:.3f} | "
                     f"{r['lag_p99_ms']:.3f} | {r['loop_lag_p99_ms']:.2f} | {r['itl_p50_ms']:.1f} | {r['failed']} |")
    lines += ["", f"Per-chunk parsing: {summary['parse_speed']}"]
    if summary.get("trace_overhead"):
        t = summary["trace_overhead"]
        lines.append(f"Write trace per request: {t['replay_us']} us of aiohttp trace work (replayed); client CPU "
                     f"per request {t['client_cpu_us']['traced']} us traced, {t['client_cpu_us']['untraced']} us "
                     f"untraced (c=4, 1 token, medians of {len(t['batches']['traced'])} alternated batches)")
    lines.append(f"Load beside the run: {summary.get('loadavg_start', '?')} at the start, {summary['loadavg']} at the end")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument("--out", default=str(ROOT / "reports"))
    parser.add_argument("--ttft-ms", type=float, default=10.0)
    parser.add_argument("--interval-ms", type=float, default=10.0)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--ramp-ms", type=float, default=2.0, help="first sends this far apart per slot")
    parser.add_argument("--max-concurrency", type=int, default=2048)
    parser.add_argument("--standin-processes", type=int, default=max(1, usable_cores() // 2))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    worker_counts = [int(x) for x in args.workers.split(",")]
    rows: list[dict] = []
    started = time.time()
    load_start = Path("/proc/loadavg").read_text().strip() if Path("/proc/loadavg").exists() else None
    with run_standin(ttft_ms=args.ttft_ms, token_interval_ms=args.interval_ms, log_dir=out / "logs",
                     processes=args.standin_processes) as server:
        target = Target(server.base_url, "standin", timeout_s=120)
        for w in worker_counts:
            say(f"client with {w} worker process(es):")
            rows += series(target, w, args.output_len, args.ramp_ms, args.max_concurrency)
        overhead = trace_overhead(target)
        say(f"write trace: {overhead}")
    mach = machine()
    by_w = {w: [r for r in rows if r["workers"] == w] for w in worker_counts}
    best_by_w = {w: best(rs) for w, rs in by_w.items()}
    summary = {
        "measured": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": capacity.machine_key(mach),
        "setup": (f"stand-in (not a model) from {args.standin_processes} process(es): TTFT {args.ttft_ms:g} ms, one token "
                  f"every {args.interval_ms:g} ms, {args.output_len} tokens per request, 2 x concurrency requests per "
                  f"level, first sends {args.ramp_ms:g} ms apart per slot; lag = actual - scheduled send time; "
                  f"timed sends wake punctually (client._wake_at: sleep to a selector tick before, then yield)"),
        "tokens_per_s": {str(w): b["output_tokens_per_s"] for w, b in best_by_w.items() if b},
        "tokens_per_s_10ms": {str(w): b["output_tokens_per_s"] for w in worker_counts
                              if (b := best(by_w[w], LOOSE_BAR_MS))},
        "best_10ms": {str(w): best(by_w[w], LOOSE_BAR_MS) for w in worker_counts},
        "best": {str(w): b for w, b in best_by_w.items()},
        "limit_reached": {str(w): any(r["lag_p99_ms"] > capacity.LAG_P99_BAR_MS for r in by_w[w]) for w in worker_counts},
        "parse_speed": parse_speed(),
        "trace_overhead": overhead,
        "loadavg_start": load_start,
        "loadavg": Path("/proc/loadavg").read_text().strip() if Path("/proc/loadavg").exists() else None,
        "wall_s": round(time.time() - started, 1),
        "rows": rows,
    }
    write_text(out / capacity.CAPACITY_FILE, json.dumps(summary, indent=1))
    write_text(out / "client-capacity.md", markdown(summary, rows))
    fig = plots.line_plot({f"{w} worker(s)": ([r["output_tokens_per_s"] for r in rs], [r["lag_p99_ms"] for r in rs])
                           for w, rs in by_w.items() if rs} | {"bar (1 ms)": (
                              [min(r["output_tokens_per_s"] for r in rows), max(r["output_tokens_per_s"] for r in rows)],
                              [1.0, 1.0])},
                          title="Client schedule lag p99 against the stand-in", xlabel="output tokens/s",
                          ylabel="schedule lag p99 (ms)", logx=True)
    write_text(out / "client-capacity.svg", fig)
    say(markdown(summary, rows))
    say(f"wrote {out / capacity.CAPACITY_FILE}, client-capacity.md, client-capacity.svg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
