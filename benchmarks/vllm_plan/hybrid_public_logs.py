"""Published start-up logs of hybrid (Gated DeltaNet + attention) models, against the plan's KV
layout rules: given the log's "Available KV cache memory" (2 decimals, so a range of bytes), the
blocks, tokens and max concurrency the rules give, beside what vLLM logged. The logs are from
vLLM 0.24.0 (older than the 0.31/0.32 rules were read from): the 0.32 rules are applied to them,
and what matches says the GDN layout did not change in between.

    .venv/bin/python benchmarks/vllm_plan/hybrid_public_logs.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.atomic import write_json  # noqa: E402
from harness.memory.vllm.vllm_kv_families import CUDA  # noqa: E402
from harness.memory.vllm.vllm_kv_rules import plan_kv  # noqa: E402

GiB = 1024**3
# Qwen3.5/3.6-35B-A3B's text model as recalled (no hub here): 40 layers, 3 GDN : 1 full attention,
# 2 KV heads of 256, GDN 16 key / 32 value heads of 128, SSM state kept in float32 (mamba_ssm_dtype).
QWEN35_35B_A3B = {"model_type": "qwen3_5_moe_text", "num_hidden_layers": 40, "hidden_size": 2048,
                  "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "linear_num_key_heads": 16,
                  "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                  "linear_conv_kernel_dim": 4, "full_attention_interval": 4, "mamba_ssm_dtype": "float32"}
LOGS = [
    {"id": "club-3090-612", "url": "https://github.com/noonghunna/club-3090/issues/612", "vllm": "0.24.0",
     "model": "Qwen3.6-35B-A3B NVFP4 (modelopt), kv fp8, RTX 5090", "config": QWEN35_35B_A3B,
     "max_model_len": 131072, "max_num_batched_tokens": 8192, "kv_dtype_bytes": 1,
     "available_gib": 5.98, "logged_tokens": 567978, "logged_concurrency": 4.33},
    {"id": "club-3090-652", "url": "https://github.com/noonghunna/club-3090/issues/652", "vllm": "0.24.0",
     "model": "Qwen3.6-35B-A3B NVFP4 (modelopt), kv fp8, RTX 5090", "config": QWEN35_35B_A3B,
     "max_model_len": 131072, "max_num_batched_tokens": 8192, "kv_dtype_bytes": 1,
     "available_gib": 6.01, "logged_tokens": 569878, "logged_concurrency": 4.35},
]
OUT = ROOT / "measurements" / "vllm_plan" / "hybrid_public_logs.json"


def main() -> int:
    rows = []
    for log in LOGS:
        preds = []
        for gib in (log["available_gib"] - 0.005, log["available_gib"] + 0.005):
            p = plan_kv(log["config"], (0, 32, 0), platform=CUDA, available_bytes=int(gib * GiB),
                        max_model_len=log["max_model_len"], max_num_batched_tokens=log["max_num_batched_tokens"],
                        act_dtype_bytes=2, kv_dtype_bytes=log["kv_dtype_bytes"], max_concurrent_batches=2)
            preds.append((p.sizing.num_blocks, p.sizing.kv_cache_tokens, round(p.sizing.max_concurrency, 2),
                          p.block_size))
        row = {**{k: v for k, v in log.items() if k != "config"}, "predicted_blocks": sorted({x[0] for x in preds}),
               "predicted_tokens": sorted({x[1] for x in preds}),
               "predicted_concurrency": sorted({x[2] for x in preds}), "block_size": preds[0][3]}
        row["concurrency_matches"] = log["logged_concurrency"] in row["predicted_concurrency"]
        row["tokens_off_by"] = min(abs(t - log["logged_tokens"]) for t in row["predicted_tokens"])
        rows.append(row)
        print(f"{log['id']} (vLLM {log['vllm']}, {log['model']}): available {log['available_gib']} GiB -> "
              f"blocks {row['predicted_blocks']} of {row['block_size']} tokens, tokens {row['predicted_tokens']}, "
              f"{row['predicted_concurrency']}x; logged {log['logged_tokens']:,} tokens {log['logged_concurrency']}x "
              f"(tokens off by {row['tokens_off_by']})")
    write_json(OUT, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
