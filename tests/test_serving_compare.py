"""The regression gate's noise model, fingerprints and thresholds, on synthetic results whose truth
is known; the stats it rests on; the CLI's exit codes."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import UsageError
from harness.serving import compare as cmp
from harness.serving.results import write_atomic
from harness.serving.stats import percentile, summary

ROOT = Path(__file__).resolve().parents[1]


def make_results(*, ttft_ms=50.0, tput=1000.0, runs=3, requests=40, noise=0.15, seed=0, flags=(),
                 version="1.0", run_drift=0.03, failed=0) -> dict:
    rng = random.Random(seed)
    out_runs = []
    for rep in range(runs):
        drift = 1 + rng.uniform(-run_drift, run_drift)
        reqs = []
        for i in range(requests):
            ttft = ttft_ms * drift * (1 + rng.gauss(0, noise))
            e2e = ttft + 15 * 10 * drift * (1 + rng.gauss(0, noise / 3))
            reqs.append({"index": i, "ttft_ms": ttft, "e2e_ms": e2e, "completion_tokens": 16, "chunk_s": [],
                         "error": None})
        for i in range(failed):
            reqs.append({"index": requests + i, "ttft_ms": None, "e2e_ms": 1.0, "completion_tokens": None,
                         "chunk_s": [], "error": "http_500"})
        ttfts = [r["ttft_ms"] / 1000 for r in reqs if r["ttft_ms"]]
        out_runs.append({
            "concurrency": 4, "request_rate": None, "repeat": rep, "requests_ok": requests,
            "requests_failed": failed, "errors": {"http_500": failed} if failed else {},
            "output_throughput": tput * drift, "request_throughput": tput * drift / 16,
            "ttft_ms": summary(ttfts), "tpot_ms": summary([0.01]), "e2e_ms": summary([0.2]),
            "itl_ms": summary([0.01]), "token_accounting": {"findings": [], "agree": True}, "requests": reqs,
        })
    return {"schema_version": 1, "environment": {"model_id": "tiny", "flags": list(flags), "server_version": version,
                                                 "machine": {"cpu_model": "x", "cpu_count": 2}},
            "workload": {"input_len": 64, "output_len": 16, "api": "completions", "num_prompts": requests},
            "runs": out_runs}


def test_percentile_matches_numpy_linear():
    np = pytest.importorskip("numpy")
    rng = random.Random(1)
    xs = [rng.expovariate(1.0) for _ in range(101)]
    for q in (0, 1, 50, 90, 95, 99, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_same_distribution_is_not_a_regression():
    result = cmp.compare(make_results(seed=1), make_results(seed=2))
    assert not result.regressed
    assert not {c.verdict for c in result.changes} & {"regressed", "improved", "inconclusive"}
    for c in result.changes:  # the interval covers the point estimate
        assert c.ci_low <= c.change <= c.ci_high


def test_a_real_slowdown_is_caught_and_named():
    base = make_results(seed=1)
    slow = make_results(seed=2, ttft_ms=80.0, tput=600.0)
    result = cmp.compare(base, slow)
    verdicts = {c.metric: c.verdict for c in result.changes}
    assert result.regressed
    assert verdicts["ttft_p50"] == "regressed" and verdicts["output_throughput"] == "regressed"
    table = cmp.format_table(result)
    assert "REGRESSED" in table and "ttft_p50" in table
    better = cmp.compare(slow, base)
    assert not better.regressed and {c.metric: c.verdict for c in better.changes}["ttft_p50"] == "improved"


def test_a_change_inside_the_threshold_passes_and_a_tighter_threshold_catches_it():
    base, cand = make_results(seed=1, noise=0.02, run_drift=0.0), make_results(seed=2, ttft_ms=56.0, noise=0.02, run_drift=0.0)
    # +12%: real (the interval excludes 0) but inside the default 20%
    assert {c.metric: c.verdict for c in cmp.compare(base, cand).changes}["ttft_p50"] == "worse, within threshold"
    tight = cmp.parse_thresholds("ttft_p50=5%")
    assert {c.metric: c.verdict for c in cmp.compare(base, cand, thresholds=tight).changes}["ttft_p50"] == "regressed"


def test_noise_widens_the_interval_so_noise_alone_never_fails():
    # Large per-run drift: a 25% shift in one noisy pair must not be called significant when
    # the runs themselves scatter that much.
    base = make_results(seed=3, run_drift=0.4, noise=0.5)
    cand = make_results(seed=4, run_drift=0.4, noise=0.5)
    c = {c.metric: c for c in cmp.compare(base, cand).changes}["ttft_p50"]
    assert c.ci_high - c.ci_low > 0.2


def test_new_failures_are_a_behaviour_regression():
    result = cmp.compare(make_results(seed=1), make_results(seed=1, failed=2))
    assert result.regressed and any("http_500" in b for b in result.behaviours)


def test_fingerprint_mismatch_and_too_few_runs_are_refused():
    with pytest.raises(cmp.RefusedComparison, match=r"flags.*--allow-diff flags"):
        cmp.compare(make_results(), make_results(flags=["--max-num-seqs", "1"]))
    assert cmp.compare(make_results(), make_results(flags=["--x"]), allow=("flags",)).allowed_differences
    with pytest.raises(cmp.RefusedComparison, match="at least 3"):
        cmp.compare(make_results(runs=2), make_results())


@pytest.mark.parametrize("text", ["ttft_p50", "bogus=5%", "ttft_p50=fast", "ttft_p50=-1%"])
def test_bad_thresholds_are_usage_errors(text):
    with pytest.raises(UsageError):
        cmp.parse_thresholds(text)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_compare_cli_exit_codes(tmp_path):
    base, same, slow, other = (tmp_path / f"{n}.json" for n in ("base", "same", "slow", "other"))
    write_atomic(base, make_results(seed=1))
    write_atomic(same, make_results(seed=2))
    write_atomic(slow, make_results(seed=2, tput=500.0))
    write_atomic(other, make_results(seed=2, version="2.0"))
    assert _cli("compare", str(base), str(same)).returncode == 0
    proc = _cli("compare", str(base), str(slow), "--threshold", "output_throughput=5%")
    assert proc.returncode == 1 and "output_throughput" in proc.stderr and "REGRESSED" in proc.stdout
    refused = _cli("compare", str(base), str(other))
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1 and "server_version" in refused.stderr
    assert _cli("compare", str(base), str(other), "--allow-diff", "server_version").returncode == 0
    for bad in (["compare", str(base), str(tmp_path / "missing.json")],
                ["compare", str(base), str(base), "--threshold", "nope=1%"],
                ["compare", str(base), str(base), "--allow-diff", "colour"]):
        proc = _cli(*bad)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    (tmp_path / "junk.json").write_text("{not json")
    proc = _cli("compare", str(tmp_path / "junk.json"), str(base))
    assert proc.returncode == 2 and "not JSON" in proc.stderr


def test_report_is_self_contained(tmp_path):
    base, slow = tmp_path / "base.json", tmp_path / "slow.json"
    write_atomic(base, make_results(seed=1))
    write_atomic(slow, make_results(seed=2, tput=500.0))
    out = tmp_path / "r.html"
    proc = _cli("report", str(base), str(slow), "--compare", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    page = out.read_text()
    assert page.count("<svg") >= 3 and "REGRESSED" in page
    assert "src=\"http" not in page and "href=\"http" not in page and "<script src" not in page
    bad = _cli("report", str(tmp_path / "nope.json"), "--out", str(out))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
