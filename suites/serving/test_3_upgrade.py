"""Upgrade rehearsal: the gate workload on the old and the new vLLM (each in its own venv, run by
the behaviour suite), one comparison report saying what changed: figures, behaviours, metric names,
and memory: each start-up's logged KV figures beside the plan's, its KV capacity gated
(harness/serving/upgrade_kv.py)."""

from __future__ import annotations


import pytest

from harness.atomic import write_text
from harness.report.bench_html import render
from harness.serving import compare as cmp
from harness.serving import results
from harness.serving import upgrade_kv

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.alone, pytest.mark.server_kinds("old", "new")]  # measures time or contention: scripts/test runs it after the rest, alone


def test_upgrade_rehearsal_report(gate_results, server_pool, gate_bench, serving_dir, serving_model_dir, record):
    for kind in ("old", "new"):
        if kind not in gate_results:  # run alone: measure here
            out = serving_dir / f"gate-{kind}.json"
            gate_bench(server_pool.use(kind), out)
            gate_results[kind] = out
    old, new = results.load(gate_results["old"]), results.load(gate_results["new"])
    v_old, v_new = old["environment"]["server_version"], new["environment"]["server_version"]
    assert v_old != v_new, "the rehearsal needs two different vLLM versions"
    # Anything but the version differing would make this a different experiment: refuse it.
    with pytest.raises(cmp.RefusedComparison, match="server_version"):
        cmp.compare(old, new)
    result = cmp.compare(old, new, allow=("server_version",))
    table = cmp.format_table(result)
    kv = upgrade_kv.rehearsal_kv(serving_model_dir, old["environment"], new["environment"], gpu=server_pool.gpu)
    verdict = upgrade_kv.rehearsal_verdict(result.verdict, cmp.verdict_line(result), kv)
    out_json = serving_dir / "upgrade.compare.json"
    results.write_atomic(out_json, result.to_json() | {"old": v_old, "new": v_new, "kv": kv.to_json(),
                                                       "verdict_line": verdict})
    page = render([str(gate_results["old"]), str(gate_results["new"])], [old, new],
                  comparison=f"vLLM {v_old} (baseline) -> {v_new} (candidate)\n" + table
                  + "\n\nMemory: what each start-up logged beside the plan for that version\n" + kv.table()
                  + f"\n\n{verdict}", memory=kv)
    report = serving_dir / "upgrade.html"
    write_text(report, page)
    record(old=v_old, new=v_new, regressed=result.regressed, table=table, behaviours=result.behaviours,
           verdict=verdict, kv_decision=kv.decision)
    for c in result.changes:
        record.row("Upgrade rehearsal", {"metric": c.metric, v_old: c.baseline, v_new: c.candidate,
                                         "change %": None if c.change is None else round(100 * c.change, 1),
                                         "verdict": c.verdict, "decision": c.decision})
    for row in kv.rows():
        record.row("Upgrade rehearsal: memory (logged vs planned)", row)
    assert {c.metric for c in result.changes} >= {"ttft_p50", "output_throughput"}
    assert result.allowed_differences["server_version"] == (v_old, v_new)
    # Both versions must have passed every request: a behaviour change would show as REGRESSION.
    assert not [b for b in result.behaviours if b.startswith("REGRESSION")], result.behaviours
    assert "Comparison" in page and v_old in page and v_new in page
    # Both servers were started here, so both start-up logs must say their KV size: never UNDECIDED.
    assert kv.decision != upgrade_kv.gm.UNDECIDED, kv.line()
    for side in (kv.baseline, kv.candidate):
        if side.logged.device == "cpu":  # the CPU build's KV is VLLM_CPU_KVCACHE_SPACE: the plan is exact
            assert side.predicted and side.predicted.kv_cache_tokens == side.logged.kv_cache_tokens, side
            assert side.predicted.max_concurrency == side.logged.max_concurrency, side
    assert "Did the KV cache capacity drop?" in page and "kv_cache_tokens" in page
