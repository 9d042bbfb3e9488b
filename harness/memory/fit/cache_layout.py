"""The generation cache layer by layer, as transformers' own cache classes hold it.

transformers builds the cache `generate` returns as `DynamicCache(config=...)`: one layer object a
decoder layer, its class picked by `cache_utils.get_layer_types_and_kwargs` from the config's
`layer_types` (or sliding_window / attention_chunk_size), with KV-sharing consumers (Gemma-4's
`kv_sharing_modes` "reuse") and attention-free blocks ("moe", "mlp") as DummyLayer. What each class
keeps (cache_utils, transformers 5.2x):
- DynamicLayer (full attention): keys and values grow by torch.cat, all tokens;
- DynamicSlidingWindowLayer (sliding and chunked attention): the cat of the past and the new
  tokens, then a view of its last `window - 1` tokens - a view keeps its whole storage, so after a
  prefill the layer holds every prompt token, after a decode step `min(total, window)` tokens;
- LinearAttentionLayer (Gated DeltaNet, short convolutions, Mamba-2): conv and recurrent states of
  a fixed size per sequence, plus an int64 token counter;
- LinearAttentionAndFullAttentionLayer / ...SlidingWindowAttentionLayer (Falcon-H1's hybrid
  blocks): both;
- DummyLayer: nothing.
A layout's per-token and per-sequence sizes come from the model itself: for the known dense
families from config fields (the same rule transformers applies), for the others from one forward
of the model on the meta device (`layout_from_meta`), reading the shapes and dtypes of what the
layers then hold. Bytes are the storages' (what the allocator holds), not the views' numel.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from ...errors import UsageError

# transformers' cache layer classes this layout models, by what they keep
FULL, SLIDING, STATE, NONE = "DynamicLayer", "DynamicSlidingWindowLayer", "LinearAttentionLayer", "DummyLayer"
HYBRID_FULL, HYBRID_SLIDING = "LinearAttentionAndFullAttentionLayer", "LinearAttentionAndSlidingWindowAttentionLayer"
MODELLED = (FULL, SLIDING, STATE, NONE, HYBRID_FULL, HYBRID_SLIDING)
COUNTER_BYTES = 8  # the int64 scalars a layer keeps (sliding window, linear-attention token count)
PROBE_TOKENS = 3  # the meta-device forward's prompt: any length below every window will do


@dataclass(frozen=True)
class CacheLayer:
    """One decoder layer's cache. `token_elems`: K and V elements a token adds per sequence, in the
    activation dtype; `state_elems`: fixed-size state elements per sequence in the activation dtype,
    `state_bytes` those kept in a dtype of their own (float32 states); `window`: the sliding or
    chunked window; `counter_bytes`: per-layer scalars (not per sequence)."""

    kind: str
    token_elems: int = 0
    window: int | None = None
    state_elems: int = 0
    state_bytes: int = 0
    counter_bytes: int = 0

    @property
    def attends(self) -> bool:
        return self.token_elems > 0


def _tokens_held(layer: CacheLayer, prompt: int, decode_steps: int) -> int:
    """Tokens of K/V storage a layer holds after a prefill of `prompt` and `decode_steps`
    one-token updates (the sliding view keeps its cat's whole storage)."""
    if layer.window is None or decode_steps == 0:
        return prompt + decode_steps
    return min(prompt + decode_steps, layer.window)


def layer_bytes(layer: CacheLayer, act_bytes: int, batch: int, prompt: int, decode_steps: int = 0) -> int:
    kv = layer.token_elems * act_bytes * batch * _tokens_held(layer, prompt, decode_steps) if layer.attends else 0
    return kv + batch * (layer.state_elems * act_bytes + layer.state_bytes) + layer.counter_bytes


def cache_bytes(layout: tuple[CacheLayer, ...], act_bytes: int, batch: int, prompt: int, decode_steps: int = 0) -> int:
    """Bytes of the cache after a prefill of `prompt` tokens and `decode_steps` decode steps: what
    `generate(prompt, max_new_tokens=n)` returns with decode_steps = n - 1 (the last token is
    never fed back)."""
    return sum(layer_bytes(layer, act_bytes, batch, prompt, decode_steps) for layer in layout)


def summary(layout: tuple[CacheLayer, ...]) -> dict[str, int]:
    """Layers by the transformers class that holds them."""
    out: dict[str, int] = {}
    for layer in layout:
        out[layer.kind] = out.get(layer.kind, 0) + 1
    return out


def layout_from_config(config: dict, layers: int, kv_heads: int, head_dim: int,
                       window: int | None) -> tuple[CacheLayer, ...]:
    """The known dense families: transformers' rule read from the fields (layer_types, else a
    sliding_window makes every layer sliding), every attention layer 2 x kv_heads x head_dim a token."""
    types = config.get("layer_types")
    if not (isinstance(types, list) and len(types) == layers):
        family = str(config.get("model_type") or "")
        if family == "gemma2":
            types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
        elif family in ("gemma3_text", "gemma3"):
            pattern = int(config.get("sliding_window_pattern") or 6)
            types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
        else:
            types = ["sliding_attention" if window else "full_attention"] * layers
    per_token = 2 * kv_heads * head_dim
    out = []
    for t in types:
        if t == "sliding_attention" and window:
            out.append(CacheLayer(SLIDING, per_token, window=window, counter_bytes=COUNTER_BYTES))
        elif t in ("full_attention", "sliding_attention"):
            out.append(CacheLayer(FULL, per_token))
        else:
            raise UsageError(f"layer type {t!r} of a {config.get('model_type')} config is not modelled")
    return tuple(out)


def _storage_elems(t) -> int:
    return t.untyped_storage().nbytes() // t.element_size()


def layout_from_meta(model, family: str) -> tuple[CacheLayer, ...]:
    """Run the model's forward once on the meta device (batch 1, PROBE_TOKENS tokens, use_cache) and
    read what each of the returned cache's layers holds. `model`: built on the meta device."""
    import torch

    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.bfloat16)
    ids = torch.zeros((1, PROBE_TOKENS), dtype=torch.long, device="meta")
    try:
        with torch.no_grad(), _quiet_transformers():
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            cache = out.get("cache", out.get("past_key_values"))  # (5.2x renamed it; the old name warns)
    except Exception as exc:  # noqa: BLE001 - any failure of the modeling code is a refusal
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"model_type {family!r}: its forward cannot run on the meta device to read the cache "
                         f"layout ({type(exc).__name__}: {first[:200]})") from None
    if cache is None or not hasattr(cache, "layers"):
        raise UsageError(f"model_type {family!r}: its forward returns no transformers Cache to read the layout from")
    return tuple(_layer_from_object(layer, i, family, dtype) for i, layer in enumerate(cache.layers))


@contextmanager
def _quiet_transformers():
    """The reference-path notices (no flash-linear-attention, causal-conv1d, mamba_ssm here) and
    deprecation warnings the probe would print: the estimate says which path it models instead."""
    import warnings

    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.set_verbosity(level)


def _layer_from_object(layer, index: int, family: str, dtype) -> CacheLayer:
    import torch

    kind = type(layer).__name__
    if kind not in MODELLED:
        raise UsageError(f"model_type {family!r}: cache layer {index} is a {kind}, a layer kind the estimate does not "
                         f"model (it models {', '.join(MODELLED)})")
    token = state = fixed = counters = 0
    seen: set[int] = set()
    keys = getattr(layer, "keys", None)
    if isinstance(keys, torch.Tensor) and keys.dim() == 4:
        for t in (keys, getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor) and id(t) not in seen:
                seen.add(id(t))
                token += t.numel() // max(t.shape[-2], 1)
    for name in ("conv_states", "recurrent_states"):
        for t in (getattr(layer, name, None) or {}).values():
            if isinstance(t, torch.Tensor):
                if t.dtype == dtype:
                    state += _storage_elems(t)
                else:
                    fixed += t.untyped_storage().nbytes()
    for name in ("_sliding_window_tensor", "cumulative_length_linear"):
        t = getattr(layer, name, None)
        if isinstance(t, torch.Tensor):
            counters += t.numel() * t.element_size()
    window = getattr(layer, "sliding_window", None) if getattr(layer, "is_sliding", False) else None
    return CacheLayer(kind, token, window=int(window) if window else None, state_elems=state, state_bytes=fixed,
                      counter_bytes=counters)


def real_cache_bytes(cache) -> int:
    """The truth: bytes of the storages a transformers Cache's layers hold (each storage once),
    keys, values, conv and recurrent states and the layers' scalar counters."""
    import torch

    seen: dict[tuple, int] = {}

    def add(t):
        if isinstance(t, torch.Tensor):
            s = t.untyped_storage()
            seen[(t.device.type, s.data_ptr(), id(s) if s.data_ptr() == 0 else 0)] = s.nbytes()

    for layer in cache.layers:
        for value in vars(layer).values():
            if isinstance(value, dict):
                for v in value.values():
                    add(v)
            else:
                add(value)
    return sum(seen.values())
