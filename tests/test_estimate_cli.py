"""`python -m harness estimate` and `plan`: the docs/architecture.md contract, and bad input -> exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.__main__ import main

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=ROOT)


def test_estimate_json_contract(capsys):
    cfg = str(ROOT / "harness" / "configs" / "qwen2.5-1.5b.json")
    rc = main(["estimate", "--config", cfg, "--precision", "bf16,nf4-dq", "--mode", "prefill,generate,train",
               "--seq-len", "512,2048", "--batch", "2", "--new-tokens", "32", "--lora-r", "8",
               "--lora-targets", "q_proj,v_proj", "--no-grad-checkpointing", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out) == 2 * 3 * 2
    for obj in out:
        for key in ("precision", "mode", "seq_len", "batch", "peak_bytes", "breakdown"):
            assert key in obj
        assert obj["batch"] == 2 and obj["peak_bytes"] > obj["breakdown"]["weights"] > 0
    train = [o for o in out if o["mode"] == "train"]
    assert all(o["lora_r"] == 8 and o["grad_checkpointing"] is False for o in train)
    assert all(o["lora_targets"] == ["q_proj", "v_proj"] for o in train)
    gen = [o for o in out if o["mode"] == "generate"]
    assert all(o["new_tokens"] == 32 for o in gen)


def test_estimate_accepts_reference_name_and_model_directory(tiny_model_dir, capsys):
    assert main(["estimate", "--config", "llama-3.2-1b", "--json"]) == 0
    ref = json.loads(capsys.readouterr().out)
    assert ref[0]["source"] == "config"
    assert main(["estimate", "--config", str(tiny_model_dir), "--mode", "weights", "--json"]) == 0
    tiny = json.loads(capsys.readouterr().out)
    assert tiny[0]["source"] == "safetensors"  # exact sizes from the headers


def test_estimate_table_is_readable():
    r = cli("estimate", "--config", "qwen2.5-0.5b", "--precision", "nf4", "--mode", "train", "--seq-len", "1024")
    assert r.returncode == 0, r.stderr
    assert "nf4" in r.stdout and "GiB" in r.stdout or "MiB" in r.stdout


@pytest.mark.parametrize("args,needle", [
    (["--precision", "fp5"], "unknown value fp5"),
    (["--seq-len", "-5"], "--seq-len"),
    (["--seq-len", "abc"], "not an integer"),
    (["--batch", "0"], "--batch"),
    (["--mode", "serve"], "--mode"),
    (["--new-tokens", "-1"], "--new-tokens"),
    (["--mode", "train", "--lora-targets", "c_attn"], "c_attn"),
])
def test_estimate_bad_input_is_one_line_exit_2(args, needle):
    r = cli("estimate", "--config", "qwen2.5-0.5b", *args)
    assert r.returncode == 2
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr


def test_config_without_hidden_size_is_exit_2(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    for cmd in (["estimate", "--config", str(cfg)], ["plan", "--config", str(cfg), "--budget", "6GiB"]):
        r = cli(*cmd)
        assert r.returncode == 2 and "hidden_size" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "broken.json").write_text("{not json")
    r = cli("estimate", "--config", str(tmp_path / "broken.json"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    r = cli("estimate", "--config", str(tmp_path / "nope"))
    assert r.returncode == 2 and "neither" in r.stderr



def test_config_errors_name_the_config_they_came_from(tmp_path):
    """A config that holds a bad value is named in the error (estimate, plan and plan --engine vllm);
    an unknown model_type is one short line, not transformers' list of every model_type it knows."""
    (tmp_path / "no-hidden.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    (tmp_path / "mystery.json").write_text(json.dumps({
        "model_type": "mysterylm", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "vocab_size": 1000}))
    for name, needle in (("no-hidden.json", "hidden_size"), ("mystery.json", "does not know this model_type")):
        cfg = str(tmp_path / name)
        for cmd in (["estimate", "--config", cfg], ["plan", "--config", cfg, "--budget", "6GiB"],
                    ["plan", "--engine", "vllm", "--config", cfg, "--gpu-memory", "t4", "--max-model-len", "2048"]):
            r = cli(*cmd)
            assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
            line = r.stderr.strip()
            assert len(line.splitlines()) == 1 and len(line) < 400, line
            assert cfg in line and needle in line, line

def test_unknown_architecture_falls_back_to_meta_count(tmp_path, capsys):
    cfg = {"model_type": "gemma", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64, "vocab_size": 1000}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert main(["estimate", "--config", str(tmp_path / "config.json"), "--mode", "weights", "--precision",
                 "bf16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)[0]
    assert out["source"] == "meta"
    # gemma ties its embedding: 1000 x 256 + 2 layers of (q 256x256, k/v 256x64, o 256x256, 3 MLP 256x512)
    linear = 2 * (256 * 256 * 2 + 256 * 64 * 2 + 3 * 256 * 512)
    assert out["params"] >= 1000 * 256 + linear


def test_plan_says_what_fits_on_6gib(capsys):
    assert main(["plan", "--config", "qwen2.5-3b", "--budget", "6GiB", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    plans = {p["precision"]: p for p in data["plans"]}
    assert not plans["fp32"]["fits"] and "weights alone" in plans["fp32"]["reason"]
    assert plans["nf4"]["fits"] and plans["nf4"]["max_seq_len"] > plans["int8"]["max_seq_len"] > 0
    assert plans["nf4-dq"]["max_batch"] >= plans["nf4"]["max_batch"] >= 1
    # the plan is consistent with the estimator: the longest context fits, one more token does not
    from harness.commands.model_options import DEFAULT_NEW_TOKENS as new
    from harness.memory.fit import budget as B, estimate as E
    from harness.memory.fit.shape import model_shape

    shape = model_shape("qwen2.5-3b")
    best = plans["nf4"]["max_seq_len"]
    peak = lambda s: E.estimate(shape, E.Query("nf4", "generate", seq_len=s - new, new_tokens=new)).peak_bytes  # noqa: E731
    assert B.fits(peak(best), data["budget_bytes"], data["context_bytes"], data["headroom"])
    assert not B.fits(peak(best + 1), data["budget_bytes"], data["context_bytes"], data["headroom"])


def test_plan_train_and_bad_budget():
    r = cli("plan", "--config", "qwen2.5-1.5b", "--budget", "8GB", "--train", "--no-replay")
    assert r.returncode == 0 and "train" in r.stdout
    r = cli("plan", "--config", "qwen2.5-1.5b", "--budget", "lots")
    assert r.returncode == 2 and "not a size" in r.stderr
    r = cli("plan", "--config", "qwen2.5-1.5b", "--budget", "300MiB")
    assert r.returncode == 2 and "CUDA context" in r.stderr


@pytest.mark.parametrize("args,needle", [
    (["--lora-r", "8,16"], "--lora-r: '8,16' is a list"),
    (["--new-tokens", "x"], "--new-tokens: 'x' is not an integer"),
    (["--budget", "6"], "--budget: '6' has no unit: 6GiB or 6GB?"),
    (["--budget", "6G"], "--budget: '6G' is ambiguous"),
    (["--optimizer", "sgd"], "--optimizer: unknown optimizer 'sgd'"),
    (["--context-bytes", "400"], "--context-bytes: '400' has no unit"),
    (["--budget", "6MB"], "--budget: 6MB leaves nothing after the 400 MiB CUDA context"),  # MB for GB
    (["--lora-targets", ""], "--lora-targets: no value given"),
])
def test_estimate_and_plan_read_their_shared_options_alike(args, needle):
    """The options both commands declare (harness/commands/model_options.py) fail the same way in each."""
    for cmd in (["estimate", "--config", "qwen2.5-0.5b", "--mode", "train"],
                ["plan", "--config", "qwen2.5-0.5b", "--train"] + ([] if "--budget" in args else ["--budget", "6GiB"])):
        r = cli(*cmd, *args)
        assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, (cmd, r.stderr)


def test_estimate_and_plan_count_the_same_generated_tokens(capsys):
    """One --new-tokens default: plan's longest context holds what estimate's generate mode generates."""
    from harness.commands.model_options import DEFAULT_NEW_TOKENS

    assert main(["estimate", "--config", "qwen2.5-0.5b", "--mode", "generate", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["new_tokens"] == DEFAULT_NEW_TOKENS
    assert main(["plan", "--config", "qwen2.5-0.5b", "--budget", "6GB", "--precision", "nf4"]) == 0
    assert capsys.readouterr().out.startswith("budget 6 GB (5.59 GiB), CUDA context 400 MiB,")


def test_a_context_past_the_models_limit_is_estimated_and_said():
    # tinyllama: max_position_embeddings 2048; generate counts the new tokens in the context
    r = cli("estimate", "--config", "tinyllama-1.1b", "--mode", "generate", "--seq-len", "2000", "--new-tokens", "64")
    assert r.returncode == 0 and "2064 tokens is past the model's own limit (2048, max_position_embeddings)" in r.stderr
    r = cli("estimate", "--config", "tinyllama-1.1b", "--mode", "prefill,generate", "--seq-len", "1900", "--json")
    assert r.returncode == 0 and "past the model's own limit" not in r.stderr, r.stderr
