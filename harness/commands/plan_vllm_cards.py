"""`plan --engine vllm --sweep --gpu-memory 6GB,8GB,...` (a comma list of cards or sizes): for each
card, the longest --max-model-len that starts and the max concurrency vLLM would log at 8192 tokens
(or at that longest length when shorter). A report: exit 0."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from ..errors import UsageError

AT_TOKENS = 8192


def card_cell(facts, query, plan) -> dict:
    """What one card gives: yes (longest length, concurrency at AT_TOKENS), no, or unknown."""
    limit = facts.max_len_limit or facts.max_position
    full = plan(facts, replace(query, max_model_len=limit))
    if full.verdict == "unknown":
        return {"verdict": "unknown", "reason": full.reason}
    longest = limit if full.starts else full.largest_max_model_len
    if not longest:
        return {"verdict": "no", "reason": full.reason.split(";")[0]}
    at = min(AT_TOKENS, longest)
    p = plan(facts, replace(query, max_model_len=at), search=False)
    return {"verdict": "yes", "longest_max_model_len": longest, "at": at, "max_concurrency": p.max_concurrency,
            "kv_cache_tokens": p.kv_cache_tokens}


def run_cards(args: argparse.Namespace, queries_of, model_facts, plan) -> int:
    facts = model_facts(args.config)
    cells = {}
    for spec in args.gpu_memory.split(","):
        args_c = argparse.Namespace(**{**vars(args), "gpu_memory": spec, "sweep": False,
                                       "max_model_len": str(AT_TOKENS)})
        queries = queries_of(args_c)
        if len(queries) != 1:
            raise UsageError("--sweep over cards takes one precision (one --quantization, one --kv-cache-dtype)")
        cells[spec] = {"gpu": queries[0][3].gpu.name, **card_cell(facts, queries[0][3], plan)}
    if args.json:
        print(json.dumps({"model": facts.name, "at_tokens": AT_TOKENS, "cards": cells}, indent=1))
        return 0
    print(f"{facts.name}: longest --max-model-len that starts / max concurrency at {AT_TOKENS} tokens "
          "(or at the longest when shorter), per card")
    for spec, c in cells.items():
        text = (f"{c['longest_max_model_len']:,} / {c['max_concurrency']:.1f}x at {c['at']:,}" if c["verdict"] == "yes"
                else f"{c['verdict']}: {c['reason']}")
        print(f"  {spec:>14s} ({c['gpu']}): {text}")
    print(f"cards: {sum(c['verdict'] == 'yes' for c in cells.values())} of {len(cells)} start it")
    return 0
