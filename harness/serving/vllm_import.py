"""`vllm bench serve --save-result` JSON -> bench results (schema 1), so `compare` and `report` read it.

The keys are vLLM's own (vllm/benchmarks/serve.py at 0.32.0: `benchmark()`'s result dict, merged
into `result_json` by `main()`): completed, failed, duration, total_input_tokens,
total_output_tokens, request_throughput, request_goodput, output_throughput,
total_token_throughput, mean_/median_/std_/pNN_{ttft,tpot,itl,e2el}_ms, and with --save-detailed
the per-request lists ttfts, itls, latencies, input_lens, output_lens, start_times, errors (seconds).
One file is one run. Where the per-request lists are present every figure is recomputed from
them with the harness's definitions (stats.summary); without them the summary keeps the
percentiles vLLM printed and leaves the others empty (null), never invented.
"""

from __future__ import annotations

import statistics

from .stats import summary

# vLLM's metric attribute -> the harness's summary name
_METRICS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2el": "e2e_ms"}


def is_vllm_result(data) -> bool:
    """A `vllm bench serve` result: vLLM's keys, not the harness's schema_version."""
    return (isinstance(data, dict) and "schema_version" not in data and "completed" in data
            and "duration" in data and any(f"mean_{m}_ms" in data for m in _METRICS))


def _num(value):
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _printed_summary(data: dict, name: str) -> dict:
    """The statistics vLLM printed for one metric; those it did not compute stay None."""
    out = {"mean": _num(data.get(f"mean_{name}_ms")), "p50": _num(data.get(f"median_{name}_ms")),
           "p90": _num(data.get(f"p90_{name}_ms")), "p95": _num(data.get(f"p95_{name}_ms")),
           "p99": _num(data.get(f"p99_{name}_ms")), "max": _num(data.get(f"p100_{name}_ms"))}
    if out["mean"] is None or out["p50"] is None:
        return {k: None for k in out} | {"count": 0}
    return out


def _detailed(data: dict) -> dict[str, dict] | None:
    """Summaries recomputed from --save-detailed's per-request lists (seconds), or None."""
    ttfts, itls, lat, outs = (data.get(k) for k in ("ttfts", "itls", "latencies", "output_lens"))
    errors = data.get("errors") or []
    if not (isinstance(ttfts, list) and isinstance(lat, list) and isinstance(outs, list)
            and len(ttfts) == len(lat) == len(outs)):
        return None
    ok = [i for i in range(len(ttfts)) if not (i < len(errors) and errors[i]) and _num(lat[i])]
    tpots = [(lat[i] - ttfts[i]) / (outs[i] - 1) for i in ok if isinstance(outs[i], int) and outs[i] > 1]
    gaps = [g for i in ok if isinstance(itls, list) and i < len(itls) for g in (itls[i] or [])]
    return {"ttft_ms": summary(ttfts[i] for i in ok), "tpot_ms": summary(tpots), "itl_ms": summary(gaps),
            "e2e_ms": summary(lat[i] for i in ok)}


def to_results(data: dict, name: str) -> dict:
    """One schema-1 results dict with one run from a vLLM result dict."""
    detailed = _detailed(data)
    sums = detailed or {ours: _printed_summary(data, theirs) for theirs, ours in _METRICS.items()}
    completed = int(data.get("completed") or 0)
    failed = int(data.get("failed") or 0)
    conc = data.get("max_concurrency")
    rate = data.get("request_rate")
    backend = str(data.get("backend") or data.get("endpoint_type") or "openai")
    lens = data.get("input_lens") if isinstance(data.get("input_lens"), list) else None
    run = {
        "concurrency": conc if isinstance(conc, int) and conc >= 1 else None,
        "request_rate": float(rate) if isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate > 0 else None,
        "repeat": 0,
        "requests_ok": completed,
        "requests_failed": failed,
        "errors": {"vllm_bench_error": failed} if failed else {},
        "input_tokens": int(data.get("total_input_tokens") or 0),
        "output_tokens": int(data.get("total_output_tokens") or 0),
        "duration_s": _num(data.get("duration")),
        "request_throughput": _num(data.get("request_throughput")) or 0.0,
        "output_throughput": _num(data.get("output_throughput")) or 0.0,
        "total_token_throughput": _num(data.get("total_token_throughput")) or 0.0,
        **sums,
        "goodput": {"request_goodput": _num(data.get("request_goodput"))},
        "server_metrics": None,
        "token_accounting": {"agree": True, "findings": []},
    }
    if run["concurrency"] is None and run["request_rate"] is None:
        run["concurrency"] = 1 if completed else None
    return {
        "schema_version": 1,
        "tool": {"name": "vllm bench serve", "imported_from": name, "date": data.get("date"),
                 "label": data.get("label"), "detailed": detailed is not None,
                 "num_prompts": data.get("num_prompts"), "mean_input_len": statistics.fmean(lens) if lens else None},
        "environment": {"model": data.get("model_id"), "model_id": data.get("model_id"),
                        "tokenizer": data.get("tokenizer_id"), "server_version": data.get("vllm_version"),
                        "flags": [], "machine": None},
        "workload": {"api": "chat" if "chat" in backend else "completions", "source": "vllm bench serve"},
        "runs": [run],
        "complete": True,
        "valid": True,
        "invalid_reasons": [],
    }
