"""The interleaved gate's statistics (harness.serving.sequential), checked by simulation: block log
ratios drawn from a known truth, the rule's promises measured over many simulated gates."""

from __future__ import annotations

import math
import random

import pytest

from harness.serving import gate_metrics as gm
from harness.serving import sequential as seq

THROUGHPUT, TTFT = gm.BY_NAME["output_throughput"], gm.BY_NAME["ttft_p50"]


def test_t_quantiles_match_the_tables():
    assert seq.t_ppf(0.975, 2) == pytest.approx(4.303, abs=1e-3)
    assert seq.t_ppf(0.975, 10) == pytest.approx(2.228, abs=1e-3)
    assert seq.t_ppf(0.995, 10) == pytest.approx(3.169, abs=1e-3)
    assert seq.t_ppf(0.975, 1e7) == pytest.approx(1.960, abs=1e-3)
    assert seq.t_ppf(0.025, 5) == pytest.approx(-2.571, abs=1e-3)


def _gate(rng: random.Random, rule: seq.Rule, slowdown: float, spread: float) -> seq.SequentialGate:
    """One simulated gate: each block's runs drift together (a machine regime falls on both sides),
    the candidate `slowdown` slower: lower throughput, higher TTFT."""
    gate = seq.SequentialGate(rule, metrics=(THROUGHPUT, TTFT))
    while not gate.done():
        regime = math.exp(rng.gauss(0, 0.5))  # large, shared: pairing takes it off
        a = {"output_throughput": 1000 * regime * math.exp(rng.gauss(0, spread / math.sqrt(2))),
             "ttft_ms": {"p50": 50 / regime * math.exp(rng.gauss(0, spread / math.sqrt(2)))}}
        b = {"output_throughput": 1000 * regime / (1 + slowdown) * math.exp(rng.gauss(0, spread / math.sqrt(2))),
             "ttft_ms": {"p50": 50 / regime * (1 + slowdown) * math.exp(rng.gauss(0, spread / math.sqrt(2)))}}
        gate.add_block(a, b)
    return gate


def test_a_a_gates_end_ok_at_the_promised_rate_when_the_budget_is_sized_by_the_noise_model():
    spread = 0.06
    sizing = seq.Rule(max_blocks=40)
    need = seq.plan_first_look({"output_throughput": spread, "ttft_p50": spread}, gm.default_thresholds(), sizing)
    assert 4 <= need <= 40
    rule = seq.Rule(max_blocks=need)  # the budget the noise model asks for
    rng = random.Random(1)
    verdicts = [_gate(rng, rule, 0.0, spread).verdict for _ in range(300)]
    assert verdicts.count(gm.REGRESSED) == 0
    # planned for 95% power per metric: two metrics, so at least ~90%; measured with slack
    assert verdicts.count(gm.OK) / len(verdicts) >= 0.88, (need, verdicts.count(gm.OK))


def test_a_change_exactly_at_the_threshold_is_rarely_called_either_way():
    """The promise at its edge: true worsening = threshold; REGRESSED and OK each at most alpha/2."""
    rng = random.Random(2)
    rule = seq.Rule(max_blocks=15)
    calls = []
    for _ in range(600):
        gate = seq.SequentialGate(rule, metrics=(TTFT,))
        while not gate.done():
            a = 50 * math.exp(rng.gauss(0, 0.05))
            gate.add_block({"ttft_ms": {"p50": a}}, {"ttft_ms": {"p50": a * 1.2 * math.exp(rng.gauss(0, 0.08))}})
        calls.append(gate.calls["ttft_p50"].decision)
    assert calls.count(gm.REGRESSED) / len(calls) <= 0.025 + 0.012
    assert calls.count(gm.OK) / len(calls) <= 0.025 + 0.012


def test_a_planted_20_percent_slowdown_is_found_within_the_budget():
    spread = 0.06
    distance = math.log(1.2) - math.log(1.1)  # throughput's 10% threshold, a 20% slowdown
    rule = seq.Rule(max_blocks=seq.blocks_for(spread, distance, seq.Rule(max_blocks=60)))
    rng = random.Random(3)
    gates = [_gate(rng, rule, 0.20, spread) for _ in range(200)]
    found = sum(g.verdict == gm.REGRESSED for g in gates)
    assert found / len(gates) >= 0.93, found
    # it stops as soon as one metric regressed, before the budget is spent when the signal is clear
    assert sum(g.blocks for g in gates) / len(gates) < rule.max_blocks


def test_an_undecided_metric_says_how_many_more_blocks_would_decide_it():
    rule = seq.Rule(max_blocks=4)
    gate = seq.SequentialGate(rule, metrics=(THROUGHPUT,))
    rng = random.Random(4)
    while not gate.done():
        gate.add_block({"output_throughput": 1000.0}, {"output_throughput": 1000.0 * math.exp(rng.gauss(-0.03, 0.15))})
    call = gate.calls["output_throughput"]
    assert gate.verdict == call.decision == gm.UNDECIDED and gate.blocks == 4
    assert call.ci_low < -0.10 < call.ci_high or call.ci_high > -0.10 > call.ci_low
    assert call.more_blocks is None or call.more_blocks > 0
    assert "more block" in call.needs


def test_a_metric_missing_on_one_side_is_undecided_and_on_both_not_gated():
    gate = seq.SequentialGate(seq.Rule(max_blocks=3), metrics=(THROUGHPUT, gm.BY_NAME["server_ttft_mean"]))
    for _ in range(3):
        gate.add_block({"output_throughput": 100.0, "server_metrics": None}, {"output_throughput": 100.0})
    assert gate.calls["server_ttft_mean"].decision == gm.NOT_GATED
    assert gate.calls["output_throughput"].decision == gm.OK and gate.verdict == gm.OK
    gate = seq.SequentialGate(seq.Rule(max_blocks=3), metrics=(gm.BY_NAME["server_ttft_mean"],))
    for _ in range(3):
        gate.add_block({"server_metrics": {"ttft_mean_ms": 5.0}}, {"server_metrics": None})
    assert gate.calls["server_ttft_mean"].decision == gm.UNDECIDED and "candidate" in gate.calls["server_ttft_mean"].needs


def test_a_budget_spent_before_the_planned_first_look_still_looks_once():
    # a noise model put the first look at block 20; the budget ends the gate after 12 blocks of a
    # server five times slower (the must-show's throughput cut ended UNDECIDED this way before)
    rule = seq.Rule(max_blocks=20, first_look=20)
    rng = random.Random(5)
    gate = seq.SequentialGate(rule, metrics=(TTFT,))
    for _ in range(12):
        a = 50 * math.exp(rng.gauss(0, 0.1))
        gate.add_block({"ttft_ms": {"p50": a}}, {"ttft_ms": {"p50": a * 5 * math.exp(rng.gauss(0, 0.1))}})
    assert gate.verdict == gm.UNDECIDED  # no planned look yet
    assert gate.early_look() and gate.verdict == gm.REGRESSED and gate.calls["ttft_p50"].decided_at == 12
    # the early look is a planned first look at block 12: as strict as a rule with more looks
    early = seq.Rule(max_blocks=20, first_look=12)
    assert early.looks > rule.looks and early.t_look(11) > rule.t_look(11)
    # an A/A gate's early look at the same point is never called a regression here
    regressed = 0
    for _ in range(300):
        gate = seq.SequentialGate(rule, metrics=(TTFT,))
        for _ in range(12):
            a = 50 * math.exp(rng.gauss(0, 0.1))
            gate.add_block({"ttft_ms": {"p50": a}}, {"ttft_ms": {"p50": a * math.exp(rng.gauss(0, 0.1))}})
        gate.early_look()
        regressed += gate.verdict == gm.REGRESSED
    assert regressed <= 2
    # before min_blocks there is no look to take
    gate = seq.SequentialGate(rule, metrics=(TTFT,))
    gate.add_block({"ttft_ms": {"p50": 50.0}}, {"ttft_ms": {"p50": 250.0}})
    assert not gate.early_look() and gate.verdict == gm.UNDECIDED
