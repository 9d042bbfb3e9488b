"""The summary block `vllm bench serve` users read, with vLLM's own metric names, from bench results.

The layout and names follow vllm/benchmarks/serve.py (0.32.0): "Serving Benchmark Result", then
Successful requests, Benchmark duration (s), Request throughput (req/s), Output token throughput
(tok/s), Total token throughput (tok/s), Request goodput (req/s) where SLOs were given, and Mean,
Median and P99 of TTFT, TPOT, ITL and E2EL (ms). The definitions are the harness's, which are
vLLM's (docs/architecture.md): TTFT to the first content chunk, TPOT = (E2E - TTFT)/(n - 1), ITL
the gaps between content chunks. One block per concurrency or rate level, its repeats pooled:
counts and durations summed, latency statistics over every request of the level (from the
per-request events; without them, from the runs' own figures, said in the block).
"""

from __future__ import annotations

from .stats import percentile


def _level_key(run: dict):
    return (run.get("concurrency"), run.get("request_rate"))


def _pooled(runs: list[dict]) -> dict[str, list[float]] | None:
    """Per-request latencies (ms) of every repeat of a level, or None without per-request events."""
    if not all(isinstance(r.get("requests"), list) and r["requests"] for r in runs):
        return None
    out: dict[str, list[float]] = {"ttft": [], "tpot": [], "itl": [], "e2el": []}
    for run in runs:
        for q in run["requests"]:
            if q.get("error") or q.get("ttft_ms") is None:
                continue
            out["ttft"].append(q["ttft_ms"])
            out["e2el"].append(q["e2e_ms"])
            n = q.get("completion_tokens") or len(q.get("chunk_s") or [])
            if n and n > 1:
                out["tpot"].append((q["e2e_ms"] - q["ttft_ms"]) / (n - 1))
            chunks = q.get("chunk_s") or []
            out["itl"] += [1000 * (b - a) for a, b in zip(chunks, chunks[1:])]
    return out


def _stats(values: list[float]) -> tuple[float | None, float | None, float | None]:
    if not values:
        return None, None, None
    return sum(values) / len(values), percentile(values, 50), percentile(values, 99)


def level_summary(runs: list[dict]) -> dict:
    """vLLM's summary figures for the runs of one level."""
    duration = sum(r.get("duration_s") or 0.0 for r in runs)
    ok = sum(r["requests_ok"] for r in runs)
    good = sum((r.get("goodput") or {}).get("requests_good") or 0 for r in runs)
    tokens_in = sum(r.get("input_tokens") or 0 for r in runs)
    tokens_out = sum(r.get("output_tokens") or 0 for r in runs)
    slo = next(((r.get("goodput") or {}).get("slo") for r in runs if (r.get("goodput") or {}).get("slo")), None)
    data = {
        "concurrency": runs[0].get("concurrency"), "request_rate": runs[0].get("request_rate"), "runs": len(runs),
        "completed": ok, "failed": sum(r["requests_failed"] for r in runs), "duration": duration,
        "total_input_tokens": tokens_in, "total_output_tokens": tokens_out,
        "request_throughput": ok / duration if duration else 0.0,
        "request_goodput": (good / duration if duration else 0.0) if slo else None,
        "output_throughput": tokens_out / duration if duration else 0.0,
        "total_token_throughput": (tokens_in + tokens_out) / duration if duration else 0.0,
        "pooled": True,
    }
    pooled = _pooled(runs)
    source = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2el": "e2e_ms"}
    for name, key in source.items():
        if pooled is not None:
            mean, median, p99 = _stats(pooled[name])
        else:  # the runs' own figures: the mean of their means, medians and p99s
            data["pooled"] = False
            figures = [(r.get(key) or {}) for r in runs]
            mean, median, p99 = (_mean([f.get(s) for f in figures]) for s in ("mean", "p50", "p99"))
        data |= {f"mean_{name}_ms": mean, f"median_{name}_ms": median, f"p99_{name}_ms": p99}
    return data


def _mean(values) -> float | None:
    xs = [v for v in values if isinstance(v, (int, float))]
    return sum(xs) / len(xs) if xs else None


def summaries(data: dict) -> list[dict]:
    levels: dict = {}
    for run in data.get("runs", []):
        levels.setdefault(_level_key(run), []).append(run)
    return [level_summary(runs) for runs in levels.values()]


_HEADERS = (("ttft", "TTFT", "Time to First Token"), ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
            ("itl", "ITL", "Inter-token Latency"), ("e2el", "E2EL", "End-to-end Latency"))


def _row(label: str, value, digits: int = 2) -> str:
    text = "-" if value is None else (f"{value}" if isinstance(value, int) else f"{value:.{digits}f}")
    return "{:<40} {:<10}".format(label, text).rstrip()


def format_block(s: dict) -> str:
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]
    lines.append(_row("Successful requests:", s["completed"]))
    lines.append(_row("Failed requests:", s["failed"]))
    if s.get("request_rate"):
        lines.append(_row("Request rate configured (RPS):", s["request_rate"]))
    if s.get("concurrency"):
        lines.append(_row("Maximum request concurrency:", s["concurrency"]))
    lines.append(_row("Benchmark duration (s):", s["duration"]))
    lines.append(_row("Total input tokens:", s["total_input_tokens"]))
    lines.append(_row("Total generated tokens:", s["total_output_tokens"]))
    lines.append(_row("Request throughput (req/s):", s["request_throughput"]))
    if s.get("request_goodput") is not None:
        lines.append(_row("Request goodput (req/s):", s["request_goodput"]))
    lines.append(_row("Output token throughput (tok/s):", s["output_throughput"]))
    lines.append(_row("Total token throughput (tok/s):", s["total_token_throughput"]))
    for name, short, header in _HEADERS:
        lines.append("{s:{c}^{n}}".format(s=header, n=50, c="-"))
        lines.append(_row(f"Mean {short} (ms):", s[f"mean_{name}_ms"]))
        lines.append(_row(f"Median {short} (ms):", s[f"median_{name}_ms"]))
        lines.append(_row(f"P99 {short} (ms):", s[f"p99_{name}_ms"]))
    if s["runs"] > 1:
        how = "every request pooled" if s["pooled"] else "the mean of the runs' own figures (no per-request events kept)"
        lines.append(f"({s['runs']} repeats: counts and durations summed; latencies over {how})")
    lines.append("=" * 50)
    return "\n".join(lines)


def format_results(data: dict) -> str:
    return "\n".join(format_block(s) for s in summaries(data))
