"""`plan --engine vllm` against real start-ups of the CUDA vLLM 0.26.0 on the lent H200, four holds
(measurements/vllm_plan/h200-vllm-0.26.0.json, -hold2.json, -hold3.json and -hold4.json, written by
gpu_startups.py / gpu_serving.py there and gathered by gpu_collect.py): the plan is recomputed here from each
start's flags, the card's total memory as CUDA reported it and the model's config.json, and
compared with the KV cache tokens vLLM logged; the bench, gate and upgrade figures are recomputed
from their raw rows (the raw results files: -hold2-raw.tgz, -hold3-raw.tgz, -hold4-raw.tgz). The third hold's
start-ups s12-s16 are out of sample for the 0.26 allocator-slack and eager-profile terms, which were
read from holds 1-2: they are the held-out test of the plan, not fitted to. The fourth hold skipped the
start-ups (only the bench's s05 started, not among the checks here): its client's stand-in capacity ran
alone on the otherwise idle machine, then the bench (with the send delay split at the client's write),
a 20 A / 5 B gate and the serving suite with the 0.25.1 -> 0.26.0 upgrade rehearsal."""

from __future__ import annotations

import json
import re
import statistics
import tarfile
from pathlib import Path

import pytest

from harness.memory.vllm_logcheck import check_gpu_startup

MEASURED_DIR = Path(__file__).resolve().parents[1] / "measurements" / "vllm_plan"
DRIVERS = Path(__file__).resolve().parents[1] / "benchmarks" / "vllm_plan"
MEASURED = MEASURED_DIR / "h200-vllm-0.26.0.json"
DATA = json.loads(MEASURED.read_text())
HOLD2 = json.loads((MEASURED_DIR / "h200-vllm-0.26.0-hold2.json").read_text())
RAW2 = MEASURED_DIR / "h200-vllm-0.26.0-hold2-raw.tgz"
HOLD3 = json.loads((MEASURED_DIR / "h200-vllm-0.26.0-hold3.json").read_text())
RAW3 = MEASURED_DIR / "h200-vllm-0.26.0-hold3-raw.tgz"
HOLD4 = json.loads((MEASURED_DIR / "h200-vllm-0.26.0-hold4.json").read_text())
RAW4 = MEASURED_DIR / "h200-vllm-0.26.0-hold4-raw.tgz"
# A start cut by the hold's time limit before vLLM decided (outcome "timeout") has no truth to check.
STARTUPS = [r for r in DATA["startups"] + [{**r, "id": f"{r['id']}-hold2"} for r in HOLD2["startups"]]
            + [{**r, "id": f"{r['id']}-hold3"} for r in HOLD3["startups"]] if r["outcome"] != "timeout"]
# the settings no earlier hold had started (the plan's 0.26 terms were read from holds 1-2)
HELD_OUT = ("s12-hold3", "s13-hold3", "s14-hold3", "s15-hold3", "s16-hold3")
CHECKS = {rec["id"]: check_gpu_startup(rec) for rec in STARTUPS}
_LOGGED = re.compile(r"GPU KV cache size:\s*([\d,]+)\s*tokens")


def test_the_settings_span_what_the_issue_asks():
    """6 GiB card's share to 0.9, 2k to 32k tokens, eager and CUDA graphs, max-num-seqs, LoRA, bf16
    and the quantize chain's W4A16 (GPTQ)."""
    flags = [r["flags"] for r in STARTUPS]
    utils = [f.get("gpu_memory_utilization", 0.9) for f in flags]
    lens = [f["max_model_len"] for f in flags]
    assert len(STARTUPS) >= 6
    assert min(utils) <= 6.1 * 2**30 / STARTUPS[0]["cuda_total_bytes"] and max(utils) >= 0.9
    assert min(lens) <= 2048 and max(lens) >= 32768
    assert {bool(f.get("enforce_eager")) for f in flags} == {True, False}
    assert any("max_num_seqs" in f for f in flags) and any(f.get("enable_lora") for f in flags)
    quants = {(r["model_config"].get("quantization_config") or {}).get("quant_method", "none") for r in STARTUPS}
    assert {"none", "compressed-tensors"} <= quants


def test_the_logged_figures_are_what_the_log_lines_say():
    """The JSON's parsed figures come from its own key lines (no figure typed in by hand)."""
    for rec in STARTUPS:
        lines = " ".join(rec["key_lines"])
        m = _LOGGED.search(lines)
        logged = rec["logged"]["kv_cache_tokens"]
        assert (int(m.group(1).replace(",", "")) if m else None) == logged, rec["id"]
        assert (logged is not None) == (rec["outcome"] == "started"), rec["id"]


def test_starts_and_refusals_are_predicted():
    wrong = {i: (c.predicted_starts, c.logged_started) for i, c in CHECKS.items() if c.predicted_starts != c.logged_started}
    assert not wrong, wrong


def test_kv_cache_tokens_within_the_goal():
    """Issue 24's goal over every committed start-up: median <= 1%, worst <= 3%."""
    errors = {i: abs(c.error) * 100 for i, c in CHECKS.items() if c.logged_tokens}
    assert len(errors) >= 6
    assert statistics.median(errors.values()) <= 1.0, errors
    assert max(errors.values()) <= 3.0, errors


_USAGE = re.compile(r"Actual usage is ([\d.]+) GiB for weight, ([\d.]+) GiB for peak activation")


def test_model_loading_is_what_vllm_logged():
    """The weights term against "Model loading took" (2 decimals): the parameters plus the caching
    allocator's slack under the max_split_size_mb:20 vLLM 0.26 loads with (harness/memory/vllm_alloc.py):
    3.02 GiB bf16 and 1.12 GiB W4A16, 0.11 and 0.02 above the tensors."""
    for rec in STARTUPS:
        logged = rec["logged"]["model_loading_gib"]
        assert abs(CHECKS[rec["id"]].plan.weights_bytes / 2**30 - logged) < 0.0101, rec["id"]


def test_eager_profile_peak_is_what_vllm_logged():
    """The activation term against the logged peak of eager starts of holds 1-2, where it was read from (the
    compiled ones' profile also compiles): the MLP, the layer's input the model's loop holds, and cuBLAS's
    workspace (bf16). Hold 3's are the held-out check below."""
    seen = 0
    for rec in STARTUPS:
        m = _USAGE.search(" ".join(rec["key_lines"]))
        if m and rec["flags"].get("enforce_eager") and not rec["id"].endswith("-hold3"):
            seen += 1
            assert abs(CHECKS[rec["id"]].plan.activation_bytes / 2**30 - float(m.group(2))) < 0.0051, rec["id"]
    assert seen >= 3


@pytest.mark.skipif(not DATA.get("bench"), reason="the bench step did not run in the hold")
def test_bench_rows_have_both_clients_at_each_concurrency():
    rows = DATA["bench"]["rows"]
    assert [r["concurrency"] for r in rows][:2] == [1, 16]
    for r in rows:
        assert r["harness"].get("ttft_ms") and r["vllm"].get("median_ttft_ms"), r
        assert r["harness"]["output_throughput"] > 0 and r["vllm"]["output_throughput"] > 0


@pytest.mark.skipif(not DATA.get("gate"), reason="the gate step did not run in the hold")
def test_gate_counts_are_the_pairs_verdicts():
    gate = DATA["gate"]
    for row in gate["table"]:
        verdicts = [p for p in gate["pairs"] if p["pair"] == row["comparison"] and p["policy"] == row["policy"]]
        assert len(verdicts) == row["pairs"]
        assert row["regressed"] == sum(p["verdict"].startswith("REGRESSED") for p in verdicts)


@pytest.mark.parametrize("version, arch, config_extra, v2", [
    ("0.21.0", "Qwen3ForCausalLM", {}, False),
    ("0.22.0", "Qwen3ForCausalLM", {}, True),
    ("0.22.0", "LlamaForCausalLM", {}, False),
    ("0.23.0", "LlamaForCausalLM", {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}, False),
    ("0.24.0", "Qwen2ForCausalLM", {}, False),
    ("0.25.1", "Qwen2ForCausalLM", {}, True),
    ("0.26.0", "MixtralForCausalLM", {"num_local_experts": 8}, False),
    ("0.26.0", "Qwen2MoeForCausalLM", {"num_experts": 60}, True),
])
def test_the_model_runner_is_the_one_vllm_picks(version, arch, config_extra, v2):
    """vLLM's VllmConfig.use_v2_model_runner per release (read from each release's config/vllm.py)."""
    from harness.memory.vllm_model import model_facts
    from harness.memory.vllm_plan import parse_version, uses_v2_runner

    config = {**STARTUPS[0]["model_config"], "architectures": [arch], **config_extra}
    assert uses_v2_runner(model_facts(config), parse_version(version)) is v2


def test_served_quantized_checkpoints_answer_with_exact_tokens():
    """The quantize chain's GPTQ (hold 2) and AWQ (hold 3) W4A16, served by the GPU vLLM (Machete, by its log),
    answered every probe request with exactly its prompt and output tokens (usage, the server's counters and
    the tokenizer agree)."""
    probes = {r["id"]: r["token_probe"] for r in STARTUPS if r.get("token_probe")}
    assert {"s11-hold2", "s12-hold3"} <= set(probes), sorted(probes)
    for sid, probe in probes.items():
        assert probe["exact"] and probe["requests_ok"] == probe["num_prompts"], (sid, probe)
        assert probe["token_accounting"]["agree"], (sid, probe["token_accounting"])


def _raw2(tmp_path: Path) -> Path:
    with tarfile.open(RAW2) as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / "vres"


def test_hold2_gate_table_is_what_compare_says_of_its_files(tmp_path):
    """The gate's verdicts recomputed from the committed results files with today's compare: the
    same table the hold wrote, A/A clean under the harness's policy, every A/B pair caught."""
    import sys

    sys.path.insert(0, str(DRIVERS))
    from gpu_serving import gate_table

    gate = _raw2(tmp_path) / "gate"
    a, b = sorted(gate.glob("A-*.json")), sorted(gate.glob("B-*.json"))
    table = gate_table(a, b, pairs=len(a) // 2)["table"]
    assert table == HOLD2["gate"]["table"]
    counts = {(r["comparison"], r["policy"]): (r["regressed"], r["pairs"]) for r in table}
    assert counts[("A/A", "harness")][0] == 0 and counts[("A/A", "harness")][1] >= 4
    assert counts[("A/B", "harness")][0] == counts[("A/B", "harness")][1] >= 4
    assert counts[("A/B", "vllm-ci")][0] == counts[("A/B", "vllm-ci")][1]


def test_hold2_bench_rows_beside_vllm_bench_and_the_server():
    """Both clients at 1-256; the harness's mean TTFT is never below what the server itself logged
    for the same requests (its run's server_metrics), nor client-bound before c=256."""
    rows = HOLD2["bench"]["rows"]
    assert [r["concurrency"] for r in rows] == [1, 16, 64, 128, 256]
    for r in rows:
        h, v = r["harness"], r["vllm"]
        assert h["exit_code"] == 0 and v.get("median_ttft_ms"), r
        assert h["ttft_ms"]["mean"] >= h["server_metrics"]["ttft_mean_ms"], r
        assert h["client_bound"] is (r["concurrency"] >= 256), (r["concurrency"], h["client_bound_reasons"])


def test_hold2_upgrade_rehearsal_verdict():
    """0.25.1 -> 0.26.0 on the GPU: the comparison was allowed only the version to differ and found
    no regression and no behaviour change but the start-up time."""
    up = HOLD2["upgrade"]
    assert (up["old"], up["new"]) == ("0.25.1", "0.26.0")
    assert up["allowed_differences"] == {"server_version": ["0.25.1", "0.26.0"]}
    assert up["regressed"] is False
    assert {c["metric"] for c in up["changes"]} >= {"ttft_p50", "output_throughput", "server_ttft_mean"}
    assert all(b.startswith("startup") for b in up["behaviours"]), up["behaviours"]


def _raw3(tmp_path: Path) -> Path:
    """machine1/: start-ups s14, s13, s12 (and the bench's s05), the bench, the client's capacity run;
    machine2/: the gate, start-ups s15, s16 (the first machine was given back while its gate ran)."""
    with tarfile.open(RAW3) as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path


def test_hold3_held_out_startups_within_the_goal():
    """s12-s16 (AWQ W4A16, the 0.5B model, 16k and 2k batched tokens, CUDA graphs at the 6 GiB share): every
    start predicted and each within the 3% worst-case goal. s16 is the largest: +2.91%, the compiled
    profile's peak of a cold torch.compile cache (0.57 GiB logged where s05 started from a warm cache
    logged 0.51, the modelled 0.51)."""
    errors = {i: 100 * CHECKS[i].error for i in HELD_OUT}
    assert all(CHECKS[i].predicted_starts and CHECKS[i].logged_started for i in HELD_OUT)
    assert all(abs(e) <= 3.0 for e in errors.values()), errors
    assert statistics.median(abs(e) for e in errors.values()) <= 1.0, errors
    assert HOLD3["sources"]["startups"] == {"s14": "machine1", "s13": "machine1", "s12": "machine1",
                                            "s05": "machine1", "s15": "machine2", "s16": "machine2"}


def test_hold3_eager_profile_peak_out_of_sample():
    """The held-out eager starts' logged peak activation (2 decimals) against the plan's term: s12 (AWQ) and
    s15 (2k batched tokens) inside the log's rounding, s14 (the 0.5B model) 0.3 MiB under it (0.3347 GiB
    for a logged 0.34); none off by more than 0.01 GiB."""
    seen = {}
    for i in HELD_OUT:
        rec = next(r for r in STARTUPS if r["id"] == i)
        m = _USAGE.search(" ".join(rec["key_lines"]))
        if m:  # s13 and s16 were stopped at the KV cache line, before vLLM printed it
            seen[i] = CHECKS[i].plan.activation_bytes / 2**30 - float(m.group(2))
    assert set(seen) == {"s12-hold3", "s14-hold3", "s15-hold3"}
    assert all(abs(d) < 0.01 for d in seen.values()), seen


def test_kv_cache_goal_over_all_three_holds():
    errors = {i: abs(c.error) * 100 for i, c in CHECKS.items() if c.logged_tokens}
    assert len(errors) == 16 and sum(i.endswith("-hold3") for i in errors) == 6
    assert statistics.median(errors.values()) <= 1.0 and max(errors.values()) <= 3.0, errors
    assert all(c.predicted_starts == c.logged_started for c in CHECKS.values())


def _gate_from_files(gate: Path, sizes: tuple[int, int], hold: dict) -> tuple[list[Path], dict, dict]:
    """A hold's gate verdicts recomputed from its raw A-*/B-* results files with today's compare
    (gpu_serving.gate_table, 10 pairs asked): as many files as `sizes` says, the same table and pair
    verdicts as the hold's JSON; (A files, result, {(comparison, policy): (regressed, pairs)})."""
    import sys

    sys.path.insert(0, str(DRIVERS))
    from gpu_serving import gate_table

    a, b = sorted(gate.glob("A-*.json")), sorted(gate.glob("B-*.json"))
    assert (len(a), len(b)) == sizes
    result = gate_table(a, b, pairs=10)
    assert result["table"] == hold["gate"]["table"] and result["pairs"] == hold["gate"]["pairs"]
    return a, result, {(r["comparison"], r["policy"]): (r["regressed"], r["pairs"]) for r in result["table"]}


def test_hold3_gate_counts_from_its_files(tmp_path):
    """The gate's verdicts recomputed from the raw results files with today's compare: 17 A and 5 B
    benches (bench 23 did not fit the 300 s), so 8 A/A pairs, not 10; the harness's policy calls no A/A
    regression and every A/B one; vllm-ci 3 of 8 A/A."""
    _, _, counts = _gate_from_files(_raw3(tmp_path) / "machine2" / "gate", (17, 5), HOLD3)
    assert counts == {("A/A", "harness"): (0, 8), ("A/A", "vllm-ci"): (3, 8),
                      ("A/B", "harness"): (5, 5), ("A/B", "vllm-ci"): (5, 5)}


def _pct(xs, q):
    from harness.serving.stats import percentile

    return percentile(list(xs), q)


def _lag_ms(run: dict) -> list[float]:
    """The client's schedule lag of each request of one run, from its stamps: sent - scheduled."""
    return [1000 * (q["sent_s"] - q["scheduled_s"]) for q in run["requests"]]


def _bench_level(runs: Path, row: dict) -> dict:
    """One level of a hold's bench recomputed from its raw results files (the harness's run is
    returned): the harness's TTFT p50/p99, output tok/s and schedule lag from its per-request records;
    vllm bench serve's from its per-request ttfts; every request of both matched to the server's
    stamps, the server's stamp inside the client's, neither client-bound, the harness's excess p50 below
    vllm bench's, vLLM's histogram p50 inside its bucket."""
    c, h, v = row["concurrency"], row["harness"], row["vllm"]
    run = json.loads((runs / f"harness-c{c}.json").read_text())["runs"][0]
    ok = [q for q in run["requests"] if q["error"] is None]
    assert len(ok) == row["num_prompts"] == h["server_http_ttft"]["matched"], c
    ttft = [q["ttft_ms"] for q in ok]
    assert abs(_pct(ttft, 50) - h["ttft_ms"]["p50"]) < 1e-6 and abs(_pct(ttft, 99) - h["ttft_ms"]["p99"]) < 1e-6
    lag = _lag_ms(run)
    assert abs(_pct(lag, 50) - h["schedule_lag_ms"]["p50"]) < 1e-3 and abs(_pct(lag, 99) - h["schedule_lag_ms"]["p99"]) < 1e-3
    assert abs(sum(q["completion_tokens"] for q in ok) / run["duration_s"] - h["output_throughput"]) < 1e-6
    assert run["server_http_ttft"]["client_excess_ms"]["min"] > 0, c  # the server's stamp is inside the client's
    assert h["client_bound"] is False and h["workers"] == row["harness_workers"], c
    vb = json.loads((runs / f"vllm-bench-c{c}.json").read_text())
    vt = [1000 * t for t, err in zip(vb["ttfts"], vb["errors"]) if not err]
    assert len(vt) == row["num_prompts"] == v["server_http_ttft"]["matched"], c
    assert abs(_pct(vt, 50) - v["median_ttft_ms"]) < 1e-6 and abs(_pct(vt, 99) - v["p99_ttft_ms"]) < 1e-6
    assert abs(vb["total_output_tokens"] / vb["duration"] - v["output_throughput"]) < 1e-6
    assert (h["server_http_ttft"]["client_excess_ms"]["p50"] < v["server_http_ttft"]["client_excess_ms"]["p50"]), c
    for run_ in (h, v):  # vLLM's histogram: the interpolated p50 inside its bucket, a mean per run
        lo, hi = run_["server_ttft_p50"]["bucket_ms"]
        assert lo <= run_["server_ttft_p50"]["ms"] <= hi and run_["server_ttft_mean_ms"] > 0, c
    return run


def test_hold3_bench_table_from_the_raw_files(tmp_path):
    """Each level of the bench recomputed from the raw results files: the harness's TTFT p50/p99, output
    tok/s and schedule lag from its per-request records; vllm bench serve's from its per-request ttfts;
    the server's HTTP-layer TTFT p50 and each client's excess over it as the harness's results file
    recorded them. Neither client was client-bound, every request of both was matched to the server's
    stamps, and the harness's excess p50 is below vllm bench's at every level."""
    runs = _raw3(tmp_path) / "machine1" / "runs"
    rows = HOLD3["bench"]["rows"]
    assert [r["concurrency"] for r in rows] == [1, 16, 64, 128, 256]
    for row in rows:
        run = _bench_level(runs, row)
        assert run["server_http_ttft"]["ttft_ms"] == row["harness"]["server_http_ttft"]["ttft_ms"]


def test_hold3_awq_served_with_exact_tokens(tmp_path):
    """s12: the quantize chain's AWQ W4A16, served by the GPU vLLM (Machete, by its log), answered 16 of 16
    requests with exactly their 256 prompt and 64 output tokens."""
    rec = next(r for r in HOLD3["startups"] if r["id"] == "s12")
    probe = rec["token_probe"]
    assert rec["model"] == "qwen2.5-1.5b-awq" and rec["outcome"] == "started"
    assert (probe["requests_ok"], probe["input_tokens"], probe["output_tokens"]) == (16, 16 * 256, 16 * 64)
    assert probe["exact"] and probe["token_accounting"]["agree"]
    log = (_raw3(tmp_path) / "machine1" / "startup-logs" / "s12.log").read_text()
    assert "Using MacheteLinearKernel for CompressedTensorsWNA16" in log


def _raw4(tmp_path: Path) -> Path:
    """machine1/ (one machine): the client's capacity run (alone), the bench's result files, the gate, the suite."""
    with tarfile.open(RAW4) as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / "machine1"


def test_hold4_gate_counts_from_its_files(tmp_path):
    """The gate's verdicts recomputed from the raw results files with today's compare: 20 A and 5 B benches,
    10 A/A pairs; the harness's policy calls every A/B pair and 1 of 10 A/A, vllm-ci 5 of 10 A/A.

    The one harness A/A red is pair A-16 vs A-17, and it is the eager A server's own throughput regime, not
    the client: A-16's three runs made 2,018, 1,982 and 1,968 output tok/s, A-17's 1,190, 1,293 and 1,219
    (each recomputed from its requests: completion tokens / duration), every candidate run below every
    baseline one; the client's schedule lag p99 (per request sent_s - scheduled_s) stayed under 1 ms in all
    six runs (at most 0.78 ms) and neither file was client-bound. The same server swings between the two
    regimes inside single files of the other pairs: A-00, A-02, A-10 and A-14 each hold a run >= 1,900 tok/s
    and one <= 1,300 tok/s."""
    a, result, counts = _gate_from_files(_raw4(tmp_path) / "gate", (20, 5), HOLD4)
    assert counts == {("A/A", "harness"): (1, 10), ("A/A", "vllm-ci"): (5, 10),
                      ("A/B", "harness"): (5, 5), ("A/B", "vllm-ci"): (5, 5)}
    red = [(p["baseline"], p["candidate"]) for p in result["pairs"]
           if p["pair"] == "A/A" and p["policy"] == "harness" and p["verdict"].startswith("REGRESSED")]
    assert red == [("A-16.json", "A-17.json")]

    runs = {f.name: json.loads(f.read_text())["runs"] for f in a}
    tok_s = {}
    for name in ("A-16.json", "A-17.json"):
        for run in runs[name]:
            ok = [q for q in run["requests"] if q["error"] is None]
            assert abs(sum(q["completion_tokens"] for q in ok) / run["duration_s"] - run["output_throughput"]) < 1e-6
            lag = _pct(_lag_ms(run), 99)
            assert abs(lag - run["schedule_lag_ms"]["p99"]) < 1e-3 and lag < 1.0, (name, lag)
            assert run["client_bound"] is False and not run["client_bound_reasons"], name
        tok_s[name] = [round(r["output_throughput"]) for r in runs[name]]
    assert tok_s == {"A-16.json": [2018, 1982, 1968], "A-17.json": [1190, 1293, 1219]}
    assert max(tok_s["A-17.json"]) < min(tok_s["A-16.json"])
    both = {n for n, rs in runs.items() if n not in tok_s
            and max(r["output_throughput"] for r in rs) >= 1900 and min(r["output_throughput"] for r in rs) <= 1300}
    assert both == {"A-00.json", "A-02.json", "A-10.json", "A-14.json"}


def test_hold4_bench_table_from_the_raw_files(tmp_path):
    """Each level of the bench recomputed from the raw results files, as for hold 3 (the harness's TTFT
    p50/p99, output tok/s and schedule lag from its per-request records, vllm bench serve's from its ttfts,
    every request of both matched to the server's stamps, neither client-bound, the harness's excess p50
    below vllm bench's at every level: 0.67/1.48, 2.82/6.48, 8.06/14.02, 14.27/31.14, 41.53/78.12 ms), and
    the send delay's split at the client's write stamp: the client's own write (written_s - sent_s, the
    tarball keeps written_s to the microsecond) p50 0.31, 0.21, 0.13, 0.11, 0.17 ms at c=1..256, never over
    0.5 ms, while the server's read up to its ASGI app grows with concurrency: p50 0.17, 2.54, 7.91, 14.01,
    41.38 ms (over 200 x the client's write at c=256). The send delay's mean is the two parts' means."""
    runs = _raw4(tmp_path) / "runs"
    rows = HOLD4["bench"]["rows"]
    assert [r["concurrency"] for r in rows] == [1, 16, 64, 128, 256]
    read_p50 = []
    for row in rows:
        c, h = row["concurrency"], row["harness"]
        run = _bench_level(runs, row)
        ok = [q for q in run["requests"] if q["error"] is None]
        assert run["server_http_ttft"] == h["server_http_ttft"]
        # the send split: client write recomputed from the stamps (each rounded to 1 us, so within 2 us)
        split = h["server_http_ttft"]
        write, read = split["client_write_ms"], split["server_read_ms"]
        mine = [1000 * (q["written_s"] - q["sent_s"]) for q in ok]
        assert write["count"] == read["count"] == len(mine) == split["matched"], c
        for q in (50, 99):
            assert abs(_pct(mine, q) - write[f"p{q}"]) < 2e-3, (c, q, _pct(mine, q), write)
        assert abs(min(mine) - write["min"]) < 2e-3, c
        assert abs(split["send_delay_ms"]["mean"] - (write["mean"] + read["mean"])) < 1e-6, c
        assert write["p50"] <= 0.5, (c, write["p50"])
        read_p50.append(read["p50"])
    assert [round(x, 2) for x in read_p50] == [0.17, 2.54, 7.91, 14.01, 41.38]
    assert read_p50 == sorted(read_p50) and read_p50[-1] > 10 * rows[-1]["harness"]["server_http_ttft"]["client_write_ms"]["p50"]


def test_hold4_suite_and_upgrade_rehearsal(tmp_path):
    """The serving suite, recomputed from its raw suite.txt: 30 passed, 5 skipped (the gate's no --baseline,
    the real-model tests without their wheel), none failed; every test of test_1_vllm_behaviour.py passed
    under both versions ([old] 0.25.1 and [new] 0.26.0), and test_3_upgrade's rehearsal passed. Its
    comparison (the suite's upgrade.compare.json, kept in the JSON): only the version allowed to differ, no
    regression; output and request throughput at c=4 -10.6% with an interval of -30%..+14%, so inconclusive,
    the rest unchanged; the only behaviour change is the start-up time (65.6 -> 69.6 s)."""
    import sys

    sys.path.insert(0, str(DRIVERS))
    from gpu_collect import suite_summary

    suite = suite_summary(_raw4(tmp_path))
    assert suite == HOLD4["suite"]
    assert suite["counts"] == {"passed": 30, "skipped": 5} and suite["counts"].get("failed", 0) == 0
    outcome = {t["test"]: t["outcome"] for t in suite["tests"]}
    behaviour = {t.split("::")[1] for t in outcome if t.startswith("suites/serving/test_1_vllm_behaviour.py::")}
    names = {re.sub(r"\[(old|new)\]$", "", t) for t in behaviour}
    assert len(names) == 7 and behaviour == {f"{n}[{v}]" for n in names for v in ("old", "new")}
    assert all(o == "PASSED" for t, o in outcome.items() if "test_1_vllm_behaviour.py" in t)
    assert outcome["suites/serving/test_3_upgrade.py::test_upgrade_rehearsal_report"] == "PASSED"

    up = HOLD4["upgrade"]
    assert (up["old"], up["new"]) == ("0.25.1", "0.26.0")
    assert up["allowed_differences"] == {"server_version": ["0.25.1", "0.26.0"]}
    assert up["regressed"] is False and not any(c["verdict"] == "regressed" for c in up["changes"])
    assert {c["metric"] for c in up["changes"]} >= {"ttft_p50", "output_throughput", "server_ttft_mean"}
    unsure = {c["metric"]: (round(c["change"], 3), c["ci_low"] < -c["threshold"] < c["ci_high"])
              for c in up["changes"] if c["verdict"] != "unchanged"}
    assert unsure == {"output_throughput": (-0.106, True), "request_throughput": (-0.106, True)}
    assert all(c["verdict"] == "inconclusive" for c in up["changes"] if c["metric"] in unsure)
    assert up["behaviours"] == ["startup startup_s: 65.6 -> 69.6"]


def test_hold4_client_capacity_from_its_rows(tmp_path):
    """The client's stand-in capacity run (alone on the idle 16-core machine; stand-in TTFT 10 ms, a token
    every 10 ms, 64 tokens a request): per worker count, the highest output tok/s with no failure and a
    schedule lag p99 <= 1 ms, recomputed from its rows: 1 worker 17,237 (c=256), 2: 27,188 (c=512),
    4: 38,242 (c=1024), 8: 47,874 (c=2048); 1, 2 and 4 workers went over the 1 ms bar at the next level up
    (8 never did: the levels ran out first)."""
    cap = json.loads((_raw4(tmp_path) / "capacity" / "client-capacity.json").read_text())
    by_w: dict[int, list[dict]] = {}
    for r in cap["rows"]:
        by_w.setdefault(r["workers"], []).append(r)
    best = {w: max((r for r in rs if r["lag_p99_ms"] <= 1.0 and not r["failed"]),
                   key=lambda r: r["output_tokens_per_s"]) for w, rs in by_w.items()}
    assert {str(w): b for w, b in best.items()} == cap["best"]
    assert {w: (round(b["output_tokens_per_s"]), b["concurrency"]) for w, b in best.items()} == {
        1: (17237, 256), 2: (27188, 512), 4: (38242, 1024), 8: (47874, 2048)}
    assert {str(w): b["output_tokens_per_s"] for w, b in best.items()} == cap["tokens_per_s"]
    reached = {w: any(r["lag_p99_ms"] > 1.0 for r in rs) for w, rs in by_w.items()}
    assert reached == {1: True, 2: True, 4: True, 8: False}
    assert {str(w): v for w, v in reached.items()} == cap["limit_reached"]
