"""The family rules (harness.modeldir.arch_rules, a model of ours) against transformers' own model
built on the meta device: the same parameter names and shapes, embedding / lm_head names, tied
flag and vocab for every family they cover, and no rule where they were not compared."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

from harness.modeldir import arch_rules, check_dir
from harness.modeldir.consistency import _build_expected_model
from harness.models import reference_config

VARIANTS = [
    ("llama-3.1-8b", {}), ("llama-3.2-1b", {}), ("tinyllama-1.1b", {}), ("smollm2-1.7b", {}),
    ("llama-3.2-1b", {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": False}),
    ("llama-3.1-8b", {"head_dim": 64}),
    ("qwen2.5-0.5b", {}), ("qwen2.5-7b", {}), ("qwen2.5-0.5b", {"head_dim": 32, "tie_word_embeddings": False}),
    ("qwen3-1.7b", {}), ("qwen3-1.7b", {"attention_bias": True, "num_key_value_heads": 16}),
    ("mistral-7b-v0.3", {}), ("mistral-nemo-12b", {}), ("mistral-7b-v0.3", {"head_dim": None}),
]


def _config(name: str, changes: dict) -> dict:
    config = {**reference_config(name), "num_hidden_layers": 2, **changes}  # two layers: the same rule per layer
    return json.loads(json.dumps(config))


@pytest.mark.parametrize("name,changes", VARIANTS, ids=[f"{n}{'+' + '+'.join(c) if c else ''}" for n, c in VARIANTS])
def test_a_rule_gives_what_transformers_builds(name, changes):
    config = _config(name, changes)
    ruled = arch_rules.shapes_by_rule(config)
    built = _build_expected_model(config)
    assert ruled is not None, f"no rule answered for {name}"
    assert ruled["shapes"] == built.shapes
    assert (ruled["embed_key"], ruled["lm_head_key"], ruled["tied"], ruled["vocab_size"]) == \
        (built.embed_key, built.lm_head_key, built.tied, built.vocab_size)


def test_the_rules_answer_only_for_the_sources_they_were_compared_with():
    import transformers

    assert transformers.__version__ == arch_rules.VERIFIED_VERSION, \
        "transformers changed: run this file's comparison, then update VERIFIED_VERSION / VERIFIED_SOURCES"
    for family, pinned in arch_rules.VERIFIED_SOURCES.items():
        assert arch_rules.sources_hash(family) == pinned, f"{family}: re-run the comparison, then update the pin"
    config = _config("qwen2.5-0.5b", {})
    assert arch_rules.shapes_by_rule(config) is not None
    assert arch_rules.shapes_by_rule(config, verified={"qwen2": "0" * 16}) is None  # other sources: no rule


@pytest.mark.parametrize("changes", [{"model_type": "gemma3_text"}, {"quantization_config": {"quant_method": "fp8"}},
                                     {"dtype": "float8_e4m3fn"}, {"torch_dtype": "auto"}, {"hidden_size": 0},
                                     {"num_attention_heads": 0}])
def test_no_rule_where_transformers_must_decide(changes):
    assert arch_rules.shapes_by_rule({**_config("qwen2.5-0.5b", {}), **changes}) is None


def test_each_dtype_the_rules_accept_is_a_torch_dtype():
    assert all(isinstance(getattr(torch, name), torch.dtype) for name in arch_rules.DTYPES)


def test_a_config_the_config_class_refuses_is_refused_without_a_rule(tiny_model_dir, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(tiny_model_dir, d)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "layer_types": ["full_attention"] * 7}))
    assert "config.rejected" in {f.code for f in check_dir(d).errors}


_FRESH = ("import sys; from harness.modeldir import check_dir; r = check_dir(sys.argv[1]); "
          "print(int(r.ok), ' '.join(sorted({f.code for f in r.errors})) or '-', int('torch' in sys.modules))")


def _fresh(d, cache) -> tuple[int, str, int]:
    import os

    env = {**os.environ, "HARNESS_CACHE_DIR": str(cache), "HARNESS_CHECKDIR_CACHE": "1"}
    out = subprocess.run([sys.executable, "-c", _FRESH, str(d)], capture_output=True, text=True, env=env, check=True)
    ok, codes, torch_in = out.stdout.split()[-3:]
    return int(ok), codes, int(torch_in)


def test_stored_tensors_that_differ_from_the_rule_are_judged_on_transformers_model(tiny_model_dir, tmp_path):
    from safetensors.numpy import load_file, save_file

    assert _fresh(tiny_model_dir, tmp_path / "c1") == (1, "-", 0)  # agrees with the rule: no torch at all
    d = tmp_path / "m"
    shutil.copytree(tiny_model_dir, d)
    tensors = load_file(str(d / "model.safetensors"))
    del tensors["model.layers.0.self_attn.q_proj.bias"]
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    assert _fresh(d, tmp_path / "c2") == (0, "arch.missing_tensor", 1)  # the real build found it
