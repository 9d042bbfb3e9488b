"""The rule checks that need no GPU work, run over a probed Environment (for `harness env`)."""

from __future__ import annotations

from harness import env as env_mod

from . import compat
from .result import CheckResult, combine


def static_checks(environment: env_mod.Environment, cuda_visible_devices: str | None) -> list[CheckResult]:
    n, t = environment.nvml, environment.torch
    out = [compat.check_driver(n.driver_version, n.cuda_driver_version, len(n.gpus), n.reason,
                               environment.driver_evidence, environment.pci_gpus)]
    if not environment.driver_present:
        return out
    diagnosis = None if t.cuda_available else env_mod.diagnose_torch_cuda(environment)
    out.append(compat.check_cuda_compat(n.driver_version, n.cuda_driver_version, t.version, t.cuda_build))
    out.append(compat.check_torch_build(t.version, t.cuda_build, True, t.cuda_available, t.init_error, diagnosis))
    out.append(compat.check_visibility([(g.name, g.uuid) for g in n.gpus], [d.name for d in t.devices],
                                       cuda_visible_devices))
    for rule, name in ((lambda d: compat.check_arch(d.capability, t.arch_list, t.version, _label(d)), "arch_list"),
                       (lambda d: compat.check_bf16(d.capability, _label(d)), "bf16"),
                       (lambda d: compat.check_vllm_capability(d.capability, environment.vllm.version, _label(d)),
                        "vllm_capability")):
        if t.devices:
            out.append(combine(name, [rule(d) for d in t.devices]))
    return out


def _label(d) -> str:
    return f"GPU{d.index} ({d.name})"
