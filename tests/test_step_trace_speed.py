"""What makes plan --train's traces cheaper leaves them the same: meta kernels remembered by their
inputs' metadata (harness.memory.replay.meta_memo) give the trace the kernels give, and a trace with a
size rounded in the length (the memory-efficient attention's logsumexp) makes no other length.
Each test traces in a process of its own (the tracer's libraries stay out of the test process)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

GQA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
       "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 32000,
       "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
       "torch_dtype": "bfloat16", "rope_theta": 10000.0, "hidden_act": "silu"}

HEAD = """
import json, sys, warnings
from dataclasses import replace
warnings.filterwarnings("ignore")
from harness.memory.replay import step_trace as S
from harness.memory.fit.estimate import Query
config = json.loads(sys.argv[1])
recipe = Query("nf4-dq", "train", lora_r=8, lora_targets=("q_proj", "v_proj"), optimizer=sys.argv[2])
def trace(n, batch=1):
    return S.trace_training_step(config, replace(recipe, seq_len=n, batch=batch))
"""


def run(body: str, config: dict, optimizer: str = "adamw_torch") -> dict:
    pytest.importorskip("bitsandbytes")
    pytest.importorskip("peft")
    r = subprocess.run([sys.executable, "-c", HEAD + body, json.dumps(config), optimizer], capture_output=True,
                       text=True, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("optimizer", ["adamw_torch", "adamw_8bit"])
def test_remembered_kernels_give_the_trace_the_kernels_give(optimizer):
    out = run("""
import torch
class Kernels:
    def call(self, func, args, kwargs):
        return func(*args, **kwargs)
S._MEMO[:] = [Kernels()]
plain = [trace(200), trace(96, 2)]
S._MEMO[:] = []
remembered = [trace(200), trace(96, 2)]
memo = S._memo()
print(json.dumps({"equal": [a == b for a, b in zip(plain, remembered)], "events": len(plain[0].events),
                  "hits": memo.hits, "misses": memo.misses, "compile_kept": torch.compile.__module__}))
""", GQA, optimizer)
    assert out["equal"] == [True, True] and out["events"] > 1000
    assert out["hits"] > out["misses"] > 0  # the layers and steps repeat: most ops are remembered
    assert out["compile_kept"] == "torch"  # the import of bitsandbytes gave torch.compile back


def test_a_length_rounded_trace_makes_no_other_length():
    """Query heads equal to the key heads take the memory-efficient kernel, whose logsumexp is the
    length rounded up to 32: three traced lengths on one line of the rounded size (96, 128, 160)
    would make 100 wrong (1600 bytes where it allocates 2048); the trace says so and nothing is made.
    Grouped-query heads take the math path: no rounding, the length is made."""
    body = """
from harness.memory.replay.trace_synthesis import synthesized_trace
from harness.memory.replay.step_trace import StepTrace
traced = {n: trace(n) for n in (96, 128, 160, 100)}
anchors = [(n, traced[n]) for n in (96, 128, 160)]
unguarded = synthesized_trace([(n, StepTrace(t.events, t.train_at)) for n, t in anchors], 100, None)
made = synthesized_trace(anchors, 100, None)
print(json.dumps({"rounded": [t.rounded for t in traced.values()], "made": made is not None and made == traced[100],
                  "unguarded_wrong": unguarded is not None and unguarded.events != traced[100].events}))
"""
    mha = run(body, {**GQA, "num_key_value_heads": 4})
    assert mha == {"rounded": [True] * 4, "made": False, "unguarded_wrong": True}
    gqa = run(body, GQA)
    assert gqa["rounded"] == [False] * 4 and gqa["made"]
