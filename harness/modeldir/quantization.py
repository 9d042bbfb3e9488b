"""quantization_config coherent with the stored tensors."""

from __future__ import annotations

from . import quant_layout
from .findings import Collector
from .safetensors_header import FLOAT_DTYPES, TensorInfo

BNB_MARKERS = (".absmax", ".quant_map", ".quant_state.", ".nested_absmax", ".SCB", ".weight_format")
GPTQ_AWQ_MARKERS = (".qweight", ".qzeros", ".scales", ".g_idx")
COMPRESSED_MARKERS = (".weight_packed", ".weight_scale", ".weight_shape", ".input_scale")


def quant_markers(stored: dict[str, tuple[str, TensorInfo]]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {"bitsandbytes": [], "gptq/awq": [], "compressed-tensors": []}
    for name in stored:
        if any(m in name for m in BNB_MARKERS):
            found["bitsandbytes"].append(name)
        elif name.endswith(GPTQ_AWQ_MARKERS):
            found["gptq/awq"].append(name)
        elif name.endswith(COMPRESSED_MARKERS):
            found["compressed-tensors"].append(name)
    return {k: v for k, v in found.items() if v}


def check_quantization(config: dict, stored: dict[str, tuple[str, TensorInfo]], out: Collector) -> bool:
    """Findings about quantization; returns True when the tensors are (meant to be) quantized,
    so that exact shape checks are skipped for them."""
    qcfg = config.get("quantization_config")
    markers = quant_markers(stored)
    if not qcfg:
        if markers:
            kind, names = next(iter(markers.items()))
            out.add("quant.missing_config", ".",
                    f"{kind} tensors ({names[0]}, ...) but config.json has no quantization_config: "
                    "save with the quantizer's save_pretrained so the config is written")
            return True
        return False
    if not isinstance(qcfg, dict):
        out.add("quant.incomplete_config", "config.json", "quantization_config is not an object")
        return False
    method = str(qcfg.get("quant_method", "")).lower()
    if not method and (qcfg.get("load_in_4bit") or qcfg.get("load_in_8bit")):
        method = "bitsandbytes"
    floats = sum(1 for _p, t in stored.values() if t.dtype in FLOAT_DTYPES and len(t.shape) == 2)

    if method == "bitsandbytes":
        if "bitsandbytes" not in markers:
            out.add("quant.stale_config", "config.json",
                    "quantization_config says bitsandbytes but every weight is a plain float tensor: "
                    "delete quantization_config from config.json (it was copied from a 4/8-bit base), or "
                    "loaders will try to quantize or mis-read the weights")
            return False
        out.add("quant.bitsandbytes_checkpoint", ".",
                "pre-quantized bitsandbytes weights (absmax/quant_state tensors): vLLM does not serve them and a merge into "
                "a 4-bit base rounds the adapter away; load the base in bf16, merge, save bf16 (quantize at load time instead)")
        return True
    if method in ("gptq", "awq"):
        missing = [k for k in ("bits", "group_size") if k not in qcfg]
        if missing:
            out.add("quant.incomplete_config", "config.json",
                    f"{method} quantization_config lacks {', '.join(missing)}: vLLM needs them; re-export with the quantizer")
        if "gptq/awq" not in markers:
            out.add("quant.stale_config", "config.json",
                    f"quantization_config says {method} but there are no qweight/qzeros/scales tensors ({floats} float matrices): "
                    "remove quantization_config or save the quantized model")
            return False
        return True
    if method == "compressed-tensors":
        missing = [k for k in ("config_groups", "format") if k not in qcfg]
        if missing:
            out.add("quant.incomplete_config", "config.json",
                    f"compressed-tensors quantization_config lacks {', '.join(missing)}: re-export with llm-compressor")
        if "compressed-tensors" not in markers:
            out.add("quant.stale_config", "config.json",
                    "quantization_config says compressed-tensors but no packed or scale tensors are stored")
            return False
        return True
    return bool(markers) or method in ("fp8", "bitnet", "hqq", "eetq", "torchao", "gguf")


def check_quantized_layout(config: dict, stored: dict[str, tuple[str, TensorInfo]], expected, out: Collector) -> None:
    """Each quantized layer's tensors against the config (bits, group size, symmetry, ignore list)
    and the architecture's shapes; see quant_layout."""
    qcfg = config.get("quantization_config")
    if not isinstance(qcfg, dict):
        return
    method = str(qcfg.get("quant_method", "")).lower()
    layers = quant_layout.linear_layers(expected.shapes, expected.embed_key)
    if method == "compressed-tensors":
        quant_layout.check_compressed_tensors(qcfg, stored, layers, out)
    elif method in ("gptq", "awq"):
        head = expected.lm_head_key[: -len(".weight")] if expected.lm_head_key else None
        quant_layout.check_gptq_awq(method, qcfg, stored, layers, head, out)
