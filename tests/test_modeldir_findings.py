"""Every finding code, produced by the edit that causes it in real use; good layouts accepted."""

from __future__ import annotations

import json
import pickle
import shutil

import pytest
import torch

from harness.modeldir import CODES, check_dir

from modeldir_helpers import codes, copy_model, edit_json, edit_tensors

EMBED = "model.embed_tokens.weight"
Q = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def sharded_src(tiny_llama_dir, tmp_path_factory):
    """The untied tiny Llama saved as 3+ shards (v5 layout) with its tokenizer."""
    from harness.models import load_model

    out = tmp_path_factory.mktemp("sharded") / "model"
    model = load_model(tiny_llama_dir, "fp32", "cpu")
    model.save_pretrained(out, max_shard_size="2MB")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny_llama_dir / name, out / name)
    return out


@pytest.fixture
def good(tiny_model_dir, tmp_path):
    return copy_model(tiny_model_dir, tmp_path / "model")


@pytest.fixture
def sharded(sharded_src, tmp_path):
    return copy_model(sharded_src, tmp_path / "sharded")


def _v4_style(d):
    """Layout transformers 4.x wrote: torch_dtype, template in tokenizer_config, special_tokens_map."""
    config = json.loads((d / "config.json").read_text())
    config["torch_dtype"] = config.pop("dtype")
    config["transformers_version"] = "4.46.3"
    (d / "config.json").write_text(json.dumps(config))
    template = (d / "chat_template.jinja").read_text()
    (d / "chat_template.jinja").unlink()
    edit_json(d / "tokenizer_config.json", chat_template=template)
    (d / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))


def test_good_layouts_accepted(good, sharded, tiny_llama_dir, tmp_path):
    for d in (good, sharded, tiny_llama_dir):  # single + tied, sharded + untied, single + untied
        report = check_dir(d, deep=True)
        assert report.ok and report.findings == [], (d, report.findings)
    assert len(list(sharded.glob("model-*.safetensors"))) >= 3
    _v4_style(good)
    report = check_dir(good)
    assert report.ok and report.findings == [], report.findings


# each case: (expected code, which fixture, the edit). The edit is what users really do.
def _drop(rel):
    return lambda d: (d / rel).unlink()


def _tensors(edit, rel="model.safetensors"):
    return lambda d: edit_tensors(d / rel, edit)


def _config(**changes):
    return lambda d: edit_json(d / "config.json", **changes)


def _first_shard(d):
    return sorted(d.glob("model-*.safetensors"))[0]


def _adapter_only(d):
    for f in ("model.safetensors",):
        (d / f).unlink()
    (d / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    edit_tensors_new(d / "adapter_model.safetensors", {"base_model.model.q.lora_A.weight": torch.zeros(8, 256)})


def edit_tensors_new(path, tensors):
    from safetensors.torch import save_file

    save_file(tensors, str(path))


def _index_invalid(d):
    (d / "model.safetensors.index.json").write_text('{"metadata": {}}')


def _index_missing(d):
    (d / "model.safetensors.index.json").unlink()


def _missing_shard(d):
    _first_shard(d).unlink()


def _orphan(d):
    shutil.copy(_first_shard(d), d / "model-old.safetensors")


def _index_mismatch(d):
    index = json.loads((d / "model.safetensors.index.json").read_text())
    name = next(iter(index["weight_map"]))
    other = sorted(set(index["weight_map"].values()) - {index["weight_map"][name]})[0]
    index["weight_map"][name] = other
    (d / "model.safetensors.index.json").write_text(json.dumps(index))


def _duplicate(d):
    shards = sorted(d.glob("model-*.safetensors"))
    first = set(__import__("safetensors").safe_open(str(shards[0]), "pt").keys())
    name = sorted(first)[0]
    edit_tensors(shards[1], lambda t: t.__setitem__(name, torch.zeros(1)))


def _pickle_payload(d):
    class Payload:
        def __reduce__(self):
            return (__import__("os").system, (f"touch {d}/pwned",))

    (d / "pytorch_model.bin").write_bytes(pickle.dumps({"w": Payload()}))


def _unknown_global(d):
    # an enum fickling's ML allow-list knows, outside torch's allow-list (Counter is on it since torch 2.5)
    (d / "training_args.bin").write_bytes(b"\x80\x02ctransformers.trainer_utils\nIntervalStrategy\nX\x05\x00\x00\x00stepsq\x00\x85R.")


def _refused_global(d):
    (d / "pytorch_model.bin").write_bytes(b"\x80\x02cmy_package.layers\nCustomLayer\n)R.")


def _damaged_archive(d):
    (d / "pytorch_model.bin").write_bytes(b"PK\x03\x04" + bytes(100))


def _seven_zip(d):
    (d / "weights.7z").write_bytes(b"7z\xbc\xaf\x27\x1c" + bytes(40))


def _bad_pickle(d):
    (d / "optimizer.pt").write_bytes(b"\x80\x05garbage")


def _added_tokens(d):
    tok = json.loads((d / "tokenizer.json").read_text())
    size = max(t["id"] for t in tok["added_tokens"]) + 1
    vocab = max(tok["model"]["vocab"].values()) + 1
    tok["added_tokens"].append({"id": max(size, vocab), "content": "<tool_call>", "special": True,
                                "single_word": False, "lstrip": False, "rstrip": False, "normalized": False})
    (d / "tokenizer.json").write_text(json.dumps(tok))


def _tied_differs(d):
    edit_tensors(d / "model.safetensors", lambda t: t.__setitem__("lm_head.weight", t[EMBED] * 0.5))


def _bnb_checkpoint(d):
    def edit(t):
        w = t.pop(Q)
        t[Q] = torch.zeros(w.numel() // 2, 1, dtype=torch.uint8)
        t[Q + ".absmax"] = torch.ones(w.numel() // 64)
        t[Q + ".quant_state.bitsandbytes__nf4"] = torch.zeros(16, dtype=torch.uint8)
    edit_tensors(d / "model.safetensors", edit)
    edit_json(d / "config.json", quantization_config={"quant_method": "bitsandbytes", "load_in_4bit": True})


def _compressed_tensors(d):
    edit_tensors(d / "model.safetensors", lambda t: t.__setitem__(Q + "_scale", torch.ones(1)))
    edit_tensors(d / "model.safetensors", lambda t: t.__setitem__(Q.replace(".weight", ".weight_scale"), torch.ones(1)))
    edit_json(d / "config.json", quantization_config={"quant_method": "compressed-tensors"})


def _remote(d):
    (d / "modeling_evil.py").write_text("raise SystemExit('imported!')\n")
    edit_json(d / "config.json", auto_map={"AutoModelForCausalLM": "modeling_evil.Evil"})


CASES = [
    ("config.missing", "good", _drop("config.json")),
    ("config.invalid", "good", lambda d: (d / "config.json").write_text('{"architectures": []}')),
    ("weights.missing", "good", _drop("model.safetensors")),
    ("weights.adapter_only", "good", _adapter_only),
    ("weights.index_invalid", "sharded", _index_invalid),
    ("weights.index_missing", "sharded", _index_missing),
    ("weights.missing_shard", "sharded", _missing_shard),
    ("weights.orphan_file", "sharded", _orphan),
    ("weights.index_mismatch", "sharded", _index_mismatch),
    ("weights.duplicate_tensor", "sharded", _duplicate),
    ("tokenizer.missing", "good", _drop("tokenizer.json")),
    ("tokenizer.invalid", "good", lambda d: (d / "tokenizer.json").write_text("{oops")),
    ("tokenizer.config_missing", "good", _drop("tokenizer_config.json")),
    ("chat_template.missing", "good", _drop("chat_template.jinja")),
    ("generation_config.missing", "good", _drop("generation_config.json")),
    ("generation_config.invalid", "good", lambda d: (d / "generation_config.json").write_text("nope")),
    ("generation_config.no_eos", "good", lambda d: (_drop("generation_config.json")(d), _config(eos_token_id=None)(d))),
    ("safetensors.lfs_pointer", "good", lambda d: (d / "model.safetensors").write_text(
        "version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 7000000\n")),
    ("safetensors.html_page", "good", lambda d: (d / "model.safetensors").write_text("<html><body>403</body></html>")),
    ("safetensors.truncated", "sharded", lambda d: _first_shard(d).write_bytes(_first_shard(d).read_bytes()[:-1000])),
    ("arch.unknown", "good", _config(model_type="not-a-model")),
    ("config.rejected", "good", _config(layer_types=["full_attention"] * 7)),
    ("arch.missing_tensor", "good", _tensors(lambda t: t.pop(Q))),
    ("arch.unexpected_tensor", "good", _tensors(lambda t: t.__setitem__("model.extra.weight", torch.zeros(2)))),
    ("arch.shape_mismatch", "good", _config(intermediate_size=1024)),
    ("vocab.config_mismatch", "good", _config(vocab_size=4096)),
    ("vocab.tokenizer_overflow", "good", _added_tokens),
    ("tied.lm_head_missing", "sharded", lambda d: edit_tensors(
        d / json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]["lm_head.weight"],
        lambda t: t.pop("lm_head.weight"))),
    ("tied.lm_head_stored", "good", _tensors(lambda t: t.__setitem__("lm_head.weight", t[EMBED].clone()))),
    ("tied.lm_head_differs", "good", _tied_differs),
    ("dtype.mismatch", "good", _config(dtype="bfloat16")),
    ("dtype.mixed", "good", _tensors(lambda t: t.__setitem__(Q, t[Q].to(torch.bfloat16)))),
    ("leftover.adapter_keys", "good", _tensors(lambda t: t.__setitem__(
        "model.layers.0.self_attn.q_proj.lora_A.default.weight", torch.zeros(8, 256)))),
    ("leftover.adapter_files", "good", lambda d: (d / "adapter_config.json").write_text('{"peft_type": "LORA"}')),
    ("quant.stale_config", "good", _config(quantization_config={"quant_method": "bitsandbytes", "load_in_4bit": True})),
    ("quant.missing_config", "good", _tensors(lambda t: t.__setitem__(Q + ".absmax", torch.ones(4)))),
    ("quant.incomplete_config", "good", _compressed_tensors),
    ("quant.bitsandbytes_checkpoint", "good", _bnb_checkpoint),
    ("safety.pickle_file", "good", lambda d: torch.save({"w": torch.ones(2)}, d / "pytorch_model.bin")),
    ("safety.pickle_dangerous", "good", _pickle_payload),
    ("safety.pickle_unknown_global", "good", _unknown_global),
    ("safety.pickle_framed", "good", lambda d: torch.save({"w": torch.ones(2)}, d / "extra.pt", pickle_protocol=4)),
    ("safety.pickle_refused", "good", _refused_global),
    ("safety.archive_invalid", "good", _damaged_archive),
    ("safety.archive_unscanned", "good", _seven_zip),
    # 'G' is BINFLOAT to the unpickler: a pickle that begins with GGUF's magic (issue 23)
    ("safety.unverifiable", "good", lambda d: (d / "weights.gguf").write_bytes(
        b"GGUF\x03\x00\x00\x00\x000cos\nsystem\n(S'touch " + str(d / "pwned").encode() + b"'\ntR.")),
    ("safety.pickle_unreadable", "good", _bad_pickle),
    ("safety.remote_code", "good", _remote),
    ("safety.python_file", "good", lambda d: (d / "convert.py").write_text("print('hi')\n")),
    ("tensor.nan", "good", _tensors(lambda t: t[Q].__setitem__((0, 0), float("nan")))),
    ("tensor.inf", "good", _tensors(lambda t: t[Q].__setitem__((1, 1), float("inf")))),
    ("tensor.all_zero", "good", _tensors(lambda t: t[Q].zero_())),
]
# codes whose cases live elsewhere (headers, paths, and codes needing a broken filesystem)
COVERED_ELSEWHERE = {"safetensors.header_too_large", "safetensors.header_invalid", "safetensors.unknown_dtype",
                     "safetensors.bad_offsets", "safetensors.trailing_bytes", "safety.path_escape",
                     "safety.special_file", "file.unreadable"}
# quantized-layer codes: tests/test_modeldir_quant_layout.py (GPTQ/AWQ) and suites/quant (real exports)
COVERED_ELSEWHERE |= {"quant.packed_tensor", "quant.scales", "quant.zero_points", "quant.g_idx", "quant.group_size",
                      "quant.bits", "quant.unsupported_scheme", "quant.layer_not_quantized",
                      "quant.ignored_but_quantized", "quant.kernel_dims"}
# GGUF-directory codes: tests/test_gguf_dir.py (harness/modeldir/gguf_dir.py)
COVERED_ELSEWHERE |= {code for code in CODES if code.startswith("gguf.")}
# directory-level codes (issue 43): tests/test_modeldir_directory.py (tests/modeldir_cases.py)
COVERED_ELSEWHERE |= {"chat_template.invalid", "chat_template.unsafe", "config.non_finite", "config.out_of_range",
                      "tensor.constant"}


@pytest.mark.parametrize("code,which,edit", CASES, ids=[c[0] for c in CASES])
def test_each_code(code, which, edit, request):
    d = request.getfixturevalue(which)
    edit(d)
    report = check_dir(d, deep=code.startswith(("tensor.", "tied.lm_head_differs")))
    assert code in codes(report), report.findings
    finding = next(f for f in report.findings if f.code == code)
    assert finding.severity == CODES[code][0]
    assert len(finding.message) > 30  # says what to do, not just the code
    assert report.ok == (not report.errors)
    if CODES[code][0] == "error":
        assert not report.ok
    assert not (d / "pwned").exists()


def test_every_code_has_a_case():
    assert {c[0] for c in CASES} | COVERED_ELSEWHERE == set(CODES)


def test_options_turn_errors_into_warnings(good):
    _remote(good)
    torch.save({"w": torch.ones(2)}, good / "pytorch_model.bin")
    assert not check_dir(good).ok
    report = check_dir(good, allow_remote_code=True, allow_pickle=True)
    assert report.ok, report.findings
    assert {"safety.remote_code", "safety.python_file", "safety.pickle_file"} <= codes(report)
    _pickle_payload(good)  # a dangerous pickle stays an error whatever is allowed
    assert not check_dir(good, allow_remote_code=True, allow_pickle=True).ok
