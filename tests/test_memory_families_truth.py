"""Reading a families run back (harness.memory.measured.families_truth) on row files laid out as
benchmarks/vram/families.py writes them, with measurements set from the estimator so the errors
the reader must find are known: signs kept (under-prediction), checkpointing apart, a killed
inference worker's partial rows, failed cases counted, boundary verdicts, snapshot pictures."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from harness.memory.measured import families_truth as T
from harness.memory.fit.estimate import Query, estimate
from harness.memory.fit.shape import model_shape
from harness.memory.measured.train_matrix import TrainCase, predicted_bytes

GIB = 2**30


def write(directory, name, data):
    (directory / name).parent.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(json.dumps(data))


def train_row(case: TrainCase, error: float, oom: bool = False, context: int = 600 * 2**20) -> dict:
    row = dict(asdict(case), mode="train", lora_targets=["all-linear"] if case.targets == "all" else
               ["q_proj", "k_proj", "v_proj", "o_proj"], context_bytes=context, oom=oom)
    row["peak_bytes"] = None if oom else round(predicted_bytes(case) / (1 + error))
    return row


def infer_row(arch, precision, mode, seq, batch, error, new_tokens=None):
    q = Query(precision, mode, seq_len=seq, batch=batch, new_tokens=new_tokens or 0)
    pred = estimate(model_shape(arch), q).peak_bytes
    return {"arch": arch, "precision": precision, "mode": mode, "seq_len": seq, "batch": batch,
            "new_tokens": new_tokens, "peak_bytes": round(pred / (1 + error)), "start_bytes": 0}


@pytest.fixture
def run_dir(tmp_path):
    out = tmp_path / "families-out"  # unpacked as packed: DIR/<run>/rows/
    g = "gemma-2-2b"
    write(out, "rows/001-a.json", train_row(TrainCase(g, "nf4-dq", "all", 8, True, 1, 512, "adamw_torch"), 0.01))
    write(out, "rows/002-b.json", train_row(TrainCase(g, "nf4-dq", "attn", 64, True, 1, 1024, "adamw_torch"), 0.03))
    write(out, "rows/003-c.json", train_row(TrainCase(g, "nf4-dq", "all", 8, False, 1, 512, "adamw_torch"), -0.05))
    fits_case = TrainCase(g, "nf4-dq", "attn", 8, True, 1, 256, "adamw_torch", budget_bytes=6 * GIB, role="boundary")
    write(out, "rows/004-d.json", train_row(fits_case, 0.0, oom=True))  # the planner says fits; it ran out
    big = TrainCase(g, "nf4-dq", "all", 64, False, 2, 3072, "adamw_torch", budget_bytes=6 * GIB, role="boundary")
    write(out, "rows/005-e.json", train_row(big, 0.0, oom=True))
    write(out, "rows/006-f.json", {"kind": "infer", "arch": g, "precision": "bf16",
                                   "rows": [infer_row(g, "bf16", "prefill", 1024, 1, 0.002),
                                            infer_row(g, "bf16", "prefill", 4096, 2, -0.01)]})
    write(out, "rows/007-g.json", {"kind": "infer", "arch": "qwen3-1.7b", "error": "killed at the deadline"})
    write(out, "rows/007-g.d/rows-qwen3-1.7b.json", {"rows": [infer_row("qwen3-1.7b", "nf4-dq", "generate", 1024, 1, 0.02, 64)]})
    write(out, "rows/008-h.json", {"kind": "train", "arch": g, "error": "exit 1 without a row"})
    gen = infer_row(g, "nf4-dq", "generate", 1024, 1, 0.0, 32)
    gen["snapshot"] = {"peak_bytes": gen["peak_bytes"], "peak_by_category": {
        "weights": 2 * GIB, "kv_cache": 100 * 2**20, "activations": gen["peak_bytes"] - 2 * GIB - 100 * 2**20 - 2**20,
        "logits_loss": 2**20}, "timeline": []}
    write(out, "rows/009-snapshot-generate.json", gen)
    return tmp_path


def test_errors_per_family_keep_their_sign_and_checkpointing_apart(run_dir):
    s = T.evaluate_families(run_dir)
    gc, nogc = s.train_gc["gemma-2-2b"], s.train_nogc["gemma-2-2b"]
    assert gc.n == 2 and gc.median == pytest.approx(0.02, abs=1e-6) and gc.worst == pytest.approx(0.03, abs=1e-6)
    assert gc.worst_under == 0.0
    assert nogc.n == 1 and nogc.worst_under == pytest.approx(-0.05, abs=1e-6)
    inf = s.inference["gemma-2-2b"]
    assert inf.n == 3 and inf.worst_under == pytest.approx(-0.01, abs=1e-6)  # snapshot generate row counts too
    assert s.inference["qwen3-1.7b"].n == 1  # the killed worker's rows, as it had written them
    assert s.failed == 2  # the killed inference job and the training case without a row


def test_boundary_verdicts_against_real_oom(run_dir):
    s = T.evaluate_families(run_dir)
    assert len(s.boundary) == 2
    small = next(r for r in s.boundary if r["seq_len"] == 256)
    assert small["planner_fits"] is True and small["actually_fits"] is False
    assert s.false_fits == [small] and s.agreement == 0.5


def test_snapshot_picture_groups_predicted_and_measured_alike(run_dir):
    (p,) = T.evaluate_families(run_dir).pictures
    comp = {c["component"]: c for c in p["components"]}
    assert set(comp) == set(T.GEN_GROUPS)
    assert comp["weights"]["measured"] == 2 * GIB and comp["KV cache"]["measured"] == 100 * 2**20
    assert sum(c["measured"] for c in p["components"]) == p["snapshot_peak"]
    assert sum(c["predicted"] for c in p["components"]) == p["predicted_peak"]
    lines = "\n".join(T.summary_lines(T.evaluate_families(run_dir)))
    assert "1 predicted fits that ran out" in lines and "picture gemma-2-2b nf4-dq generate" in lines


def test_no_rows_no_files(tmp_path):
    assert T.row_files(tmp_path) == []
    assert T.evaluate_families(tmp_path).boundary == []


def test_offload_run_against_the_plan_recomputed(tmp_path):
    """An offloaded run's row (harness.memory.measured.moe_case) against plan --offload recomputed with the
    run's own bandwidths and context: GPU peak and ms/token errors with their signs, the budget."""
    from harness.memory.fit.offload import Bandwidths, plan_offload

    arch, budget, context = "qwen2.5-1.5b", 2 * GIB, 500 * 2**20
    bw = {"h2d_gbps": 20.0, "device_gbps": 4000.0, "layer_ms": 1.8}
    plan = plan_offload(arch, budget, "bf16", context_bytes=context, seq_len=38, new_tokens=6,
                        cpu_memory_bytes=T.OFFLOAD_CPU_BYTES, bandwidths=Bandwidths(**bw))
    assert plan.offloaded
    layer = 100 * 2**20
    gpu = plan.bytes_on_gpu + plan.runtime_bytes + layer
    row = {"kind": "offload", "arch": arch, "precision": "bf16", "budget_bytes": budget, "prompt_len": 32,
           "new_tokens": 6, "oom": False, "bandwidths": bw, "context_bytes": context, "largest_layer_bytes": layer,
           "plan": {"layers_on": plan.layers_on}, "decode_peak_bytes": round(gpu / 0.98),
           "decode_ms_per_token": plan.predicted_decode_ms / 1.2}
    write(tmp_path, "rows/001-offload.json", row)
    write(tmp_path, "rows/002-offload-failed.json", {"kind": "offload", "arch": arch, "error": "killed at the deadline"})
    s = T.evaluate_families(tmp_path)
    (o,) = s.offload
    assert o["gpu_error"] == pytest.approx(-0.02, abs=1e-6) and o["ms_error"] == pytest.approx(0.2, abs=1e-6)
    assert o["within_budget"] is (row["decode_peak_bytes"] + context <= budget) and not o["oom"]
    assert s.failed == 1
    assert any(line.startswith(f"plan --offload {arch}") for line in T.summary_lines(s))
