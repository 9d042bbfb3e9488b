"""What vLLM's memory plan needs from a model (harness.memory.vllm.vllm_plan), read from a config.json,
a model directory (its safetensors headers give the stored weight bytes) or a reference name
(harness/configs)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ...errors import UsageError

VOCAB_PADDING = 64

@dataclass(frozen=True)
class ModelFacts:
    """What the plan needs from a model, whatever it was read from."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    max_position: int
    rotary_dim: int
    config_dtype: str  # float32 / float16 / bfloat16
    params: int  # unquantized parameter count (embeddings, lm_head, norms, biases included)
    linears: tuple[tuple[str, int, int, int], ...]  # (kind, in, out, count) of decoder linears
    quantization: str = "none"  # from config.json's quantization_config
    group_size: int = 128
    weight_bits: int = 4
    stored_weights_bytes: int | None = None  # from safetensors headers (checkpoint as stored)
    not_modelled: str = ""  # an architecture feature the plan does not model (MoE, MLA, sliding window)
    max_len_limit: int | None = None  # the longest max_model_len vLLM accepts (its "derived max_model_len")
    architecture: str = ""  # config.json's architectures[0] (vLLM picks its model runner by it)
    # the config.json itself: vLLM's per-layer KV specs are read from it (vllm_kv_families)
    config: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def padded_vocab(self) -> int:
        return -(-self.vocab // VOCAB_PADDING) * VOCAB_PADDING

    @property
    def largest_linear(self) -> int:
        return max((i * o for _, i, o, _ in self.linears), default=0)

    @property
    def linear_params(self) -> int:
        return sum(i * o * c for _, i, o, c in self.linears)


_QUANT_METHODS = {"awq": "awq", "gptq": "gptq", "compressed-tensors": "compressed-tensors",
                  "compressed_tensors": "compressed-tensors", "fp8": "fp8", "bitsandbytes": "bitsandbytes"}


def _config_quantization(config: dict) -> tuple[str, int, int]:
    qc = config.get("quantization_config") or {}
    raw = str(qc.get("quant_method") or "").lower()
    # a method the plan does not size keeps its name: vllm_quant_rules refuses what vLLM refuses
    method = _QUANT_METHODS.get(raw, raw or "none")
    group, bits = int(qc.get("group_size") or 128), int(qc.get("bits") or qc.get("w_bit") or 4)
    if method == "compressed-tensors":
        for group_cfg in (qc.get("config_groups") or {}).values():
            weights = group_cfg.get("weights") or {}
            bits = int(weights.get("num_bits") or bits)
            group = int(weights.get("group_size") or group)
            if weights.get("type") == "float" and bits == 8:
                method = "fp8"
            break
    if qc.get("load_in_4bit") or qc.get("_load_in_4bit"):
        method = "bitsandbytes"
    if group < 0:  # per-channel
        group = 0
    return method, group, bits


def model_facts(spec: str | Path | dict) -> ModelFacts:
    """Read a config.json, a model directory or a reference name (harness/configs)."""
    from ..fit.shape import model_shape
    from ..fit.config_file import load_config, naming_config

    if isinstance(spec, str) and not Path(spec).expanduser().exists():
        from ...models import CONFIG_DIR
        if (CONFIG_DIR / f"{spec}.json").is_file():
            spec = CONFIG_DIR / f"{spec}.json"
    with naming_config(spec):
        config, directory = load_config(spec)
        shape = model_shape(config)
    name = str(config.get("_name_or_path") or "")
    if not name and not isinstance(spec, dict):
        path = Path(str(spec))
        name = path.parent.name if path.name == "config.json" else path.stem if path.suffix == ".json" else path.name
    name = name or str(config.get("model_type") or "model")
    rotary = config.get("partial_rotary_factor")
    rotary_dim = int(shape.head_dim * float(rotary)) if rotary else shape.head_dim
    quant, group, bits = _config_quantization(config)
    linears = tuple((g.kind, g.in_features, g.out_features, g.count) for g in shape.linears)
    stored = None
    if directory is not None:
        stored = _safetensors_bytes(directory)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16").replace("torch.", "")
    features = []
    if any(config.get(k) for k in ("num_experts", "num_local_experts", "n_routed_experts")):
        features.append("mixture of experts")
    return ModelFacts(
        name=name, layers=shape.layers, hidden=shape.hidden, intermediate=shape.intermediate,
        kv_heads=shape.kv_heads, head_dim=shape.head_dim, vocab=shape.vocab, tied=shape.tied,
        max_position=int(config.get("max_position_embeddings") or 4096), rotary_dim=rotary_dim,
        config_dtype=dtype, params=shape.total_params, linears=linears, quantization=quant,
        group_size=group, weight_bits=bits, stored_weights_bytes=stored, not_modelled=", ".join(features),
        max_len_limit=derived_max_len(config), architecture=str((config.get("architectures") or [""])[0]),
        config=config,
    )


def derived_max_len(config: dict) -> int:
    """vLLM's derived max_model_len: max_position_embeddings, times the RoPE scaling factor for the
    scalings that stretch the window (linear, dynamic, yarn from its original length); a longer
    --max-model-len is refused at start unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."""
    keys = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length",
            "max_seq_length", "seq_len")  # vLLM takes the smallest of those a config has
    found = [int(config[k]) for k in keys if isinstance(config.get(k), (int, float)) and config[k] > 0]
    base = min(found) if found else 4096
    if "gemma3" in str(config.get("model_type") or ""):
        return base  # vLLM: "Gemma3's max_model_len (128K) is already scaled by RoPE scaling"
    rope = config.get("rope_scaling") or {}
    kind = str(rope.get("rope_type") or rope.get("type") or "")
    factor = float(rope.get("factor") or 1)
    if kind == "yarn":
        base = int(rope.get("original_max_position_embeddings") or base)
    if kind in ("linear", "dynamic", "yarn") and factor > 1:
        return int(base * factor)
    return base


def facts_family(config: dict) -> str:
    return str(config.get("model_type") or "").lower()


def _safetensors_bytes(directory: Path) -> int | None:
    """Bytes of the stored tensors, floating ones counted at 2 bytes (vLLM loads them in the 16-bit
    model dtype), packed integer ones as stored."""
    from ...modeldir.safetensors_header import FLOAT_DTYPES, HeaderProblem, read_header

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for path in files:
        try:
            with open(path, "rb") as fh:
                header = read_header(fh, path.stat().st_size)
        except (OSError, HeaderProblem) as exc:
            raise UsageError(f"{path.name}: cannot read its safetensors header ({exc})") from None
        for info in header.tensors.values():
            if info.dtype in FLOAT_DTYPES:
                total += info.numel * 2
            else:
                total += info.end - info.begin
    return total


