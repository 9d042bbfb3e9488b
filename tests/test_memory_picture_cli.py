"""Issue 27 on the command line: `estimate` shows the logits/loss share and `--explain`'s picture,
`plan --train` says what stops it and what helps, `plan --config A --config B` answers two models
on one card; bad input is one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.__main__ import main
from harness.memory.fit.advice import CHUNK_TOKENS
from harness.memory.fit.estimate import Query, estimate
from harness.memory.fit.shape import model_shape

ROOT = Path(__file__).resolve().parent.parent
GIB = 2**30


def run_json(capsys, *args):
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_estimate_table_shows_the_logits_share(capsys):
    # the new user's case: qwen2.5-1.5b QLoRA at 1024 tokens, 2.49 GB of fp32 logits
    assert main(["estimate", "--config", "qwen2.5-1.5b", "--precision", "nf4-dq", "--mode", "train",
                 "--seq-len", "1024", "--lora-r", "8", "--lora-targets", "q_proj,k_proj,v_proj,o_proj"]) == 0
    out = capsys.readouterr().out
    header, row = out.splitlines()[:2]
    end = header.index("logits/loss") + len("logits/loss")  # right-aligned: the value ends under its title
    assert row.index("2.32 GiB") + len("2.32 GiB") == end
    other = header.index(" other") + len(" other")
    assert row[:other].endswith("33.25 MiB")  # LoRA weights, grads, optimizer: no longer mixed with the logits


def test_explain_parts_add_up_to_what_the_card_needs(capsys):
    out = run_json(capsys, "estimate", "--config", "gemma-2-2b", "--precision", "nf4-dq", "--mode", "train,generate",
                   "--seq-len", "1024", "--explain")
    for r in out:
        names = [p["component"] for p in r["picture"]]
        assert sum(p["bytes"] for p in r["picture"]) == r["card_bytes"]
        assert names[0] == "weights" and "CUDA context" in names and "allocator reserve" in names
        assert "picture_text" not in r
    train, gen = out
    assert {"quantization state", "LoRA weights", "optimizer states", "activations kept for backward",
            "logits/loss"} <= {p["component"] for p in train["picture"]}
    assert {"KV cache", "attention scores"} <= {p["component"] for p in gen["picture"]}
    assert train["verification"]["verified"] is False


def test_explain_text_draws_bars_and_names_unverified_families(capsys):
    assert main(["estimate", "--config", "gemma-2-2b", "--precision", "nf4-dq", "--mode", "train",
                 "--seq-len", "1024", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "note: unverified for gemma2 training" in out and "final-logit soft-capping" in out
    bars = [line for line in out.splitlines() if "|" in line]
    longest = max(bars, key=lambda line: line.count("#"))
    assert "logits/loss" in longest  # 256k vocabulary x soft-capping: the logits are the largest part
    assert "card needs" in out
    assert main(["estimate", "--config", "qwen2.5-0.5b", "--mode", "prefill"]) == 0
    assert "unverified" not in capsys.readouterr().out



def test_plan_says_unverified_as_estimate_does(capsys):
    """plan computes through the same estimator: an unchecked family is named there too (text and
    JSON), one model or two on a card; a verified one stays quiet."""
    assert main(["plan", "--config", "gemma-2-2b", "--budget", "6GiB", "--train", "--no-replay", "--precision", "nf4-dq"]) == 0
    out = capsys.readouterr().out
    assert "note: unverified for gemma2 training" in out and "computed through" in out
    assert run_json(capsys, "plan", "--config", "gemma-2-2b", "--budget", "6GiB",
                    "--precision", "nf4-dq")["verification"]["verified"] is False
    assert main(["plan", "--config", "gemma-2-2b", "--config", "qwen2.5-0.5b", "--budget", "6GiB"]) == 0
    out = capsys.readouterr().out
    assert "note: gemma-2-2b: unverified for gemma2" in out and "qwen2.5-0.5b: unverified" not in out
    two = run_json(capsys, "plan", "--config", "gemma-2-2b", "--config", "qwen2.5-0.5b", "--budget", "6GiB")
    assert [v["family"] for v in two["verification"]] == ["gemma2", "qwen2"]
    assert main(["plan", "--config", "qwen2.5-0.5b", "--budget", "6GiB", "--precision", "nf4-dq"]) == 0
    assert "unverified" not in capsys.readouterr().out

def test_plan_train_names_what_stops_it_and_the_change_that_helps_most(capsys):
    out = run_json(capsys, "plan", "--config", "qwen2.5-1.5b", "--budget", "6GiB", "--train", "--no-replay", "--precision", "nf4-dq",
                   "--lora-r", "8", "--lora-targets", "q_proj,k_proj,v_proj,o_proj")
    advice = out["plans"][0]["advice"]
    assert advice["seq_len"] == 2048 and advice["fits"] is False
    assert advice["stopped_by"][0]["component"] == "logits/loss"
    names = [c["change"] for c in advice["changes"]]
    assert advice["best"] == f"chunked loss ({CHUNK_TOKENS}-token chunks)"
    assert any(n.startswith("shorter context") for n in names) and advice["best"] in names
    # each figure is the estimator's: the shorter context is the longest that fits
    shape = model_shape("qwen2.5-1.5b")
    short = next(c for c in advice["changes"] if c["change"].startswith("shorter context"))
    seq = int(short["change"].split(": ")[1].split()[0])
    q = Query("nf4-dq", "train", seq_len=seq, lora_r=8, lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    assert estimate(shape, q).planned_bytes == short["planned_bytes"]
    assert seq == out["plans"][0]["max_seq_len"]  # the plan's own max context agrees
    assert sorted(c["planned_bytes"] for c in advice["changes"]) == [c["planned_bytes"] for c in advice["changes"]]


def test_plan_train_without_checkpointing_offers_it(capsys):
    out = run_json(capsys, "plan", "--config", "gemma-2-2b", "--budget", "8GiB", "--train", "--no-replay", "--precision", "nf4-dq",
                   "--batch-seq-len", "1024", "--no-grad-checkpointing")
    changes = {c["change"]: c for c in out["plans"][0]["advice"]["changes"]}
    assert changes["gradient checkpointing on"]["saves_bytes"] > 4 * GIB
    assert main(["plan", "--config", "qwen2.5-0.5b", "--budget", "24GiB", "--train", "--no-replay", "--precision", "nf4-dq"]) == 0
    assert "fits at every precision" in capsys.readouterr().out


def test_two_small_models_stay_resident(capsys):
    out = run_json(capsys, "plan", "--config", "qwen2.5-1.5b", "--config", "qwen2.5-0.5b", "--budget", "6GiB")
    assert out["mode"] == "two-models" and out["both_resident"] is True
    a, b = out["models"]
    assert a["precision"] == b["precision"] == "nf4-dq"
    assert out["need_bytes"] == int(a["weights_bytes"] + b["weights_bytes"] + (a["kv_bytes_per_token"]
                                    + b["kv_bytes_per_token"]) * 2048 + max(a["step_bytes"], b["step_bytes"]))
    assert out["max_context_tokens"] == out["context_limit"] == 32768  # qwen2.5-0.5b's own limit
    assert out["max_turns"] == 32768 // (256 + 64)


def test_a_training_run_beside_a_server_must_switch_and_says_the_cost(capsys):
    out = run_json(capsys, "plan", "--config", "qwen2.5-1.5b", "--config", "llama-3.2-1b", "--budget", "6GiB",
                   "--train", "--batch-seq-len", "1024", "--disk-gbps", "1.0")
    assert [m["role"] for m in out["models"]] == ["train", "serve"]
    assert out["both_resident"] is False and all(m["alone_fits"] for m in out["models"])
    assert out["reason"].startswith("must be switched")
    cost = out["switch"]["per_model"][1]
    assert cost["load_s_from_disk"] == pytest.approx(cost["checkpoint_bytes"] / 1e9 + out["models"][1]["weights_bytes"] / 8e9, abs=0.01)


def test_a_model_too_large_alone_cannot_be_helped_by_switching(capsys):
    out = run_json(capsys, "plan", "--config", "qwen2.5-7b", "--config", "qwen2.5-1.5b", "--budget", "6GiB",
                   "--precision", "bf16,nf4-dq")
    assert out["reason"].startswith("switching cannot help: qwen2.5-7b")
    assert [m["precision"] for m in out["models"]] == ["bf16", "nf4-dq"]


@pytest.mark.parametrize("args, message", [
    (["--config", "a", "--config", "b", "--config", "c"], "--config: given 3 times"),
    (["--config", "qwen2.5-0.5b", "--config", "qwen2.5-0.5b", "--offload"], "--offload take one model"),
    (["--config", "qwen2.5-0.5b", "--config", "qwen2.5-0.5b", "--precision", "bf16,nf4,int8"], "names 3 precisions"),
    (["--config", "qwen2.5-0.5b", "--config", "qwen2.5-0.5b", "--disk-gbps", "0"], "--disk-gbps"),
])
def test_two_model_bad_input_is_one_line_exit_2(args, message):
    proc = subprocess.run([sys.executable, "-m", "harness", "plan", *args, "--budget", "6GiB"], capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode == 2 and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_a_model_directory_switch_reads_its_safetensors(tiny_model_dir, capsys):
    out = run_json(capsys, "plan", "--config", str(tiny_model_dir), "--config", "qwen2.5-0.5b", "--budget", "6GiB",
                   "--precision", "bf16")
    files = sum(p.stat().st_size for p in Path(tiny_model_dir).glob("*.safetensors"))
    assert out["switch"]["per_model"][0]["checkpoint_bytes"] == files
    assert out["switch"]["per_model"][1]["checkpoint_bytes"] == model_shape("qwen2.5-0.5b").total_params * 2


def test_plan_train_says_why_its_weights_differ_from_the_tables(capsys):
    """The table's weights are as loaded; what stops a QLoRA run counts them as trained (fp32
    embeddings, norms and lm_head): the two figures differ, and plan says why (bf16 does not cast)."""
    assert main(["plan", "--config", "qwen2.5-7b", "--budget", "6GiB", "--train", "--no-replay", "--precision", "nf4-dq"]) == 1
    out = capsys.readouterr().out
    assert "5.17 GiB as loaded" in out and "prepare_model_for_kbit_training" in out
    assert main(["plan", "--config", "qwen2.5-0.5b", "--budget", "6GiB", "--train", "--no-replay", "--precision", "bf16",
                 "--batch-seq-len", "32768"]) == 0
    out = capsys.readouterr().out
    assert "what stops it" in out and "as loaded" not in out
