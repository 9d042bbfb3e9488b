"""check-dir on GPTQ and AWQ layouts (their own formats; llm-compressor writes compressed-tensors,
whose real exports suites/quant checks): tensors built in each format's shapes from the tiny model."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from harness.modeldir import check_dir

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _write(tiny_model_dir, out, method: str, qcfg: dict, group: int = 128, bits: int = 4, edit=None):
    shutil.copytree(tiny_model_dir, out)
    state = load_file(str(out / "model.safetensors"))
    pack = 32 // bits
    tensors = {}
    for name, value in state.items():
        module = name.rsplit(".", 1)[0]
        if name.endswith(".weight") and module.rsplit(".", 1)[-1] in LINEARS:
            n_out, n_in = value.shape
            groups = n_in // group if group > 0 else 1
            if method == "gptq":
                tensors[f"{module}.qweight"] = torch.zeros(n_in // pack, n_out, dtype=torch.int32)
                tensors[f"{module}.g_idx"] = torch.arange(n_in, dtype=torch.int32) // max(group, 1)
            else:
                tensors[f"{module}.qweight"] = torch.zeros(n_in, n_out // pack, dtype=torch.int32)
            tensors[f"{module}.qzeros"] = torch.zeros(groups, n_out // pack, dtype=torch.int32)
            tensors[f"{module}.scales"] = torch.ones(groups, n_out, dtype=torch.float16)
        else:
            tensors[name] = value
    if edit:
        edit(tensors)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = qcfg
    (out / "config.json").write_text(json.dumps(config))
    return out


GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}


def codes(d):
    return {f.code for f in check_dir(d).findings}


@pytest.mark.parametrize("method,qcfg", [("gptq", GPTQ), ("awq", AWQ)])
def test_well_formed_layouts_pass(tiny_model_dir, tmp_path, method, qcfg):
    assert codes(_write(tiny_model_dir, tmp_path / method, method, qcfg)) == set()


@pytest.mark.parametrize("name,method,qcfg,edit,code", [
    ("gptq asymmetric", "gptq", GPTQ | {"sym": False}, None, "quant.unsupported_scheme"),
    ("gptq desc_act", "gptq", GPTQ | {"desc_act": True}, None, "quant.unsupported_scheme"),
    ("gptq 3 bits", "gptq", GPTQ | {"bits": 3}, None, "quant.bits"),
    ("awq 8 bits", "awq", AWQ | {"bits": 8}, None, "quant.bits"),
    ("gptq group size 96", "gptq", GPTQ | {"group_size": 96}, None, "quant.group_size"),
    ("awq config over gptq tensors", "gptq", AWQ, None, "quant.packed_tensor"),
    ("gptq qzeros dropped", "gptq", GPTQ,
     lambda t: t.pop("model.layers.0.mlp.up_proj.qzeros"), "quant.zero_points"),
    ("gptq scales fp32 transposed", "gptq", GPTQ,
     lambda t: t.__setitem__("model.layers.1.self_attn.o_proj.scales", torch.ones(256, 2)), "quant.scales"),
    ("gptq g_idx short", "gptq", GPTQ,
     lambda t: t.__setitem__("model.layers.0.self_attn.q_proj.g_idx", torch.zeros(128, dtype=torch.int32)), "quant.g_idx"),
    ("gptq one layer's qweight removed, its scales and zeros kept", "gptq", GPTQ,
     lambda t: t.pop("model.layers.1.mlp.down_proj.qweight"), "quant.packed_tensor"),
    ("awq one layer's qweight removed", "awq", AWQ,
     lambda t: t.pop("model.layers.0.self_attn.k_proj.qweight"), "quant.packed_tensor"),
    ("o_proj not converted per the config but packed", "awq", AWQ | {"modules_to_not_convert": ["o_proj"]}, None,
     "quant.ignored_but_quantized"),
])
def test_broken_layouts_refused_with_their_code(tiny_model_dir, tmp_path, name, method, qcfg, edit, code):
    d = _write(tiny_model_dir, tmp_path / "d", method, qcfg, edit=edit)
    report = check_dir(d)
    assert not report.ok and code in {f.code for f in report.errors}, report.findings


def test_float_layer_in_a_gptq_checkpoint(tiny_model_dir, tmp_path):
    def edit(t):
        for s in ("qweight", "qzeros", "scales", "g_idx"):
            t.pop(f"model.layers.1.mlp.down_proj.{s}")
        t["model.layers.1.mlp.down_proj.weight"] = torch.zeros(256, 512)

    assert "quant.layer_not_quantized" in codes(_write(tiny_model_dir, tmp_path / "d", "gptq", GPTQ, edit=edit))


def test_kernel_limits_are_a_warning_naming_the_kernel(tiny_model_dir, tmp_path):
    d = _write(tiny_model_dir, tmp_path / "d", "gptq", GPTQ | {"group_size": 256}, group=256)
    report = check_dir(d)
    assert report.ok  # vLLM still loads it (a slower kernel on GPU)
    warning = next(f for f in report.findings if f.code == "quant.kernel_dims")
    assert "Marlin" in warning.message and "group size 256" in warning.message


def test_every_quant_layout_code_has_a_case():
    import inspect

    from harness.modeldir import CODES

    source = inspect.getsource(inspect.getmodule(test_every_quant_layout_code_has_a_case))
    layout = {c for c in CODES if c.startswith("quant.")} - {"quant.stale_config", "quant.missing_config",
                                                              "quant.incomplete_config", "quant.bitsandbytes_checkpoint"}
    assert [code for code in sorted(layout) if f'"{code}"' not in source] == []
