"""GGUF files for estimate and plan: dimensions and exact weight bytes from the header.

A GGUF file holds its tensors as stored (Q4_K_M mixes Q4_K, Q6_K and F32 tensors), so its weight
bytes are not a bits-per-parameter guess: each tensor's type has a block size and bytes per block
(gguf's GGML_QUANT_SIZES: Q4_K = 144 bytes per 256 weights = 4.5 bits, Q6_K 6.5625, Q8_0 8.5), and
the sum over tensors is what llama.cpp maps. The `gguf` package reads the header through a memory
map; no tensor data is read. Dimensions come from the metadata ({arch}.block_count, ...);
shape.model_shape turns them into a ModelShape whose `stored_weights` are the file's bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import UsageError

# GGUF tensor names (llama.cpp's convention) -> the harness's module kinds
_KINDS = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj",
          "attn_qkv": "qkv_proj", "ffn_gate": "gate_proj", "ffn_up": "up_proj", "ffn_down": "down_proj"}
_BLOCK = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
_FAMILIES = {"llama": "llama", "qwen2": "qwen2", "phi3": "phi3", "mistral": "mistral"}


@dataclass(frozen=True)
class GgufInfo:
    path: Path
    architecture: str
    file_type: str | None  # e.g. MOSTLY_Q4_K_M (general.file_type), None when the file does not say
    config: dict  # transformers-style dimensions read from the metadata
    bytes_by_kind: dict[str, int] = field(default_factory=dict)
    bytes_by_type: dict[str, int] = field(default_factory=dict)  # Q4_K -> bytes of all tensors of that type
    params_by_type: dict[str, int] = field(default_factory=dict)
    tensors: int = 0

    @property
    def weight_bytes(self) -> int:
        return sum(self.bytes_by_kind.values())

    @property
    def params(self) -> int:
        return sum(self.params_by_type.values())

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.weight_bytes / self.params if self.params else 0.0


def _field(reader, key: str):
    f = reader.fields.get(key)
    if f is None:
        return None
    try:
        return f.contents()
    except (IndexError, ValueError):
        return None


def _kind(name: str) -> str:
    if name.startswith("token_embd."):
        return "embeddings"
    if name.startswith("output.") and name.endswith(".weight"):
        return "lm_head"
    m = _BLOCK.match(name)
    if m:
        part, what = m.group(2), m.group(3)
        if what == "bias":
            return "biases"
        if part.endswith("_norm"):
            return "norms"
        if part in _KINDS:
            return f"linear.{_KINDS[part]}"
        return f"other.{part}"
    if name.endswith("_norm.weight"):
        return "norms"
    return "other"


def read_gguf(path: str | Path) -> GgufInfo:
    """The header of a GGUF file; UsageError with one line for anything that is not one."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise UsageError(f"--config: {str(path)!r} is not a file")
    with open(path, "rb") as fh:
        if fh.read(4) != b"GGUF":
            raise UsageError(f"{path.name} is not a GGUF file (no GGUF magic)")
    try:
        from gguf import GGUFReader, LlamaFileType
    except ImportError:
        raise UsageError("reading GGUF needs the gguf package (pip install gguf)") from None
    try:
        reader = GGUFReader(path, "r")
    except Exception as exc:  # noqa: BLE001 - a damaged header raises anything from struct to numpy
        raise UsageError(f"{path.name}: not a readable GGUF header ({type(exc).__name__}: {str(exc)[:120]})") from None
    arch = str(_field(reader, "general.architecture") or "")
    if not arch:
        raise UsageError(f"{path.name}: no general.architecture in the GGUF metadata")
    file_type = _field(reader, "general.file_type")
    try:
        file_type = LlamaFileType(int(file_type)).name if file_type is not None else None
    except ValueError:
        file_type = str(file_type)

    by_kind: dict[str, int] = {}
    by_type: dict[str, int] = {}
    params: dict[str, int] = {}
    embed_shape = None
    has_output = False
    for t in reader.tensors:
        kind = _kind(t.name)
        qtype = t.tensor_type.name
        by_kind[kind] = by_kind.get(kind, 0) + int(t.n_bytes)
        by_type[qtype] = by_type.get(qtype, 0) + int(t.n_bytes)
        params[qtype] = params.get(qtype, 0) + int(t.n_elements)
        if kind == "embeddings":
            embed_shape = [int(d) for d in t.shape]  # GGML order: [hidden, vocab]
        has_output |= kind == "lm_head"

    def meta(key, default=None):
        value = _field(reader, f"{arch}.{key}")
        return default if value is None else value

    hidden = meta("embedding_length")
    heads = meta("attention.head_count")
    config = {
        "model_type": _FAMILIES.get(arch, arch),
        "hidden_size": hidden,
        "intermediate_size": meta("feed_forward_length"),
        "num_hidden_layers": meta("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": meta("attention.head_count_kv", heads),
        "max_position_embeddings": meta("context_length"),
        "vocab_size": embed_shape[1] if embed_shape else len(_field(reader, "tokenizer.ggml.tokens") or []) or None,
        "tie_word_embeddings": not has_output,
    }
    head_dim = meta("attention.key_length")
    if head_dim:
        config["head_dim"] = head_dim
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size") if not config.get(k)]
    if missing:
        raise UsageError(f"{path.name}: the GGUF metadata lacks {', '.join(missing)} for architecture {arch!r}")
    if config["intermediate_size"] is None:
        del config["intermediate_size"]
    return GgufInfo(path, arch, file_type, config, by_kind, by_type, params, len(reader.tensors))
