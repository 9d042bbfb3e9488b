"""From raw request events to the figures of one run (docs/architecture.md schema, `runs[]` entries).

Definitions, said once because tools disagree (docs/architecture.md): TTFT = send -> first content chunk;
TPOT = (E2E - TTFT) / (output tokens - 1) per request (vLLM's meaning; AIPerf calls this ITL);
ITL = every gap between consecutive content chunks, pooled over requests; E2E = send -> end.
Only successful requests enter latency figures; failures count in goodput's denominator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from .client import LoadResult, RequestRecord

# Schedule lag above these means the client could not keep its own schedule (the 512-stream bar).
LAG_P50_LIMIT_MS = 1.0
LAG_P99_LIMIT_MS = 10.0


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), q in [0, 100]."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summary(values_s: Iterable[float]) -> dict:
    """{"mean","p50","p90","p95","p99","max","count"} in milliseconds (None when empty)."""
    xs = [1000.0 * v for v in values_s]
    if not xs:
        return {k: None for k in ("mean", "p50", "p90", "p95", "p99", "max")} | {"count": 0}
    return {
        "mean": sum(xs) / len(xs),
        "p50": percentile(xs, 50),
        "p90": percentile(xs, 90),
        "p95": percentile(xs, 95),
        "p99": percentile(xs, 99),
        "max": max(xs),
        "count": len(xs),
    }


def tpot_s(r: RequestRecord) -> float | None:
    n = r.completion_tokens or len(r.chunk_s)
    if r.ttft_s is None or n < 2:
        return None
    return (r.e2e_s - r.ttft_s) / (n - 1)


def itls_s(r: RequestRecord) -> list[float]:
    return [b - a for a, b in zip(r.chunk_s, r.chunk_s[1:])]


@dataclass(frozen=True)
class SLO:
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def met_by(self, r: RequestRecord) -> bool:
        if not r.ok:
            return False
        if self.ttft_ms is not None and 1000 * (r.ttft_s or math.inf) > self.ttft_ms:
            return False
        t = tpot_s(r)
        if self.tpot_ms is not None and t is not None and 1000 * t > self.tpot_ms:
            return False
        if self.e2e_ms is not None and 1000 * r.e2e_s > self.e2e_ms:
            return False
        return True

    def to_json(self) -> dict:
        return {k: v for k, v in (("ttft_ms", self.ttft_ms), ("tpot_ms", self.tpot_ms), ("e2e_ms", self.e2e_ms)) if v is not None}


def token_accounting(records: Sequence[RequestRecord], server_delta: dict | None, count_output=None) -> dict:
    """Tokens counted three ways: server usage, the client (tokenizer / chunks), /metrics deltas.

    Disagreements become findings. /metrics counts every request the server saw in the window,
    failed ones included, so it is compared against all requests, usage against successful ones.
    """
    ok = [r for r in records if r.ok]
    usage_in = sum(r.prompt_tokens or 0 for r in ok)
    usage_out = sum(r.completion_tokens or 0 for r in ok)
    expected_in = sum(r.expected_input_tokens for r in ok)
    expected_out = sum(r.expected_output_tokens for r in ok)
    chunks = sum(len(r.chunk_s) for r in ok)
    findings = []
    missing_usage = sum(1 for r in ok if r.prompt_tokens is None or r.completion_tokens is None)
    if missing_usage:
        findings.append(f"{missing_usage} successful requests carried no usage (stream_options.include_usage ignored?)")
    if expected_in and usage_in != expected_in:
        findings.append(f"input tokens: server usage {usage_in} != client tokenizer {expected_in}")
    if usage_out != expected_out:
        short = [r.index for r in ok if (r.completion_tokens or 0) != r.expected_output_tokens]
        findings.append(f"output tokens: server usage {usage_out} != requested {expected_out} "
                        f"({len(short)} requests off: min_tokens/ignore_eos not honoured?)")
    data = {
        "usage_input_tokens": usage_in,
        "usage_output_tokens": usage_out,
        "tokenizer_input_tokens": expected_in or None,
        "requested_output_tokens": expected_out,
        "content_chunks": chunks,
        "metrics_prompt_tokens": None,
        "metrics_generation_tokens": None,
    }
    if count_output is not None:
        data["tokenizer_output_tokens"] = sum(count_output(r.output_text) for r in ok)
    if server_delta is not None:
        failed = len(records) - len(ok)
        data["metrics_prompt_tokens"] = server_delta.get("prompt_tokens")
        data["metrics_generation_tokens"] = server_delta.get("generation_tokens")
        if failed == 0:
            if data["metrics_prompt_tokens"] is not None and data["metrics_prompt_tokens"] != usage_in:
                findings.append(f"input tokens: /metrics delta {data['metrics_prompt_tokens']:g} != usage {usage_in}")
            if data["metrics_generation_tokens"] is not None and data["metrics_generation_tokens"] != usage_out:
                findings.append(f"output tokens: /metrics delta {data['metrics_generation_tokens']:g} != usage {usage_out}")
        else:
            findings.append(f"{failed} requests failed: /metrics deltas include their partial work, not compared")
    data["agree"] = not findings
    data["findings"] = findings
    return data


def prompt_lengths(records: Sequence[RequestRecord], tolerance: int) -> dict:
    """Requested against actual (server usage) prompt tokens. A run whose requests miss the
    requested length by more than `tolerance` tokens did not run the workload it claims: invalid."""
    asked = [r for r in records if r.requested_input_tokens and r.prompt_tokens is not None]
    if not asked:
        return {"checked": 0, "tolerance": tolerance, "valid": True}
    misses = [r.prompt_tokens - r.requested_input_tokens for r in asked]
    off = [m for m in misses if abs(m) > tolerance]
    return {
        "checked": len(asked),
        "requested_mean": sum(r.requested_input_tokens for r in asked) / len(asked),
        "actual_mean": sum(r.prompt_tokens for r in asked) / len(asked),
        "actual_min": min(r.prompt_tokens for r in asked),
        "actual_max": max(r.prompt_tokens for r in asked),
        "max_miss": max(misses, key=abs),
        "tolerance": tolerance,
        "off": len(off),
        "valid": not off,
    }


def client_noise(records: Sequence[RequestRecord], loop_lag: dict, host: dict, stall_share: float | None = None,
                 end_late_s: float | None = None) -> dict:
    """The client's own share in what it measured (the gate's noise model reads these).

    client_time_share: of the time requests occupied the client's slots, the part the client
    added itself: schedule lag, plus the event-loop lag by which each request's end was noticed
    late (`end_late_s`, the lateness an end at a random instant meets, see `end_lateness_s`; the
    probe's mean lag where that is not given). A slower client lowers closed-loop throughput by
    about this share.
    loop_stall_share: the share of the run its event loop(s) stood still (the probe's lateness
    summed: one sample per stall carries the whole stall), per worker process.
    """
    sent = [r for r in records if r.sent_s > 0 or r.end_s > 0]
    lag = sum(max(0.0, r.schedule_lag_s) for r in sent)
    busy = sum(max(0.0, r.e2e_s) for r in sent)
    late_s = (loop_lag.get("mean") or 0.0) / 1000.0
    if end_late_s is not None:
        late_s = max(late_s, end_late_s)
    added = lag + late_s * len(sent)
    return {
        "client_time_share": added / (lag + busy) if lag + busy > 0 else None,
        "schedule_lag_share": lag / (lag + busy) if lag + busy > 0 else None,
        "loop_lag_mean_ms": loop_lag.get("mean"),
        "end_lateness_ms": None if end_late_s is None else 1000 * end_late_s,
        "loop_stall_share": stall_share,
        **host,
    }


def summarize_run(
    load: LoadResult,
    *,
    concurrency: int | None,
    request_rate: float | None,
    slo: SLO | None = None,
    server_delta: dict | None = None,
    server_timeseries: list[dict] | None = None,
    count_output=None,
    keep_requests: bool = True,
    repeat: int = 0,
    prompt_tolerance: int = 1,
) -> dict:
    records = load.records
    ok = [r for r in records if r.ok]
    errors, error_details = _errors(r for r in records if not r.ok)
    duration = load.duration_s or math.nan
    output_tokens = sum(r.completion_tokens or 0 for r in ok)
    input_tokens = sum(r.prompt_tokens or 0 for r in ok)
    lag = summary(r.schedule_lag_s for r in records)
    loop_lag = summary(load.loop_lag_s)
    reasons = _client_bound_reasons(records, lag, concurrency)
    warnings = []
    if (loop_lag["p99"] or 0) > LAG_P99_LIMIT_MS:
        warnings.append(f"event-loop lag p99 {loop_lag['p99']:.1f} ms: chunk timestamps may be late by as much "
                        "(the client process was starved of CPU or busy)")
    good = sum(1 for r in records if slo.met_by(r)) if slo else len(ok)
    run = {
        "concurrency": concurrency,
        "request_rate": request_rate,
        "repeat": repeat,
        "requests_ok": len(ok),
        "requests_failed": len(records) - len(ok),
        "errors": errors,
        "error_details": error_details,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "duration_s": load.duration_s,
        "request_throughput": len(ok) / duration if ok else 0.0,
        "output_throughput": output_tokens / duration if ok else 0.0,
        "total_token_throughput": (input_tokens + output_tokens) / duration if ok else 0.0,
        "ttft_ms": summary(r.ttft_s for r in ok),
        "tpot_ms": summary(t for t in (tpot_s(r) for r in ok) if t is not None),
        "itl_ms": summary(g for r in ok for g in itls_s(r)),
        "e2e_ms": summary(r.e2e_s for r in ok),
        "goodput": {
            "slo": slo.to_json() if slo else {},
            "requests_good": good,
            "request_goodput": good / duration if records and duration == duration else 0.0,
            "fraction": good / len(records) if records else 0.0,
        },
        "schedule_lag_ms": lag,
        "loop_lag_ms": loop_lag,
        "client_bound": bool(reasons),
        "client_bound_reasons": reasons,
        "timing_warnings": warnings,
        "client_noise": client_noise(records, loop_lag, load.host, stall_share(load), end_lateness_s(load)),
        "prompt_tokens": prompt_lengths(records, prompt_tolerance),
        "token_accounting": token_accounting(records, server_delta, count_output),
        "server_metrics": server_delta,
        "server_timeseries": [
            dict(s, t_s=s["wall"] - load.started_wall) for s in (server_timeseries or [])
        ],
        "started_wall": load.started_wall,
    }
    run.update(client_workers(load))
    if keep_requests:
        run["requests"] = [_compact(r) for r in records]
    return run


def _errors(failed: Iterable[RequestRecord]) -> tuple[dict[str, int], dict[str, str]]:
    """Failures per class, and the first reason given for each class."""
    errors: dict[str, int] = {}
    details: dict[str, str] = {}
    for r in failed:
        errors[r.error] = errors.get(r.error, 0) + 1
        if r.error_detail:
            details.setdefault(r.error, r.error_detail)
    return errors, details


def _client_bound_reasons(records: Sequence[RequestRecord], lag: dict, concurrency: int | None) -> list[str]:
    """Why the client, not the server, set the pace (schedule lag past its limits), or []."""
    if not ((lag["p50"] or 0) > LAG_P50_LIMIT_MS or (lag["p99"] or 0) > LAG_P99_LIMIT_MS):
        return []
    reason = (f"schedule lag p50 {lag['p50']:.2f} ms / p99 {lag['p99']:.2f} ms "
              f"(limits {LAG_P50_LIMIT_MS:g} / {LAG_P99_LIMIT_MS:g} ms)")
    first = sorted(records, key=lambda r: r.scheduled_s)[:concurrency or 0]
    if concurrency and first and all(r.scheduled_s == 0 for r in first) and concurrency >= 16:
        wave = summary(r.schedule_lag_s for r in first)
        reason += (f"; the first {concurrency} sends were one burst (their lag p99 {wave['p99']:.1f} ms): "
                   "--ramp-up spreads them")
    return [reason]


def stall_share(load: LoadResult) -> float | None:
    if not load.duration_s or load.duration_s <= 0:
        return None
    return sum(load.loop_lag_s) / (max(1, len(load.workers)) * load.duration_s)


def end_lateness_s(load: LoadResult) -> float | None:
    """How late the loop notices an event that lands at a random instant of the run (s): a stall
    of L seconds is met with probability L / duration and then costs L / 2 on average, so the
    expectation is sum(L^2) / (2 x duration) per worker. The probe's plain mean counts one sample
    per stall (a 550 ms stall weighs as much as a 10 ms tick) and so misses what long stalls cost."""
    if not load.duration_s or load.duration_s <= 0:
        return None
    return sum(x * x for x in load.loop_lag_s) / (2 * max(1, len(load.workers)) * load.duration_s)


def client_workers(load: LoadResult) -> dict:
    """The worker processes' own figures, and which of them died taking requests along."""
    failures = [f"worker {w['worker']} (pid {w['pid']}) died ({w['died']}) after reporting {w['reported']} of "
                f"{w['requests']} requests: those are kept, {w['lost']} were lost"
                for w in load.workers if w.get("died")]
    return {"workers": max(1, len(load.workers)), "client_workers": load.workers,
            "worker_failures": failures, "requests_lost": sum(w["lost"] for w in load.workers if w.get("died"))}


def _compact(r: RequestRecord) -> dict:
    return {
        "index": r.index,
        "scheduled_s": round(r.scheduled_s, 6),
        "dispatched_s": round(r.dispatched_s, 6),
        "sent_s": round(r.sent_s, 6),
        "written_s": None if r.written_s is None else round(r.written_s, 6),
        "end_s": round(r.end_s, 6),
        "chunk_s": [round(t, 6) for t in r.chunk_s],
        "status": r.status,
        "error": r.error,
        "error_detail": r.error_detail,
        "requested_prompt_tokens": r.requested_input_tokens or None,
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": r.completion_tokens,
        "finish_reason": r.finish_reason,
        "request_id": r.request_id,
        "ttft_ms": None if r.ttft_s is None else 1000 * r.ttft_s,
        "e2e_ms": 1000 * r.e2e_s,
    }
