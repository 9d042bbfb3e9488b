"""Why the plan's KV tokens differ between two vLLM releases: the layout rules' `changes` line of
the newer release (harness.memory.vllm.vllm_kv_rules) when the KV layout moved, else the memory term
that moved (vLLM's accounting regime). Read by `plan --engine vllm --vllm-version A,B` and by the
upgrade rehearsal (harness/serving/upgrade_kv.py)."""

from __future__ import annotations

TERMS = (("weights_bytes", "weights"), ("activation_bytes", "activation peak"), ("non_torch_bytes", "non-torch"),
         ("cuda_graph_bytes", "CUDA graphs"), ("kv_cache_bytes", "KV cache memory"))


def cause(a, b, va: str, vb: str) -> str:
    """Why the KV tokens differ between plan a (version va) and plan b (vb)."""
    from .vllm_kv_rules import rules_for
    from .vllm_query import parse_version

    reasons = []
    moved = [label for key, label in TERMS[:-1] if getattr(a, key) != getattr(b, key)]
    if moved:
        regimes = (a.settings.get("regime"), b.settings.get("regime"))
        how = f" ({regimes[0]} -> {regimes[1]} accounting)" if regimes[0] != regimes[1] else ""
        reasons.append(f"vLLM's memory accounting moved: {', '.join(moved)}{how}")
    if a.kv_groups != b.kv_groups or a.kv_bytes_per_token != b.kv_bytes_per_token:
        newer = max((va, vb), key=parse_version)
        rules = rules_for(parse_version(newer))
        reasons.append(f"the KV layout changed in {newer}: {rules.changes if rules else 'per-layer specs differ'}")
    if not reasons and (a.kv_cache_tokens, a.max_concurrency) != (b.kv_cache_tokens, b.max_concurrency):
        reasons.append("token accounting of the same blocks (logged tokens = concurrency x max_model_len)")
    return "; ".join(reasons) or "no change in vLLM's KV accounting between these releases"
