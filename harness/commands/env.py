"""`python -m harness env [--json]`: what this machine's stack is, and whether a GPU is usable.

Prints the probe (driver, CUDA, torch, packages, vLLM), the GPU readiness and the rule checks that
need no GPU work. Always exits 0: it reports; `pytest suites/hw` is the check that fails.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    from ..settings import DEFAULT_VLLM_VENV

    parser.add_argument("--vllm-python", default=None,
                        help=f"python of the venv holding vLLM (default: {DEFAULT_VLLM_VENV}/bin/python)")


def run(args) -> int:
    from .. import env as env_mod
    from .. import settings as settings_mod
    from ..hw.static import static_checks

    root = Path(__file__).resolve().parents[2]
    # The default vLLM venv lives beside the source tree (the README's set-up puts it there).
    settings = settings_mod.resolve({"vllm_python": args.vllm_python}, root=root)
    environment = env_mod.probe_environment(settings.vllm_python)
    readiness = env_mod.gpu_readiness(environment)
    checks = static_checks(environment, os.environ.get("CUDA_VISIBLE_DEVICES"))
    if args.json:
        print(json.dumps({"environment": environment.to_dict(),
                          "readiness": {"state": readiness.state, "reason": readiness.reason},
                          "checks": [c.to_dict() for c in checks]}, indent=2, default=str))
        return 0
    out = sys.stdout
    out.write(env_mod.header_line(environment) + "\n")
    out.write(f"GPU readiness: {readiness.state}: {readiness.reason}\n")
    for g in environment.nvml.gpus:
        cc = f"{g.compute_capability[0]}.{g.compute_capability[1]}" if g.compute_capability else "?"
        out.write(f"  GPU{g.index}: {g.name}, capability {cc}, {g.memory_free / 2**30:.1f} of "
                  f"{g.memory_total / 2**30:.1f} GiB free, {g.pci_bus_id or ''}\n")
    if environment.torch.arch_list:
        out.write(f"torch arch list: {' '.join(environment.torch.arch_list)}\n")
    if environment.vllm.error:
        out.write(f"vLLM: {environment.vllm.error}\n")
    for c in checks:
        out.write(c.line() + "\n")
    return 0
