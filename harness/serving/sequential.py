"""The interleaved gate's statistics, pure: paired blocks, a sequential rule, a noise model.

A block measures the baseline and the candidate back to back (A B, then B A in the next block, so
that a drift of the machine falls on both sides); its figure per metric is the log ratio of the
two, signed so that positive is worse. After each block from the first look on, every metric not
yet decided gets a Student t interval of the mean paired log ratio:

- REGRESSED when the whole interval lies beyond the threshold,
- OK when the whole interval lies within it,
- otherwise it stays open; the gate adds blocks until every metric is decided, one regressed, or
  the budget (blocks or seconds) is spent: what is still open ends UNDECIDED, with its interval
  and about how many more blocks would decide it at the spread seen.

What the rule promises (per metric, for independent, roughly normal block log ratios): a metric
whose true worsening is at most the threshold is called REGRESSED with probability at most
alpha/2, and one whose true worsening is at least the threshold is called OK with probability at
most alpha/2, over all the looks the rule may take: each look's interval has confidence
1 - alpha / looks (Bonferroni over the planned looks, so looking after every block costs nothing
in error). An A/A gate (true change 0) is therefore called REGRESSED far less often than alpha/2,
and it ends OK once its blocks suffice (`blocks_for`), which the saved noise model lets the next
gate plan for.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import asdict, dataclass, field

from . import gate_metrics as gm
from .gate_metrics import NOT_GATED, OK, REGRESSED, UNDECIDED


# --- Student's t, from the regularized incomplete beta (no scipy in the harness's venv) ---

def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((a + m2 - 1) * (a + m2)), -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def betai(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    tail = 0.5 * betai(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t >= 0 else tail


@functools.lru_cache(maxsize=4096)
def t_ppf(p: float, df: float) -> float:
    """The p quantile of Student's t with df degrees of freedom (bisection on t_cdf)."""
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_ppf(1 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2
        if hi > 1e12:
            return math.inf
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-10 * max(1.0, hi):
            break
    return (lo + hi) / 2


# --- the rule ---

@dataclass(frozen=True)
class Rule:
    alpha: float = 0.05
    min_blocks: int = 3  # the earliest look (at least 3: two degrees of freedom)
    max_blocks: int = 12
    first_look: int | None = None  # planned from a noise model; None: min_blocks
    power: float = 0.95  # what blocks_for plans for

    @property
    def start(self) -> int:
        return min(self.max_blocks, max(self.min_blocks, self.first_look or self.min_blocks))

    @property
    def looks(self) -> int:
        return self.max_blocks - self.start + 1

    def t_look(self, df: int, looks: int | None = None) -> float:
        """The t quantile of one look's two-sided interval (confidence 1 - alpha / looks)."""
        return t_ppf(1 - self.alpha / (2 * (looks or self.looks)), df)


@dataclass
class MetricCall:
    """One metric's state in a gate: its decision and the figures behind it."""

    metric: str
    unit: str
    threshold: float
    higher_is_worse: bool
    decision: str = UNDECIDED
    blocks: int = 0
    change: float | None = None  # candidate / baseline - 1, geometric mean of the blocks' ratios
    ci_low: float | None = None
    ci_high: float | None = None
    spread: float | None = None  # standard deviation of the blocks' log ratios
    decided_at: int | None = None
    more_blocks: int | None = None
    needs: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def blocks_for(spread: float, distance: float, rule: Rule, limit: int = 10_000) -> int | None:
    """The blocks a metric needs to be decided with probability `rule.power` when its true log
    worsening lies `distance` from the threshold and its blocks' log ratios spread by `spread`:
    the smallest n with (t_look(n - 1) + z_power) x spread / sqrt(n) <= distance. None when more
    than `limit`."""
    if spread <= 0:
        return rule.min_blocks
    if distance <= 0:
        return None
    z = statistics.NormalDist().inv_cdf(rule.power)
    looks = rule.looks
    # t_look(df) is at least the normal quantile: start the search at the normal answer
    z_look = statistics.NormalDist().inv_cdf(1 - rule.alpha / (2 * looks))
    start = max(3, rule.min_blocks, math.floor(((z_look + z) * spread / distance) ** 2))
    if start > limit:
        return None
    for n in range(start, limit + 1):
        if (rule.t_look(n - 1, looks) + z) * spread / math.sqrt(n) <= distance:
            return n
    return None


def decide(metric: gm.GateMetric, threshold: float, diffs: list[float], rule: Rule) -> MetricCall:
    """One look at a metric's paired log worsenings (positive: the candidate is worse)."""
    call = MetricCall(metric.name, metric.unit, threshold, metric.higher_is_worse, blocks=len(diffs))
    if not diffs:
        return call
    mean = statistics.fmean(diffs)
    sign = 1 if metric.higher_is_worse else -1
    call.change = math.expm1(sign * mean)
    limit = gm.worse_log_threshold(metric, threshold)
    if len(diffs) < 2:
        call.needs = "at least 2 blocks"
        return call
    sd = statistics.stdev(diffs)
    call.spread = sd
    half = rule.t_look(len(diffs) - 1) * sd / math.sqrt(len(diffs))
    lo, hi = mean - half, mean + half  # as log worsening
    call.ci_low, call.ci_high = sorted((math.expm1(sign * lo), math.expm1(sign * hi)))
    if len(diffs) >= rule.start:
        if lo > limit:
            call.decision = REGRESSED
        elif hi < limit:
            call.decision = OK
    if call.decision == UNDECIDED:
        need = blocks_for(sd, abs(mean - limit), rule)
        call.more_blocks = None if need is None else max(0, need - len(diffs))
        call.needs = (f"about {call.more_blocks} more block{'' if call.more_blocks == 1 else 's'} at this spread" if need is not None
                      else "more blocks than a gate can afford (the estimate sits on the threshold)")
    return call


@dataclass
class SequentialGate:
    """Blocks in, decisions out: a metric decided at a look keeps its decision (the stopping
    rule the promise is about); the gate is done when every gated metric is decided or one
    regressed, or the blocks run out."""

    rule: Rule
    thresholds: dict[str, float] = field(default_factory=gm.default_thresholds)
    metrics: tuple[gm.GateMetric, ...] = gm.GATE_METRICS
    diffs: dict[str, list[float]] = field(default_factory=dict)
    missing: dict[str, set[str]] = field(default_factory=dict)  # metric -> sides that lacked a value
    calls: dict[str, MetricCall] = field(default_factory=dict)
    blocks: int = 0

    def add_block(self, baseline_run: dict, candidate_run: dict) -> None:
        self.blocks += 1
        for m in self.metrics:
            a, b = m.value(baseline_run), m.value(candidate_run)
            if a is None or b is None or a <= 0 or b <= 0:
                for side, v in (("baseline", a), ("candidate", b)):
                    if v is None or v <= 0:
                        self.missing.setdefault(m.name, set()).add(side)
                continue
            self.diffs.setdefault(m.name, []).append((math.log(b) - math.log(a)) * (1 if m.higher_is_worse else -1))
        self._look(self.rule)

    def early_look(self) -> bool:
        """The budget ends the gate before its planned first look (a noise model put it late): one
        look at the blocks in hand, as if the first look had been planned here. That plan has more
        looks, so each interval is wider than a planned look's and the promise holds. True when it
        looked."""
        if not self.rule.min_blocks <= self.blocks < self.rule.start:
            return False
        self._look(Rule(self.rule.alpha, self.rule.min_blocks, self.rule.max_blocks, self.blocks, self.rule.power))
        return True

    def _look(self, rule: Rule) -> None:
        for m in self.metrics:
            prior = self.calls.get(m.name)
            if prior is not None and prior.decision in (OK, REGRESSED, NOT_GATED):
                continue
            call = decide(m, self.thresholds.get(m.name, m.threshold), self.diffs.get(m.name, []), rule)
            lacking = self.missing.get(m.name, set())
            if not self.diffs.get(m.name) and lacking == {"baseline", "candidate"}:
                call.decision, call.needs = NOT_GATED, "not measured on either side"
            elif lacking and call.decision != REGRESSED:
                call.decision = UNDECIDED
                call.needs = f"a value in every block ({' and '.join(sorted(lacking))} lacked one)"
            if call.decision in (OK, REGRESSED):
                call.decided_at = self.blocks
            self.calls[m.name] = call

    @property
    def verdict(self) -> str:
        return gm.overall([c.decision for c in self.calls.values() if c.decision != NOT_GATED])

    def done(self) -> bool:
        if self.blocks >= self.rule.max_blocks:
            return True
        decisions = [c.decision for c in self.calls.values()]
        return REGRESSED in decisions or (bool(decisions) and UNDECIDED not in decisions)

    def spreads(self) -> dict[str, float]:
        return {name: statistics.stdev(d) for name, d in self.diffs.items() if len(d) >= 2}


def plan_first_look(spreads: dict[str, float], thresholds: dict[str, float], rule: Rule) -> int | None:
    """The blocks an A/A gate needs to end OK (power `rule.power`) at a saved spread: the most any
    gated metric needs (None when no spread is known)."""
    needs = []
    for m in gm.GATE_METRICS:
        if m.name in spreads:
            need = blocks_for(spreads[m.name], gm.worse_log_threshold(m, thresholds.get(m.name, m.threshold)), rule)
            needs.append(need if need is not None else rule.max_blocks)
    return max(needs) if needs else None
