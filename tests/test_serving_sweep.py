"""Open-loop rate sweep to saturation and goodput, against the stand-in: with requests in flight
capped at 2 and each request taking a known time, the server side can give at most 2 / e2e
requests per second; the sweep must find that plateau, stop there, and draw it on the page.

The plateau is judged by each run's own figures, not by one run's wall-clock against another's:
a run's slot occupancy, sum(e2e) / (2 x its span), is 1 when both slots were busy throughout (on
the plateau, whatever the e2e of that moment) and can never exceed 1 under the cap, and the
stand-in's configured timing is a floor on e2e that load can only raise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import UsageError
from harness.serving.standin import run_standin
from harness.serving.sweep import SweepPlan, line, next_rate, parse_rates, summarize

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


def _e2e_s(run: dict) -> list[float]:
    return [r["end_s"] - r["sent_s"] for r in run["requests"] if not r.get("error")]


def _occupancy(run: dict, slots: int) -> float:
    """The share of the run's span (first send to last end) that its slots spent on requests."""
    reqs = [r for r in run["requests"] if not r.get("error")]
    span = max(r["end_s"] for r in reqs) - min(r["sent_s"] for r in reqs)
    return sum(_e2e_s(run)) / (slots * span)


@pytest.mark.parametrize("text", ["0", "-1", "fast", "1,,x", "nan", "inf"])
def test_bad_rates_are_usage_errors(text):
    with pytest.raises(UsageError, match="--request-rate"):
        parse_rates(text)


def test_rate_lists_run_in_order_and_a_sweep_doubles_until_throughput_stops_growing():
    plan = parse_rates("2,8,4")
    assert plan == SweepPlan(rates=(2.0, 8.0, 4.0))
    assert next_rate(plan, [{"request_rate": 2.0}]) == 8.0
    auto = parse_rates("sweep", start=3)
    run = lambda rate, tput, failed=0: {"request_rate": rate, "request_throughput": tput,  # noqa: E731
                                        "requests_failed": failed}
    assert next_rate(auto, []) == 3
    assert next_rate(auto, [run(3, 2.9), run(6, 5.8)]) == 12
    assert next_rate(auto, [run(3, 2.9), run(6, 5.8), run(12, 6.2)]) is None  # +7% for twice the rate
    assert next_rate(auto, [run(3, 2.9), run(6, 5.8, failed=1)]) is None


def test_goodput_counts_failures_and_takes_the_highest_rate_meeting_the_target():
    def run(rate, ok, good, failed=0):
        return {"request_rate": rate, "request_throughput": ok / 10, "output_throughput": ok, "requests_ok": ok,
                "requests_failed": failed, "goodput": {"requests_good": good, "request_goodput": good / 10},
                "ttft_ms": {"p50": 10, "p99": 20}, "tpot_ms": {"p50": 1, "p99": 2}}

    s = summarize([run(1, 10, 10), run(2, 20, 19), run(4, 36, 30, failed=4)], {"ttft_ms": 100}, 0.9)
    assert [p["good_fraction"] for p in s["points"]] == [1.0, 0.95, 0.75]  # 30 of 40: failures count
    assert s["max_rate_meeting_slo"] == 2 and s["goodput_at_that_rate"] == pytest.approx(1.9)
    assert s["saturation"]["at_offered_rate"] == 4
    assert s["missed_below"] == [] and "missed it" not in line(s)
    # a curve that is not monotone (seen on a busy box: 4/s 88%, 16/s 17%, 32/s 100%): the highest
    # rate meeting the target stands, and the line names the lower rates that missed it
    bumpy = summarize([run(4, 40, 35), run(8, 40, 39), run(16, 40, 7), run(32, 40, 40)], {"ttft_ms": 500}, 0.9)
    assert bumpy["max_rate_meeting_slo"] == 32 and bumpy["missed_below"] == [4, 16]
    assert "32/s (goodput" in line(bumpy) and "but the lower 4/s, 16/s missed it" in line(bumpy)


@pytest.mark.alone
def test_bench_sweep_finds_the_capped_plateau_and_the_page_draws_it(tmp_path):
    out = tmp_path / "sweep.json"
    with run_standin(ttft_ms=20, token_interval_ms=10, log_dir=tmp_path) as server:
        proc = _cli("bench", "--endpoint", server.base_url, "--model", "standin", "--request-rate", "sweep",
                    "--sweep-start", "8", "--concurrency", "2", "--num-prompts", "24", "--input-len", "8",
                    "--output-len", "8", "--slo", "ttft_ms=500", "--workers", "1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    s = data["sweep"]
    rates = [p["offered_rate"] for p in s["points"]]
    assert rates[:3] == [8, 16, 32] and s["saturation"]["reached"]  # doubling from below the cap (~22/s)
    # Judged per run: a bound from the fastest run's e2e (the old test) failed whenever load came
    # and went during the sweep (5 of 8 sweeps under intermittent CPU hogs): a slowed run at 32/s
    # rightly ends the sweep on a lower plateau, which that bound called "stopped too early".
    by_rate = {r["request_rate"]: r for r in data["runs"]}
    occupancy = {rate: _occupancy(run, slots=2) for rate, run in by_rate.items()}
    assert max(occupancy.values()) <= 1.001, occupancy  # never more than 2 in flight: the cap held
    last = by_rate[rates[-1]]
    cap_at_stop = 2 / (sum(_e2e_s(last)) / len(_e2e_s(last)))  # req/s two slots give at that run's e2e
    assert occupancy[rates[-1]] >= 0.8, occupancy  # the last rate kept both slots busy: on the plateau...
    assert rates[-1] >= 2 * cap_at_stop / 1.15  # ...past it (half that rate would still have grown)...
    assert len(rates) <= 6  # ...and stopped there
    ceiling = 2 / ((20 + (8 - 1) * 10) / 1000)  # the stand-in's own timing: no load makes e2e shorter
    assert 0.8 * cap_at_stop <= s["saturation"]["request_throughput"] <= ceiling
    assert "sweep: saturation reached" in proc.stderr
    assert s["max_rate_meeting_slo"] == max(p["offered_rate"] for p in s["points"] if p["good_fraction"] >= 0.9)
    page = tmp_path / "sweep.html"
    assert _cli("report", str(out), "--out", str(page)).returncode == 0
    text = page.read_text()
    assert "Open-loop rate sweep" in text and "goodput" in text and text.count("<svg") >= 2
    # "largest level": the highest offered rate, not the first run (open-loop runs tie on concurrency)
    assert f"Per-request timeline, rate {rates[-1]:g}/s, repeat 1" in text


@pytest.mark.parametrize("dist", ["uniform", "normal"])
def test_length_distributions_are_exact_per_request_and_really_vary(tmp_path, dist):
    out = tmp_path / "d.json"
    with run_standin(ttft_ms=2, token_interval_ms=1, log_dir=tmp_path, tokenize=True) as server:
        proc = _cli("bench", "--endpoint", server.base_url, "--model", "standin", "--concurrency", "4",
                    "--num-prompts", "24", "--input-len", "40", "--output-len", "12", "--input-dist", dist,
                    "--output-dist", dist, "--len-spread", "0.5" if dist == "uniform" else "0.3", "--workers", "1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    reqs = data["runs"][0]["requests"]
    asked_in = [r["requested_prompt_tokens"] for r in reqs]
    assert [r["prompt_tokens"] for r in reqs] == asked_in  # every prompt exact at its own length
    outs = [r["completion_tokens"] for r in reqs]
    assert len(set(asked_in)) >= 6 and len(set(outs)) >= 4
    assert 16 <= min(asked_in) and max(asked_in) <= (60 if dist == "uniform" else 64)
    assert abs(sum(asked_in) / len(asked_in) - 40) < 8
    assert data["workload"]["input_dist"] == dist and data["runs"][0]["token_accounting"]["agree"]


def test_fixed_lengths_keep_the_fingerprint_older_files_have():
    from harness.serving.workload import Workload

    assert "input_dist" not in Workload(input_len=8, output_len=4, num_prompts=2).to_json()
    assert Workload(input_len=8, output_len=4, num_prompts=2, output_dist="uniform").to_json()["output_dist"] == "uniform"
    with pytest.raises(UsageError, match="--prefix-len"):
        Workload(input_len=10, output_len=4, num_prompts=50, prefix_len=9, input_dist="uniform", len_spread=0.5)
