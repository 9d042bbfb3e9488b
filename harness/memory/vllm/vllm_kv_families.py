"""Which KV cache spec vLLM gives each layer of a model, read from its config.json (no vLLM import).

One layout function per kind of model file, declared with @layout (LAYOUTS); each family's entry
in harness/memory/family/registry.py names the one its vLLM model file builds (read at 0.31.0 /
0.32.0): the attention layers' heads, head size and window, the layers whose KV is shared (no
spec), the Mamba / Gated DeltaNet / short-conv state per request. A config whose layers name a
kind no entry knows is refused with the reason (`Unmodelled`): the plan then answers "unknown".
The layer specs are sized by harness.memory.vllm.vllm_kv_layout; vLLM's own functions check both
(harness/memory/vllm/vllm_kv_check.py, run in the vLLM venvs by tests/test_vllm_plan_layouts.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Callable

from ...errors import UsageError
from ..family.registry import family as family_entry
from .vllm_kv_layout import LayerSpec, align_hybrid_block_size

DTYPE_BYTES = {"float32": 4, "float": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2}
ATTENTION_KINDS = {"full_attention", "sliding_attention", "chunked_attention"}
# The layer_types values vLLM 0.31 / 0.32's model files switch on (their `layer_type == ...` tests
# and decoder-layer tables): a config naming anything else describes a layer vLLM does not have.
VLLM_LAYER_KINDS = ATTENTION_KINDS | {"linear_attention", "conv", "mamba", "attention", "hybrid", "moe", "sparse",
                                      "mlp"}


class Unmodelled(Exception):
    """A layer kind (or family) the rules do not cover: the plan says unknown, with this reason."""


@dataclass(frozen=True)
class Platform:
    """What the platform decides about the KV layout (read from vLLM's platforms/*.py)."""

    name: str  # cpu | cuda
    block_size: int  # default attention block: CPU 128, CUDA 16
    kernel_block: int  # the backend's smallest kernel block: CPU_ATTN MultipleOf(32), FlashAttention 16
    mla_block_size: int  # CPU: 16 for the reference MLA kernel, 128 with AMX; CUDA 16 (not read further)
    ssm_state_float32: bool  # CPU with AVX-512 BF16: the accelerated GDN/Mamba backend keeps SSM state in fp32


def cpu_platform(cpu_flags: set[str] | None = None) -> Platform:
    """The CPU build on this machine's CPU (or on one with the given /proc/cpuinfo flags)."""
    flags = cpu_flags if cpu_flags is not None else _cpu_flags()
    return Platform("cpu", 128, 32, 128 if "amx_tile" in flags else 16, "avx512_bf16" in flags)


CUDA = Platform("cuda", 16, 16, 16, False)


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@dataclass(frozen=True)
class Layer:
    kind: str  # full_attention | sliding_attention | chunked_attention | mla | mamba
    kv_heads: int = 0
    head_size: int = 0
    head_size_v: int = 0
    window: int | None = None
    shared: bool = False  # KV shared with an earlier layer: no spec of its own
    state: tuple[tuple[tuple[int, ...], str], ...] = ()  # mamba: (shape, "conv"|"ssm") per state tensor
    extra_pages: int = 0


@dataclass
class ModelLayout:
    family: str
    layers: list[Layer]
    notes: list[str]


def text_config(config: dict) -> dict:
    """The text model's config (a multimodal config's text_config), architectures kept."""
    inner = config.get("text_config")
    if isinstance(inner, dict):
        return {**inner, "architectures": config.get("architectures"), "quantization_config":
                config.get("quantization_config") or inner.get("quantization_config")}
    return config


LayoutFn = Callable[[dict], "list[Layer]"]
# layout name (what a registry entry's vllm_layout says) -> the function building a config's layers
LAYOUTS: dict[str, LayoutFn] = {}


def layout(fn: LayoutFn) -> LayoutFn:
    """Declare a layout function under its own name."""
    LAYOUTS[fn.__name__] = fn
    return fn


def _head_dim(c: dict) -> int:
    return int(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])


def _kv_heads(c: dict) -> int:
    return int(c.get("num_key_value_heads") or c["num_attention_heads"])


def _layer_types(c: dict, default: Callable[[int], str]) -> list[str]:
    n = int(c["num_hidden_layers"])
    types = c.get("layer_types")
    if types is None:
        return [default(i) for i in range(n)]
    if len(types) != n:
        raise UsageError(f"config: layer_types has {len(types)} entries but num_hidden_layers is {n}")
    odd = sorted({str(t) for t in types} - VLLM_LAYER_KINDS)
    if odd:
        raise UsageError(f"config: layer_types names {odd[0]!r}, a layer kind vLLM does not have "
                         f"(vLLM's model files know {', '.join(sorted(VLLM_LAYER_KINDS))})")
    return list(types)


def _attention(c: dict, kind: str, heads: int | None = None, head: int | None = None) -> Layer:
    h = head or _head_dim(c)
    if kind == "sliding_attention":
        return Layer(kind, heads or _kv_heads(c), h, h, window=int(c["sliding_window"]))
    if kind == "chunked_attention":
        return Layer(kind, heads or _kv_heads(c), h, h, window=int(c["attention_chunk_size"]))
    return Layer("full_attention", heads or _kv_heads(c), h, h)


def _only_attention(c: dict, types: list[str], family: str) -> list[Layer]:
    bad = sorted(set(types) - ATTENTION_KINDS)
    if bad:
        raise Unmodelled(f"{family}: layer kind {bad[0]!r} is not one the plan models")
    return [_attention(c, t) for t in types]


def dense(c: dict) -> list[Layer]:
    """Full attention in every layer; a model-level sliding window (Mistral-7B-v0.1) when the config
    has one and no layer_types (vLLM's CacheConfig.sliding_window: all layers sliding)."""
    window = c.get("sliding_window") if c.get("use_sliding_window", True) is not False else None
    if c.get("layer_types") is None:
        kind = "sliding_attention" if window else "full_attention"
        return [_attention(c, kind) for _ in range(int(c["num_hidden_layers"]))]
    types = _layer_types(c, lambda i: "full_attention")
    if all(t == "sliding_attention" for t in types) and not window:
        types = ["full_attention"] * len(types)
    return _only_attention(c, types, str(c.get("model_type")))


def interleaved(period: int) -> Callable[[dict], list[Layer]]:
    """Sliding layers with a global one every `period` layers (Gemma-3 6, OLMo-3 4, Gemma-2 2)."""
    def build(c: dict) -> list[Layer]:
        p = int(c.get("sliding_window_pattern") or c.get("_sliding_window_pattern") or period)
        types = _layer_types(c, lambda i: "full_attention" if (i + 1) % p == 0 else "sliding_attention")
        return _only_attention(c, types, str(c.get("model_type")))
    return build


@layout
def gpt_oss(c: dict) -> list[Layer]:
    """gpt_oss.py: sliding window on even layers, whatever layer_types says; sinks are a parameter
    of the attention, not a KV spec."""
    _layer_types(c, lambda i: "")  # a layer_types of the wrong length is still refused
    return [_attention(c, "sliding_attention" if i % 2 == 0 else "full_attention")
            for i in range(int(c["num_hidden_layers"]))]


@layout
def gemma4(c: dict) -> list[Layer]:
    """gemma4.py: full-attention layers use global_head_dim (and num_global_key_value_heads with
    attention_k_eq_v); the last num_kv_shared_layers layers read an earlier layer's KV: no spec."""
    n = int(c["num_hidden_layers"])
    types = _layer_types(c, lambda i: "full_attention" if (i + 1) % 6 == 0 or i == n - 1 else "sliding_attention")
    bad = sorted(set(types) - {"full_attention", "sliding_attention"})
    if bad:
        raise Unmodelled(f"gemma4: layer kind {bad[0]!r} is not one the plan models")
    first_shared = n - int(c.get("num_kv_shared_layers") or 0)
    global_heads = c.get("num_global_key_value_heads") if c.get("attention_k_eq_v") else None
    layers = []
    for i, t in enumerate(types):
        if t == "full_attention":
            layer = _attention(c, t, heads=int(global_heads or _kv_heads(c)), head=int(c.get("global_head_dim") or 512))
        else:
            layer = _attention(c, t)
        layers.append(Layer(**{**layer.__dict__, "shared": i >= first_shared}))
    return layers


@layout
def gated_deltanet(c: dict) -> list[Layer]:
    """qwen3_next.py / qwen3_5.py: Gated DeltaNet layers hold a conv state and a recurrent state
    per request (MambaStateShapeCalculator.gated_delta_net_state_shape), the others attention."""
    interval = int(c.get("full_attention_interval") or 4)
    types = _layer_types(c, lambda i: "full_attention" if (i + 1) % interval == 0 else "linear_attention")
    k_heads, v_heads = int(c["linear_num_key_heads"]), int(c["linear_num_value_heads"])
    k_dim, v_dim = int(c["linear_key_head_dim"]), int(c["linear_value_head_dim"])
    conv_dim = k_dim * k_heads * 2 + v_dim * v_heads
    state = (((int(c["linear_conv_kernel_dim"]) - 1, conv_dim), "conv"), ((v_heads, v_dim, k_dim), "ssm"))
    return [Layer("mamba", state=state) if t == "linear_attention" else _only_attention(c, [t], "gated deltanet")[0]
            for t in types]


@layout
def short_conv(c: dict) -> list[Layer]:
    """lfm2.py: short-conv layers hold (conv_L_cache - 1) x conv_dim per request. vLLM reads
    conv_dim from the config (transformers 5.2x no longer writes it: vLLM then fails to load)."""
    if "conv_dim" not in c:
        raise UsageError("config: LFM2 without conv_dim: vLLM's lfm2.py reads config.conv_dim (and block_dim), "
                         "which transformers 5.2x no longer writes; vLLM fails to build this model")
    types = _layer_types(c, lambda i: "full_attention" if i in (c.get("full_attn_idxs") or []) else "conv")
    state = (((int(c["conv_L_cache"]) - 1, int(c["conv_dim"])), "conv"),)
    return [Layer("mamba", state=state) if t == "conv" else _only_attention(c, [t], "lfm2")[0] for t in types]


MAMBA2_NAMES = {"mamba", "linear_attention"}


def _mamba2_state(heads: int, head_dim: int, groups: int, state_size: int, conv_kernel: int) -> tuple:
    """MambaStateShapeCalculator.mamba2_state_shape: conv (kernel - 1, inner + 2 x groups x state),
    SSM (heads, head_dim, state)."""
    conv = heads * head_dim + 2 * groups * state_size
    return (((conv_kernel - 1, conv), "conv"), ((heads, head_dim, state_size), "ssm"))


NEMOTRON_H_PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}


@layout
def nemotron_h(c: dict) -> list[Layer]:
    """nemotron_h.py: hybrid_override_pattern (transformers 5: layers_block_type) names each layer:
    'M' a Mamba-2 mixer (MambaMixer2, inner mamba_num_heads x mamba_head_dim), '*' attention, '-' MLP
    and 'E' MoE layers with no cache. The 0.32 Mamba-2 prefill checkpoint block applies (MambaMixer2)."""
    pattern = c.get("hybrid_override_pattern")
    if isinstance(pattern, str):
        odd = sorted(set(pattern) - set(NEMOTRON_H_PATTERN))
        if odd:
            raise UsageError(f"config: hybrid_override_pattern names {odd[0]!r}, a layer kind vLLM's nemotron_h.py "
                             f"does not have (it knows {''.join(NEMOTRON_H_PATTERN)})")
        types = [NEMOTRON_H_PATTERN[ch] for ch in pattern]
    else:
        types = c.get("layers_block_type") or c.get("layer_types")
        if not types:
            raise UsageError("config: nemotron_h needs 'hybrid_override_pattern' or 'layers_block_type'")
        types = _layer_types({**c, "layer_types": types, "num_hidden_layers": len(types)}, lambda i: "")
    state = _mamba2_state(int(c["mamba_num_heads"]), int(c["mamba_head_dim"]),
                          int(c.get("n_groups") or c.get("mamba_n_groups") or 8), int(c["ssm_state_size"]),
                          int(c.get("conv_kernel") or c.get("mamba_d_conv") or 4))
    out = []
    for t in types:
        if t in ("linear_attention", "mamba"):
            out.append(Layer("mamba", state=state, extra_pages=1))
        elif t in ("full_attention", "attention"):
            out.append(_attention(c, "full_attention"))
        elif t not in ("mlp", "moe"):
            raise Unmodelled(f"nemotron_h: layer kind {t!r} is not one the plan models")
    return out


@layout
def falcon_h1(c: dict) -> list[Layer]:
    """falcon_h1.py: every decoder layer runs attention and a Mamba-2 mixer (MambaMixer2) in parallel:
    one full-attention spec and one Mamba spec per layer. Missing fields take transformers'
    FalconH1Config defaults (d_ssm 1024, 128 heads of d_ssm / heads, state 256, 1 group, conv 4)."""
    n = int(c["num_hidden_layers"])
    d_ssm = c["mamba_d_ssm"] if "mamba_d_ssm" in c else 1024
    inner = int(d_ssm or int(c.get("mamba_expand") or 2) * int(c["hidden_size"]))
    heads = int(c.get("mamba_n_heads") or 128)
    head = c.get("mamba_d_head")
    head = inner // heads if head in (None, "auto") else int(head)
    state = _mamba2_state(heads, head, int(c.get("mamba_n_groups") or 1), int(c.get("mamba_d_state") or 256),
                          int(c.get("mamba_d_conv") or 4))
    layers = []
    for _ in range(n):
        layers += [_attention(c, "full_attention"), Layer("mamba", state=state, extra_pages=1)]
    return layers


@layout
def mamba2_hybrid(c: dict) -> list[Layer]:
    """granitemoehybrid.py: Mamba-2 layers (conv + SSM state, mamba2_state_shape) beside attention.
    In 0.32 a Mamba-2 layer keeps one more prefill checkpoint block in align mode."""
    types = _layer_types(c, lambda i: "linear_attention")
    groups, heads, state_size = int(c.get("mamba_n_groups") or 1), int(c["mamba_n_heads"]), int(c["mamba_d_state"])
    inner = int(c.get("mamba_expand") or 2) * int(c["hidden_size"])
    conv = inner + 2 * groups * state_size
    head_dim = int(c.get("mamba_d_head") or inner // heads)
    state = (((int(c.get("mamba_d_conv") or 4) - 1, conv), "conv"), ((heads, head_dim, state_size), "ssm"))
    out = []
    for t in types:
        if t in MAMBA2_NAMES:
            out.append(Layer("mamba", state=state, extra_pages=1))
        elif t in ("attention", "full_attention"):
            out.append(_attention(c, "full_attention"))
        else:
            raise Unmodelled(f"granitemoehybrid: layer kind {t!r} is not one the plan models")
    return out


@layout
def llama4(c: dict) -> list[Layer]:
    """llama4.py: a RoPE layer (no_rope_layers[i] == 1) uses ChunkedLocalAttention when the config has
    an attention_chunk_size, a NoPE layer (0) full attention. The defaults are transformers'
    Llama4TextConfig's: a NoPE layer every no_rope_layer_interval (4) layers, chunks of 8192."""
    n = int(c["num_hidden_layers"])
    interval = int(c.get("no_rope_layer_interval") or 4)
    rope = c.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
    if len(rope) < n:
        raise UsageError(f"config: no_rope_layers has {len(rope)} entries but num_hidden_layers is {n}")
    chunk = c["attention_chunk_size"] if "attention_chunk_size" in c else 8192
    return [_attention({**c, "attention_chunk_size": chunk}, "chunked_attention" if chunk and rope[i] else
                       "full_attention") for i in range(n)]


@layout
def mla(c: dict) -> list[Layer]:
    """deepseek_v2.py: multi-head latent attention caches one latent of kv_lora_rank +
    qk_rope_head_dim per token and layer (MLAAttentionSpec, one 'head', no separate V)."""
    head = int(c["kv_lora_rank"]) + int(c["qk_rope_head_dim"])
    return [Layer("mla", 1, head, 0) for _ in range(int(c["num_hidden_layers"]))]


for _period in (2, 4, 6):  # Gemma-2, OLMo-3 / Cohere-2, Gemma-3
    LAYOUTS[f"interleaved_{_period}"] = interleaved(_period)
# Config fields of layer kinds only a layout function reads: a family with none says why it is refused
SPECIAL_FIELDS = ("kv_lora_rank", "mamba_n_heads", "mamba_d_state", "linear_num_value_heads", "conv_L_cache",
                  "attention_chunk_size", "num_kv_shared_layers", "ssm_cfg")


def model_layout(config: dict) -> ModelLayout:
    c = text_config(config)
    family = str(c.get("model_type") or "")
    entry = family_entry(family)
    if entry is not None and entry.vllm_unmodelled:
        raise Unmodelled(f"{entry.vllm_unmodelled}: the plan does not model this layout")
    build = LAYOUTS[entry.vllm_layout] if entry is not None and entry.vllm_layout else None
    if build is None:
        odd = [k for k in SPECIAL_FIELDS if c.get(k)]
        if odd:
            raise Unmodelled(f"{family or 'this model'}: its config has {odd[0]}, a layer kind the plan does "
                             "not model for this family")
        build = dense
    try:
        layers = build(c)
    except KeyError as exc:
        raise UsageError(f"config: {family} needs {exc.args[0]!r}, which the config does not have") from None
    return ModelLayout(family or "dense", layers, [])


def layer_specs(layout: ModelLayout, *, act_dtype_bytes: int, kv_dtype_bytes: int, platform: Platform,
                mamba_cache_mode: str, ssm_dtype_bytes: int | None = None) -> dict[str, LayerSpec]:
    """Each layer's spec, as the model runner's get_kv_cache_spec returns them after the
    platform's hybrid block-size alignment (KV-sharing layers left out, as vLLM does)."""
    block = platform.mla_block_size if any(x.kind == "mla" for x in layout.layers) else platform.block_size
    ssm = ssm_dtype_bytes or (4 if platform.ssm_state_float32 else act_dtype_bytes)
    mamba = [x for x in layout.layers if x.kind == "mamba"]
    state_bytes = 0
    if mamba:
        state_bytes = sum(prod(shape) * (act_dtype_bytes if which == "conv" else ssm) for shape, which in mamba[0].state)
    attention = [x for x in layout.layers if x.kind != "mamba"]
    padded = None
    if mamba and attention:  # vLLM's is_hybrid: the first attention layer's page per token
        first = attention[0]
        per_token = first.kv_heads * (first.head_size + first.head_size_v) * kv_dtype_bytes
        block, padded = align_hybrid_block_size(per_token, state_bytes, block, platform.kernel_block)
    specs: dict[str, LayerSpec] = {}
    for i, x in enumerate(layout.layers):
        if x.shared:
            continue
        name = f"layers.{i}"
        if x.kind == "mamba":
            shapes = " + ".join("x".join(map(str, s)) for s, _ in x.state)
            specs[name] = LayerSpec("mamba", block, state_bytes=state_bytes, page_padded=padded,
                                    extra_pages=x.extra_pages if mamba_cache_mode == "align" else 0,
                                    detail=f"state {shapes}")
            continue
        kind = {"full_attention": "full", "sliding_attention": "sliding", "chunked_attention": "chunked",
                "mla": "mla"}[x.kind]
        per_token = x.kv_heads * (x.head_size + x.head_size_v) * kv_dtype_bytes
        specs[name] = LayerSpec(kind, block, bytes_per_token=per_token, window=x.window,
                                detail=f"{x.kv_heads} x {x.head_size}")
    return specs
