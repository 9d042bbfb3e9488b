"""What vLLM accepts as quantization, per release (read from 0.31.0 / 0.32.0:
vllm.model_executor.layers.quantization.QUANTIZATION_METHODS and each method's
get_supported_act_dtypes). tests/test_vllm_plan_layouts.py holds these tables to the vLLM venvs.
"""

from __future__ import annotations

from ...errors import UsageError

_METHODS_0_31 = frozenset({
    "auto_awq", "auto_gptq", "awq", "awq_marlin", "compressed-tensors", "deepseek_v4_fp8", "experts_int8",
    "fbgemm_fp8", "fp8", "fp8_per_block", "fp8_per_channel", "fp8_per_tensor", "fp_quant", "gpt_oss_mxfp4",
    "gptq", "gptq_marlin", "humming", "inc", "int8_per_channel_weight_only", "modelopt", "modelopt_fp4",
    "modelopt_mixed", "modelopt_mxfp8", "moe_wna16", "mxfp4", "mxfp8", "nvfp4_per_token", "online", "quark",
    "torchao"})
QUANT_METHODS = {(0, 31): _METHODS_0_31, (0, 32): _METHODS_0_31}
# get_supported_act_dtypes() of the methods the plan sizes (identical in 0.31 and 0.32)
ACT_DTYPES = {"awq": ("float16", "bfloat16"), "awq_marlin": ("float16", "bfloat16"), "gptq": ("float16", "bfloat16"),
              "gptq_marlin": ("float16", "bfloat16"), "fp8": ("bfloat16", "float16"), "mxfp4": ("bfloat16",),
              "gpt_oss_mxfp4": ("bfloat16",)}
# config.json spellings vLLM renames before looking the method up (GptOssForCausalLMConfig: mxfp4)
CONFIG_ALIASES = {"compressed_tensors": "compressed-tensors"}
TORCH_NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def check_quantization(method: str, dtype: str, version: tuple[int, int, int], *, from_config: bool) -> None:
    """vLLM's refusals at start: a method that release does not have, an activation dtype the
    method does not support. UsageError (one line, exit 2) with vLLM's reason."""
    if method in ("none", "", None):
        return
    name = CONFIG_ALIASES.get(method, method)
    known = QUANT_METHODS.get(tuple(version[:2]))
    where = "quantization_config.quant_method" if from_config else "--quantization"
    if known is not None and name not in known and name != "bitsandbytes":
        raise UsageError(f"{where}: {method!r} is not a quantization method vLLM {version[0]}.{version[1]} knows "
                         f"(vLLM: 'Invalid quantization method'); it would not load, not run unquantized")
    if known is not None and name == "bitsandbytes":
        raise UsageError(f"{where}: vLLM {version[0]}.{version[1]} has no bitsandbytes quantization "
                         "(not in its QUANTIZATION_METHODS)")
    torch_dtype = TORCH_NAMES.get(dtype)
    supported = ACT_DTYPES.get(name)
    if torch_dtype and supported and torch_dtype not in supported:
        raise UsageError(f"--dtype {dtype}: vLLM refuses it with {name} ('torch.{torch_dtype} is not supported for "
                         f"quantization method {name}. Supported dtypes: {', '.join(supported)}')")
