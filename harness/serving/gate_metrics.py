"""The gate's metrics: one row each (name, where its value is read, unit, direction, default
threshold). `compare`, the interleaved `gate`, their --help, their tables and docs/serving.md
read these rows; nothing else lists the metrics or their defaults.

The three words every gate answers with, and the exit codes they map to, live here too, so that
`compare`, `gate` and the serving suite cannot drift apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import UsageError
from ..units import comma_list

OK, REGRESSED, UNDECIDED = "OK", "REGRESSED", "UNDECIDED"
NOT_GATED = "n/a"  # the metric has no meaning for this workload, or neither side measured it
EXIT_CODES = {OK: 0, REGRESSED: 1, UNDECIDED: 3}
UNDECIDED_CHOICES = ("fail", "pass")  # --undecided: fail (exit 3) or pass (exit 0, said in the last line)


@dataclass(frozen=True)
class GateMetric:
    name: str
    source: str  # "run" (a top-level figure of a run) or the run's summary object (ttft_ms, ...)
    stat: str  # the key inside it
    unit: str
    higher_is_worse: bool
    threshold: float  # default: the share of worsening that counts as a regression
    what: str

    @property
    def direction(self) -> str:
        return "lower is better" if self.higher_is_worse else "higher is better"

    def value(self, run: dict) -> float | None:
        """This metric's value in one run of a bench results file (None when absent or not finite)."""
        raw = run.get(self.stat) if self.source == "run" else (run.get(self.source) or {}).get(self.stat)
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
            return None
        return float(raw)


GATE_METRICS: tuple[GateMetric, ...] = (
    GateMetric("ttft_p50", "ttft_ms", "p50", "ms", True, 0.20, "median time to first token"),
    GateMetric("ttft_mean", "ttft_ms", "mean", "ms", True, 0.20, "mean time to first token"),
    GateMetric("ttft_p99", "ttft_ms", "p99", "ms", True, 0.50, "99th percentile time to first token"),
    GateMetric("tpot_p50", "tpot_ms", "p50", "ms", True, 0.20, "median time per output token after the first"),
    GateMetric("e2e_p50", "e2e_ms", "p50", "ms", True, 0.20, "median end-to-end request latency"),
    GateMetric("output_throughput", "run", "output_throughput", "tok/s", False, 0.10, "output tokens per second"),
    GateMetric("request_throughput", "run", "request_throughput", "req/s", False, 0.10, "requests per second"),
    # the server's own TTFT (its /metrics histogram over the run): timed on the server's clock, so
    # the client's lag cannot move it; the machine's contention still can
    GateMetric("server_ttft_mean", "server_metrics", "ttft_mean_ms", "ms", True, 0.20,
               "mean TTFT from the server's own histogram"),
)
BY_NAME: dict[str, GateMetric] = {m.name: m for m in GATE_METRICS}
# Gated from the two servers' start-up logs (the upgrade rehearsal, harness/serving/upgrade_kv.py),
# not from runs: deterministic, so no noise interval: a drop beyond the threshold is REGRESSED,
# otherwise OK; a log without the figure is UNDECIDED.
STARTUP_GATE_METRICS: tuple[GateMetric, ...] = (
    GateMetric("kv_cache_tokens", "startup", "kv_cache_tokens", "tokens", False, 0.05,
               "KV cache tokens the server's start-up logged (upgrade rehearsal; exact, no noise interval)"),
)
STARTUP_BY_NAME: dict[str, GateMetric] = {m.name: m for m in STARTUP_GATE_METRICS}


def default_thresholds() -> dict[str, float]:
    return {m.name: m.threshold for m in GATE_METRICS}


def thresholds_help() -> str:
    """The --threshold help text, written from the rows (argparse needs %% for %)."""
    rows = ", ".join(f"{m.name} {100 * m.threshold:g}%% ({m.unit}, {m.direction})" for m in GATE_METRICS)
    return f"per-metric thresholds, e.g. ttft_p50=10%%,output_throughput=5%%; defaults: {rows}"


def parse_thresholds(text: str | None) -> dict[str, float]:
    thresholds = default_thresholds()
    if not text:
        return thresholds
    for item in comma_list(text, "--threshold"):
        key, sep, value = item.partition("=")
        key = key.strip()
        if key not in BY_NAME or not sep:
            raise UsageError(f"--threshold: {item!r} is not METRIC=N% (metrics: {', '.join(BY_NAME)})")
        value = value.strip()
        try:
            thresholds[key] = float(value[:-1]) / 100 if value.endswith("%") else float(value)
        except ValueError:
            raise UsageError(f"--threshold: {item!r} needs a number such as 10%") from None
        if not 0 <= thresholds[key] < 100 or thresholds[key] != thresholds[key]:
            raise UsageError(f"--threshold: {item!r} must be a share between 0% and 10000%")
    return thresholds


def worse_log_threshold(metric: GateMetric, threshold: float) -> float:
    """The threshold as a log worsening: latency above (1 + t)x, throughput below (1 - t)x."""
    if metric.higher_is_worse:
        return math.log1p(threshold)
    return -math.log1p(-threshold) if threshold < 1 else math.inf


def overall(decisions: list[str]) -> str:
    """REGRESSED if any metric regressed, else UNDECIDED if any is undecided, else OK."""
    if REGRESSED in decisions:
        return REGRESSED
    if UNDECIDED in decisions:
        return UNDECIDED
    return OK


def exit_code(verdict: str, undecided: str = "fail") -> int:
    if verdict == UNDECIDED and undecided == "pass":
        return 0
    return EXIT_CODES[verdict]


def fmt_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    digits = 2 if abs(value) < 100 else 1 if abs(value) < 10000 else 0
    return f"{value:.{digits}f} {unit}"


def docs_table() -> str:
    """The metrics as a markdown table (docs/serving.md holds a copy; tests/test_serving_compare.py checks it)."""
    lines = ["| metric | unit | direction | default threshold | what |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| `{m.name}` | {m.unit} | {m.direction} | {100 * m.threshold:g}% | {m.what} |"
              for m in GATE_METRICS + STARTUP_GATE_METRICS]
    return "\n".join(lines)
