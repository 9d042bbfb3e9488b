"""Compare two bench results with a noise model; say which metric regressed, by how much.

Noise model: a two-level (hierarchical) bootstrap. Each resample draws runs with replacement, then
requests with replacement inside each drawn run, so both run-to-run drift and request-to-request
spread widen the interval. Latency statistics (p50, mean, p99 of per-request TTFT, TPOT, E2E) come
from the pooled resampled requests; throughputs from the mean over resampled runs. The change is
candidate / baseline - 1 with a 95% percentile interval over the paired resample ratios.

A metric regresses only when the whole 95% interval lies beyond its threshold: we are confident
it got worse by more than the threshold. A point estimate beyond the threshold with an interval
that straddles it is "inconclusive" (too noisy to say; exit 0, shown in the table), so noise alone
never fails the gate and a real slowdown of a few times always does. Comparing needs at least `min_repeats` runs per
level on each side, and equal config fingerprints (model, flags, workload, hardware, versions)
unless a differing field is explicitly allowed (an upgrade rehearsal allows server_version).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, asdict
from typing import Callable

from ..errors import UsageError
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
}
DEFAULT_THRESHOLDS = {
    "ttft_p50": 0.20, "ttft_mean": 0.20, "ttft_p99": 0.50, "tpot_p50": 0.20, "e2e_p50": 0.20,
    "output_throughput": 0.10, "request_throughput": 0.10,
}


class RefusedComparison(UsageError):
    """The two results cannot be compared (exit 2)."""


@dataclass
class MetricChange:
    level: str
    metric: str
    baseline: float
    candidate: float
    change: float  # candidate / baseline - 1
    ci_low: float
    ci_high: float
    threshold: float
    higher_is_worse: bool
    verdict: str  # regressed | improved | inconclusive | worse/better, within threshold | unchanged

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Comparison:
    changes: list[MetricChange]
    behaviours: list[str]  # failures, token disagreements, metric names that appeared or vanished
    allowed_differences: dict[str, tuple]
    regressed: bool

    def to_json(self) -> dict:
        return {"changes": [c.to_json() for c in self.changes], "behaviours": self.behaviours,
                "allowed_differences": {k: list(v) for k, v in self.allowed_differences.items()},
                "regressed": self.regressed}


def parse_thresholds(text: str | None) -> dict[str, float]:
    thresholds = dict(DEFAULT_THRESHOLDS)
    if not text:
        return thresholds
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if key not in METRICS or not sep:
            raise UsageError(f"--threshold: {item!r} is not METRIC=N% (metrics: {', '.join(METRICS)})")
        value = value.strip()
        try:
            thresholds[key] = float(value[:-1]) / 100 if value.endswith("%") else float(value)
        except ValueError:
            raise UsageError(f"--threshold: {item!r} needs a number such as 10%") from None
        if thresholds[key] < 0:
            raise UsageError(f"--threshold: {item!r} must not be negative")
    return thresholds


def fingerprint_differences(baseline: dict, candidate: dict) -> dict[str, tuple]:
    a, b = fingerprint(baseline), fingerprint(candidate)
    return {k: (a[k], b[k]) for k in FINGERPRINT_FIELDS if a[k] != b[k]}


def _level(run: dict) -> str:
    return f"rate {run['request_rate']:g}/s" if run.get("request_rate") else f"c={run['concurrency']}"


def _per_request(run: dict, source: str) -> list[float]:
    out = []
    for r in run.get("requests") or []:
        if r.get("error"):
            continue
        if source == "ttft_ms" and r.get("ttft_ms") is not None:
            out.append(r["ttft_ms"])
        elif source == "e2e_ms":
            out.append(r["e2e_ms"])
        elif source == "tpot_ms":
            n = r.get("completion_tokens") or len(r.get("chunk_s") or [])
            if r.get("ttft_ms") is not None and n >= 2:
                out.append((r["e2e_ms"] - r["ttft_ms"]) / (n - 1))
    return out


def _stat(name: str) -> Callable[[list[float]], float]:
    from .stats import percentile

    if name == "mean":
        return lambda xs: sum(xs) / len(xs) if xs else math.nan
    q = float(name[1:])
    return lambda xs: percentile(xs, q)


def _bootstrap_requests(runs: list[list[float]], stat, rng: random.Random, n: int) -> list[float]:
    runs = [r for r in runs if r]
    out = []
    for _ in range(n):
        pooled: list[float] = []
        for _ in range(len(runs)):
            run = runs[rng.randrange(len(runs))]
            pooled.extend(rng.choices(run, k=len(run)))
        out.append(stat(pooled))
    return out


def _bootstrap_runs(values: list[float], rng: random.Random, n: int) -> list[float]:
    return [sum(rng.choices(values, k=len(values))) / len(values) for _ in range(n)]


def compare(
    baseline: dict,
    candidate: dict,
    *,
    thresholds: dict[str, float] | None = None,
    allow: tuple[str, ...] = (),
    min_repeats: int = 3,
    resamples: int = 1000,
    seed: int = 0,
) -> Comparison:
    thresholds = thresholds or dict(DEFAULT_THRESHOLDS)
    diffs = fingerprint_differences(baseline, candidate)
    refused = {k: v for k, v in diffs.items() if k not in allow}
    if refused:
        detail = "; ".join(f"{k}: {_short(v[0])} vs {_short(v[1])}" for k, v in refused.items())
        raise RefusedComparison(f"config fingerprints differ ({detail}); pass --allow-diff "
                                f"{','.join(refused)} to compare anyway")
    base_runs, cand_runs = _by_level(baseline), _by_level(candidate)
    common = [lvl for lvl in base_runs if lvl in cand_runs]
    if not common:
        raise RefusedComparison(f"no concurrency/rate level in common (baseline {', '.join(base_runs)}; candidate {', '.join(cand_runs)})")
    for lvl in common:
        for side, runs in (("baseline", base_runs[lvl]), ("candidate", cand_runs[lvl])):
            if len(runs) < min_repeats:
                raise RefusedComparison(f"{side} has {len(runs)} run(s) at {lvl}; a noise model needs at least {min_repeats} (bench --repeats {min_repeats})")
    rng = random.Random(seed)
    changes: list[MetricChange] = []
    for lvl in common:
        for metric, (source, stat_name, worse_up) in METRICS.items():
            b, c = base_runs[lvl], cand_runs[lvl]
            if source == "run":
                bv, cv = [r[stat_name] for r in b], [r[stat_name] for r in c]
                if not bv or not cv:
                    continue
                point_b, point_c = sum(bv) / len(bv), sum(cv) / len(cv)
                boot_b, boot_c = _bootstrap_runs(bv, rng, resamples), _bootstrap_runs(cv, rng, resamples)
            else:
                bq, cq = [_per_request(r, source) for r in b], [_per_request(r, source) for r in c]
                stat = _stat(stat_name)
                if any(bq) and any(cq):
                    point_b, point_c = stat([x for r in bq for x in r]), stat([x for r in cq for x in r])
                    boot_b = _bootstrap_requests(bq, stat, rng, resamples)
                    boot_c = _bootstrap_requests(cq, stat, rng, resamples)
                else:  # no raw events kept: fall back to per-run figures
                    bv = [r[source][stat_name] for r in b if r[source].get(stat_name) is not None]
                    cv = [r[source][stat_name] for r in c if r[source].get(stat_name) is not None]
                    if not bv or not cv:
                        continue
                    point_b, point_c = sum(bv) / len(bv), sum(cv) / len(cv)
                    boot_b, boot_c = _bootstrap_runs(bv, rng, resamples), _bootstrap_runs(cv, rng, resamples)
            if not point_b or math.isnan(point_b) or math.isnan(point_c):
                continue
            ratios = sorted(cb / bb - 1 for bb, cb in zip(boot_b, boot_c) if bb and not math.isnan(bb) and not math.isnan(cb))
            lo = ratios[int(0.025 * (len(ratios) - 1))]
            hi = ratios[int(0.975 * (len(ratios) - 1))]
            change = point_c / point_b - 1
            th = thresholds.get(metric, 0.1)
            worse = change if worse_up else -change
            worse_lo = lo if worse_up else -hi  # the least-bad end of the interval, as worsening
            better_lo = -hi if worse_up else lo  # the least-good end, as improvement
            if worse_lo > th:
                verdict = "regressed"
            elif better_lo > th:
                verdict = "improved"
            elif abs(worse) > th:
                verdict = "inconclusive"
            elif worse_lo > 0:
                verdict = "worse, within threshold"
            elif better_lo > 0:
                verdict = "better, within threshold"
            else:
                verdict = "unchanged"
            changes.append(MetricChange(lvl, metric, point_b, point_c, change, lo, hi, th, worse_up, verdict))
    behaviours = _behaviours(baseline, candidate, base_runs, cand_runs)
    regressed = any(c.verdict == "regressed" for c in changes) or any(b.startswith("REGRESSION") for b in behaviours)
    return Comparison(changes=changes, behaviours=behaviours, allowed_differences=diffs, regressed=regressed)


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
        disagreements = [f for r in runs for f in r.get("token_accounting", {}).get("findings", [])]
        if disagreements and not any(r.get("token_accounting", {}).get("findings") for r in base_runs.get(lvl, [])):
            notes.append(f"REGRESSION {lvl}: token accounting now disagrees: {disagreements[0]}")
    for side, runs_by in (("baseline", base_runs), ("candidate", cand_runs)):
        lagged = [r for runs in runs_by.values() for r in runs if r.get("timing_warnings") or r.get("client_bound")]
        if lagged:
            worst = max((r.get("loop_lag_ms") or {}).get("p99") or 0 for r in lagged)
            notes.append(f"{side}: {len(lagged)} run(s) with client timing warnings (event-loop lag p99 up to "
                         f"{worst:.0f} ms): the client was starved of CPU; latencies there are less certain")
    names_b = set(baseline.get("environment", {}).get("metric_names") or [])
    names_c = set(candidate.get("environment", {}).get("metric_names") or [])
    if names_b and names_c:
        if names_b - names_c:
            notes.append("metric names gone in candidate: " + ", ".join(sorted(names_b - names_c)))
        if names_c - names_b:
            notes.append("metric names new in candidate: " + ", ".join(sorted(names_c - names_b)))
    for key in ("startup",):
        sb = baseline.get("environment", {}).get(key) or {}
        sc = candidate.get("environment", {}).get(key) or {}
        for field in ("kv_cache_tokens", "max_concurrency", "kv_cache_memory_gib", "startup_s"):
            if sb.get(field) is not None and sc.get(field) is not None and sb[field] != sc[field]:
                notes.append(f"startup {field}: {sb[field]} -> {sc[field]}")
    return notes


def format_table(result: Comparison) -> str:
    rows = [("level", "metric", "baseline", "candidate", "change", "95% CI", "threshold", "verdict")]
    for c in result.changes:
        rows.append((c.level, c.metric, f"{c.baseline:.2f}", f"{c.candidate:.2f}", f"{100 * c.change:+.1f}%",
                     f"[{100 * c.ci_low:+.1f}%, {100 * c.ci_high:+.1f}%]", f"{100 * c.threshold:.0f}%",
                     c.verdict.upper() if c.verdict == "regressed" else c.verdict))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    if result.allowed_differences:
        lines.append("allowed differences: " + "; ".join(f"{k}: {_short(a)} -> {_short(b)}" for k, (a, b) in result.allowed_differences.items()))
    lines += result.behaviours
    return "\n".join(lines)
