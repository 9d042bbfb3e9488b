"""The vLLM plan against published start-up logs (tests/data/vllm_logs/*.json).

Each record holds what the log says about the run (card, vLLM version, engine, flags, model config)
and what vLLM logged (KV cache tokens or GPU blocks, whether it started). `check(record)` turns the
inputs into a VllmQuery, predicts, and returns the comparison; nothing from the logged outcome is
used as an input, except the weights of checkpoints the config cannot describe (`weights_from_log`).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from ..fit.gpus import GPUS, GiB, Gpu
from .vllm_plan import VllmPlan, plan
from .vllm_query import VllmQuery
from .vllm_model import model_facts

_FACTS_CACHE: dict[str, object] = {}


@dataclass
class LogCheck:
    id: str
    gpu: str
    model: str
    version: str
    engine: str
    predicted_tokens: int
    logged_tokens: int
    predicted_starts: bool
    logged_started: bool
    plan: VllmPlan

    @property
    def error(self) -> float:
        """Relative error of the predicted KV tokens."""
        return (self.predicted_tokens - self.logged_tokens) / self.logged_tokens

    def as_row(self) -> dict:
        return {"id": self.id, "gpu": self.gpu, "model": self.model, "vllm": self.version, "engine": self.engine,
                "predicted_tokens": self.predicted_tokens, "logged_tokens": self.logged_tokens,
                "error_pct": round(100 * self.error, 2), "predicted_starts": self.predicted_starts,
                "logged_started": self.logged_started, "regime": self.plan.settings.get("regime")}


def load_records(directory: str | Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(directory).glob("*.json"))]


def _facts(spec: str, base: Path):
    path = base / spec if spec.startswith("configs/") else spec
    key = str(path)
    if key not in _FACTS_CACHE:
        _FACTS_CACHE[key] = model_facts(str(path))
    return _FACTS_CACHE[key]


def query_for(record: dict) -> VllmQuery:
    gpu_info = record["gpu"]
    table = GPUS.get(gpu_info.get("table") or "")
    cc = tuple(gpu_info.get("compute_capability") or (table.compute_capability if table else (8, 0)))
    gpu = Gpu(gpu_info["name"], int(round(gpu_info["total_gib"] * GiB)), cc, gpu_info.get("total_from", ""))
    flags = dict(record["flags"])
    weights = None
    if record.get("weights_from_log"):
        weights = int(round(record["logged"]["weights_gib"] * GiB))
    return VllmQuery(
        gpu=gpu, gpu_memory_utilization=flags.pop("gpu_memory_utilization"),
        max_model_len=flags.pop("max_model_len"), weights_bytes=weights, vllm_version=record["vllm_version"],
        engine=record.get("engine"), entrypoint=record.get("entrypoint", "serve"),
        other_process_bytes=int(round(record.get("other_process_gib", 0) * GiB)),
        flashinfer_sampler=bool(record.get("flashinfer_sampler", False)), **flags)


def check(record: dict, base: str | Path) -> LogCheck:
    facts = _facts(record["model"]["config"], Path(base))
    result = plan(facts, query_for(record), search=False)
    logged = record["logged"]
    return LogCheck(record["id"], record["gpu"]["name"], record["model"]["name"], record["vllm_version"],
                    result.settings["engine"], result.kv_cache_tokens, int(logged["kv_cache_tokens"]),
                    result.starts, bool(logged["started"]), result)


def summary(checks: list[LogCheck]) -> dict:
    errors = [abs(c.error) for c in checks]
    return {
        "logs": len(checks),
        "gpus": sorted({c.gpu for c in checks}),
        "models": sorted({c.model for c in checks}),
        "versions": sorted({c.version for c in checks}, key=lambda v: [int(x) if x.isdigit() else 0
                                                                     for x in v.replace("post", ".").split(".")]),
        "median_abs_error_pct": round(100 * statistics.median(errors), 2),
        "worst_abs_error_pct": round(100 * max(errors), 2),
        "worst_log": max(checks, key=lambda c: abs(c.error)).id,
        "starts_matched": sum(c.predicted_starts == c.logged_started for c in checks),
    }


def check_gpu_startup(record: dict) -> LogCheck:
    """A start-up measured on a GPU by benchmarks/vllm_plan/gpu_startups.py: the plan for its flags
    on the card as CUDA reported it, from the model's config.json and stored tensor bytes, against
    what vLLM logged. A refused start has 0 logged tokens."""
    from dataclasses import replace as _replace

    from .vllm_servers import gpu_query

    facts = _replace(model_facts(record["model_config"]), stored_weights_bytes=record.get("stored_weights_bytes"),
                     name=record["model"])
    gpu = Gpu(record.get("gpu_name", "H200"), int(record["cuda_total_bytes"]),
              tuple(record.get("compute_capability", (9, 0))), "cuda")
    version = record["logged"].get("vllm_version") or record.get("vllm_version", "0.26.0")
    result = plan(facts, gpu_query(facts, record["flags"], gpu, version), search=False)
    logged = record["logged"].get("kv_cache_tokens") or 0
    return LogCheck(record["id"], gpu.name, record["model"], version, result.settings["engine"],
                    result.kv_cache_tokens, int(logged), result.starts, record["outcome"] == "started", result)
