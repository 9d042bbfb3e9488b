"""`plan --engine vllm --vllm-version A,B`: the plan at two vLLM releases side by side, what moved
and why (an upgrade rehearsal before the upgrade). The cause of a KV delta is the layout rules'
`changes` line of the newer release (harness.memory.vllm.vllm_kv_rules) when the layout moved, else the
memory term that moved (weights, activation, non-torch, CUDA graphs: vLLM's accounting regime)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from ..errors import UsageError

from ..memory.vllm.vllm_upgrade_cause import TERMS, cause


def run_versions(args: argparse.Namespace, queries_of, model_facts, plan) -> int:
    versions = args.vllm_version.split(",")
    if len(versions) != 2:
        raise UsageError(f"--vllm-version: {args.vllm_version!r}: give one version, or two (A,B) to compare")
    facts = model_facts(args.config)
    plans = []
    for version in versions:
        args_v = argparse.Namespace(**{**vars(args), "vllm_version": version})
        queries = queries_of(args_v)
        if len(queries) != 1:
            raise UsageError("--vllm-version A,B compares one setting: give one --max-model-len, one precision")
        plans.append(plan(facts, replace(queries[0][3], vllm_version=version), search=False))
    a, b = plans
    why = cause(a, b, *versions)
    delta = b.kv_cache_tokens - a.kv_cache_tokens
    pct = f"{100 * delta / a.kv_cache_tokens:+.1f}%" if a.kv_cache_tokens else "n/a"
    if args.json:
        print(json.dumps({"versions": versions, "plans": [p.as_dict() for p in plans],
                          "delta_kv_cache_tokens": delta, "delta_pct": pct, "cause": why}, indent=1))
    else:
        rows = [("starts", *(p.verdict for p in plans)),
                *[(label, *(f"{getattr(p, key) / 1024**3:.2f} GiB" for p in plans)) for key, label in TERMS],
                ("KV blocks", *(f"{p.num_blocks:,} x {p.block_size}" for p in plans)),
                ("KV cache tokens", *(f"{p.kv_cache_tokens:,}" for p in plans)),
                ("max concurrency", *(f"{p.max_concurrency:.2f}x" for p in plans))]
        print(f"{facts.name}: vLLM {versions[0]} against {versions[1]}, max-model-len {a.max_model_len}")
        print(f"  {'':18s} {versions[0]:>16s} {versions[1]:>16s}")
        for label, x, y in rows:
            print(f"  {label:18s} {x:>16s} {y:>16s}")
        print(f"  delta: {delta:+,} KV tokens ({pct}); cause: {why}")
        for p, v in zip(plans, versions):
            if p.verdict != "yes":
                print(f"  {v}: {p.verdict} — {p.reason}")
        verdicts = ", ".join(f"{v} {p.verdict}" for v, p in zip(versions, plans))
        print(f"starts: {verdicts}")
    return 0 if all(p.verdict == "yes" for p in plans) else 1
