"""Open-loop load as the peers offer it: a request-rate sweep to saturation, and goodput.

`bench --request-rate 2,4,8` runs each rate (Poisson arrivals); `--request-rate sweep` doubles the
rate from `--sweep-start` until the server saturates: doubling the offered rate gave less than
SATURATED_GAIN more achieved throughput, or requests failed. Each rate's run keeps its figures.

Goodput (DistServe's and vLLM's `--goodput`): requests per second that met every SLO limit (TTFT,
TPOT, E2E), failures counted in the denominator. The highest rate meeting the SLO is the highest
offered rate whose share of good requests was at least the target (`--slo-target`, default 90%).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError

SATURATED_GAIN = 1.15  # doubling the offered rate gave < 15% more throughput: saturated
MAX_SWEEP_LEVELS = 12


@dataclass(frozen=True)
class SweepPlan:
    rates: tuple[float, ...] = ()  # fixed rates, in order
    auto: bool = False  # double from `start` to saturation
    start: float = 1.0


def parse_rates(text: str | None, start: float = 1.0) -> SweepPlan | None:
    """--request-rate: a rate, a comma list of rates, or "sweep"."""
    if text is None:
        return None
    if str(text).strip().lower() == "sweep":
        if not start > 0:
            raise UsageError("--sweep-start must be positive")
        return SweepPlan(auto=True, start=start)
    try:
        rates = tuple(float(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--request-rate: {text!r} is not a rate, a comma list of rates, or sweep") from None
    if not rates or min(rates) <= 0 or any(r != r or r == float("inf") for r in rates):
        raise UsageError(f"--request-rate: {text!r} needs positive rates (requests/s)")
    return SweepPlan(rates=rates)


def next_rate(plan: SweepPlan, runs: list[dict]) -> float | None:
    """The next rate to run, or None when the sweep is done."""
    if not plan.auto:
        done = len({r["request_rate"] for r in runs})
        return plan.rates[done] if done < len(plan.rates) else None
    firsts = _first_runs(runs)
    if not firsts:
        return plan.start
    if len(firsts) >= MAX_SWEEP_LEVELS or saturated(firsts):
        return None
    return firsts[-1]["request_rate"] * 2


def _first_runs(runs: list[dict]) -> list[dict]:
    """One run per rate (the first repeat), in the order they ran."""
    seen, out = set(), []
    for run in runs:
        rate = run.get("request_rate")
        if rate and rate not in seen:
            seen.add(rate)
            out.append(run)
    return out


def saturated(points: list[dict]) -> bool:
    last = points[-1]
    if last["requests_failed"]:
        return True
    if len(points) < 2:
        return False
    before = points[-2]
    return last["request_throughput"] < SATURATED_GAIN * before["request_throughput"]


def summarize(runs: list[dict], slo: dict, target: float) -> dict | None:
    """The sweep's curve, its saturation point and the highest rate meeting the SLO (None when
    the runs are not open-loop)."""
    by_rate: dict[float, list[dict]] = {}
    for run in runs:
        if run.get("request_rate"):
            by_rate.setdefault(run["request_rate"], []).append(run)
    if not by_rate:
        return None
    points = []
    for rate in sorted(by_rate):
        rs = by_rate[rate]
        mean = lambda key: sum(r[key] for r in rs) / len(rs)  # noqa: E731
        total = sum(r["requests_ok"] + r["requests_failed"] for r in rs)
        good = sum((r.get("goodput") or {}).get("requests_good", r["requests_ok"]) for r in rs)
        points.append({
            "offered_rate": rate, "runs": len(rs),
            "request_throughput": mean("request_throughput"), "output_throughput": mean("output_throughput"),
            "request_goodput": sum((r.get("goodput") or {}).get("request_goodput", 0.0) for r in rs) / len(rs),
            "good_fraction": good / total if total else 0.0, "requests_failed": sum(r["requests_failed"] for r in rs),
            "ttft_p50_ms": _mean_stat(rs, "ttft_ms", "p50"), "ttft_p99_ms": _mean_stat(rs, "ttft_ms", "p99"),
            "tpot_p50_ms": _mean_stat(rs, "tpot_ms", "p50"), "tpot_p99_ms": _mean_stat(rs, "tpot_ms", "p99"),
            "client_bound": any(r.get("client_bound") for r in rs),
        })
    best = max(points, key=lambda p: p["request_throughput"])
    meeting = [p for p in points if p["good_fraction"] >= target] if slo else []
    return {
        "points": points,
        "saturation": {"request_throughput": best["request_throughput"], "output_throughput": best["output_throughput"],
                       "at_offered_rate": best["offered_rate"],
                       "reached": any(saturated(points[:k + 1]) for k in range(1, len(points)))},
        "slo": slo, "slo_target": target,
        "max_rate_meeting_slo": max(p["offered_rate"] for p in meeting) if meeting else None,
        "goodput_at_that_rate": max(meeting, key=lambda p: p["offered_rate"])["request_goodput"] if meeting else None,
        # lower rates that missed the target: the curve is not monotone (noise, a stall), so the
        # highest rate meeting it is no promise that every lower load does
        "missed_below": [p["offered_rate"] for p in points if meeting and p["good_fraction"] < target
                         and p["offered_rate"] < max(m["offered_rate"] for m in meeting)],
    }


def _mean_stat(runs: list[dict], source: str, stat: str) -> float | None:
    values = [v for r in runs if isinstance(v := (r.get(source) or {}).get(stat), (int, float))]
    return sum(values) / len(values) if values else None


def line(summary: dict) -> str:
    """One line for the terminal."""
    sat = summary["saturation"]
    text = (f"sweep: saturation {'reached' if sat['reached'] else 'not reached'}, at most "
            f"{sat['request_throughput']:.2f} req/s ({sat['output_throughput']:.0f} output tok/s) at offered "
            f"{sat['at_offered_rate']:g}/s")
    if summary["slo"]:
        best = summary["max_rate_meeting_slo"]
        limits = ", ".join(f"{k} {v:g}" for k, v in summary["slo"].items())
        text += (f"; highest rate with >= {100 * summary['slo_target']:.0f}% of requests within {limits}: "
                 + (f"{best:g}/s (goodput {summary['goodput_at_that_rate']:.2f} req/s)" if best else "none"))
        if summary.get("missed_below"):
            text += (f", but the lower {', '.join(f'{r:g}/s' for r in summary['missed_below'])} missed it "
                     "(not monotone: noise or a stall; repeat the sweep or add --repeats)")
    return text
