"""The gate's noise model on disk: the spread of the blocks' log ratios per metric, measured by a
gate on this machine with this workload, and how many blocks a 10% threshold needs here at that
spread. The next gate with the same machine and workload reads it to plan its first look; a file
from another machine or workload is ignored, and the gate says so."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from . import gate_metrics as gm
from . import results
from .sequential import Rule, blocks_for

KIND = "harness-gate-noise"


def _key(cfg) -> dict:
    m = results.machine()
    w = cfg.workload
    return {"machine": {"cpu_model": m.get("cpu_model"), "cpu_count": m.get("cpu_count")},
            "workload": {"input_len": w.input_len, "output_len": w.output_len, "num_prompts": w.num_prompts,
                         "prefix_len": w.prefix_len, "api": w.api, "concurrency": cfg.concurrency}}


def read(path: Path, cfg) -> tuple[dict[str, float], str]:
    """(metric -> spread, a line for the table); ({}, why) when there is none to use."""
    path = Path(path)
    if not path.is_file():
        return {}, f"noise model: none yet at {path} (this gate writes one)"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}, f"noise model: {path} is not readable JSON; not used"
    if not isinstance(data, dict) or data.get("kind") != KIND:
        return {}, f"noise model: {path} is not a gate noise model; not used"
    key = _key(cfg)
    for part in ("machine", "workload"):
        if data.get(part) != key[part]:
            return {}, f"noise model: {path} was measured with another {part}; not used"
    spreads = {k: float(v) for k, v in (data.get("spread") or {}).items()
               if k in gm.BY_NAME and isinstance(v, (int, float)) and math.isfinite(v) and v >= 0}
    return spreads, f"noise model: {path} ({data.get('blocks')} blocks, {data.get('written')})"


def blocks_at(spreads: dict[str, float], share: float, rule: Rule) -> dict[str, int | None]:
    """Per metric, the blocks an A/A gate needs to end OK at a threshold of `share` here."""
    return {name: blocks_for(s, gm.worse_log_threshold(gm.BY_NAME[name], share), rule) for name, s in spreads.items()}


def write(path: Path, cfg, result) -> str:
    spreads = result.gate.spreads()
    if not spreads:
        return "noise model: not written (fewer than 2 blocks)"
    same = cfg.baseline.target.base_url == cfg.candidate.target.base_url
    data = {"kind": KIND, "version": 1, **_key(cfg), "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "blocks": result.gate.blocks, "a_a": same,
            "spread": {k: round(v, 6) for k, v in spreads.items()},
            "blocks_for_10_percent": blocks_at(spreads, 0.10, Rule(max_blocks=cfg.rule.max_blocks)),
            "what": "spread: the standard deviation of the blocks' log(candidate / baseline) per metric; "
                    "blocks_for_10_percent: the blocks an A/A gate needs to end OK at a 10% threshold here"}
    results.write_atomic(Path(path), data)
    worst = max((n for n in data["blocks_for_10_percent"].values() if n is not None), default=None)
    return f"noise model saved to {path}" + (f": a 10% threshold needs about {worst} blocks here" if worst else "")
