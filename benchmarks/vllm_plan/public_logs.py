"""The vLLM memory plan against the published start-up logs in tests/data/vllm_logs/, plus the
seeds' cases (Qwen2.5 1.5B / 7B AWQ on a 6 GB card): a table on the terminal and
reports/vllm_plan/public_logs.json.

    python benchmarks/vllm_plan/public_logs.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.atomic import write_json  # noqa: E402
from harness.memory.vllm import vllm_logcheck as L  # noqa: E402
from harness.memory.fit.gpus import GiB, resolve_gpu  # noqa: E402
from harness.memory.vllm.vllm_plan import plan  # noqa: E402
from harness.memory.vllm.vllm_query import VllmQuery  # noqa: E402
from harness.memory.vllm.vllm_model import model_facts  # noqa: E402

DATA = ROOT / "tests" / "data" / "vllm_logs"
OUT = ROOT / "reports" / "vllm_plan" / "public_logs.json"


def seeds_cases() -> list[dict]:
    """Qwen2.5-1.5B-Instruct-AWQ and Qwen2.5-7B-Instruct-AWQ on a 6 GB card, utilization 0.92,
    max-model-len 2048: a headless RTX 3060 Laptop 6GB, and the same card with a desktop (0.3 GiB)."""
    rows = []
    for config in ("qwen2.5-1.5b-instruct-awq", "qwen2.5-7b-instruct-awq"):
        facts = model_facts(str(DATA / "configs" / f"{config}.json"))
        for version in ("0.32", "0.10", "0.8.5"):
            for others in (0, int(0.3 * GiB)):
                q = VllmQuery(gpu=resolve_gpu("rtx-3060-6gb"), gpu_memory_utilization=0.92, max_model_len=2048,
                              vllm_version=version, other_process_bytes=others)
                p = plan(facts, q)
                rows.append({"model": config, "vllm": version, "desktop_gib": round(others / GiB, 2), **p.as_dict()})
        if config.endswith("7b-instruct-awq"):
            # the most a 6 GB card gets out of it: V0 (no free-memory check), fp8 KV, 8 sequences,
            # 512 batched tokens, no CUDA graphs, utilization at the edge of the CUDA context
            q = VllmQuery(gpu=resolve_gpu("rtx-3060-6gb"), gpu_memory_utilization=0.93, max_model_len=2048,
                          vllm_version="0.8.5", kv_cache_dtype="fp8", max_num_seqs=8, max_num_batched_tokens=512,
                          enforce_eager=True)
            rows.append({"model": config + " (V0, fp8 KV, 8 seqs x 512, eager, 0.93)", "vllm": "0.8.5",
                         "desktop_gib": 0, **plan(facts, q).as_dict()})
    return rows


def main() -> int:
    checks = [L.check(r, DATA) for r in L.load_records(DATA)]
    summary = L.summary(checks)
    print(f"{'log':52s} {'vLLM':11s} {'engine':6s} {'pred tokens':>12s} {'logged':>12s} {'error':>7s}  starts")
    for c in sorted(checks, key=lambda c: c.id):
        print(f"{c.id:52s} {c.version:11s} {c.engine:6s} {c.predicted_tokens:12,d} {c.logged_tokens:12,d} "
              f"{100 * c.error:+6.2f}%  {c.predicted_starts}/{c.logged_started}")
    print(f"\n{summary['logs']} logs, {len(summary['gpus'])} cards, {len(summary['models'])} models, "
          f"{len(summary['versions'])} versions ({summary['versions'][0]} .. {summary['versions'][-1]}): "
          f"median |error| {summary['median_abs_error_pct']}%, worst {summary['worst_abs_error_pct']}% "
          f"({summary['worst_log']}); starts matched {summary['starts_matched']}/{summary['logs']}")
    seeds = seeds_cases()
    print("\nSeeds' cases: RTX 3060 Laptop 6GB (5.80 GiB), utilization 0.92, max-model-len 2048")
    for r in seeds:
        line = (f"  {r['model']:42s} vLLM {r['vllm']:5s} desktop {r['desktop_gib']:.1f} GiB: "
                f"weights {r['weights_bytes'] / GiB:.2f}, activation {r['activation_bytes'] / GiB:.2f}, "
                f"non-torch {r['non_torch_bytes'] / GiB:.2f}, graphs {r['cuda_graph_bytes'] / GiB:.2f} "
                f"-> KV {r['kv_cache_bytes'] / GiB:.2f} GiB = {r['kv_cache_tokens']:,} tokens, "
                f"{r['max_concurrency']:.1f}x")
        print(line + ("" if r["starts"] == "yes" else f"\n      does not start: {r['reason']}"))
    write_json(OUT, {"summary": summary, "logs": [c.as_row() for c in checks], "seeds": seeds})
    print(f"\nwritten: {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
