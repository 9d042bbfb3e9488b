"""The machine line of a report, read back from a results file's `environment` (harness.env's
probe as a dict), so a report re-renders from its JSON alone."""

from __future__ import annotations

from typing import Any

from .. import env as env_mod
from ..pci import from_dicts as pci_from_dicts


def environment(data: dict[str, Any]) -> env_mod.Environment:
    """harness.env.Environment from its to_dict() form (missing fields take their defaults)."""
    nvml = dict(data.get("nvml") or {"available": False})
    nvml["gpus"] = [env_mod.NvmlGpu(**g) for g in nvml.get("gpus") or []]
    torch = dict(data.get("torch") or {"version": None})
    torch["devices"] = [env_mod.TorchDevice(**d) for d in torch.get("devices") or []]
    return env_mod.Environment(
        nvml=env_mod.NvmlProbe(**nvml),
        torch=env_mod.TorchProbe(**torch),
        packages=dict(data.get("packages") or {}),
        vllm=env_mod.VllmProbe(**(data.get("vllm") or {"python": None})),
        driver_evidence=list(data.get("driver_evidence") or []),
        pci_gpus=pci_from_dicts(data.get("pci_gpus")),
    )


def readiness(data: dict[str, Any]) -> tuple[str, str]:
    r = env_mod.gpu_readiness(environment(data))
    return r.state, r.reason


def summary(data: dict[str, Any], host: str | None = None) -> dict[str, Any]:
    """What the plugin stores as results['machine']: the line, the host and the GPU verdict."""
    env = environment(data)
    r = env_mod.gpu_readiness(env)
    return {"line": env_mod.header_line(env), "host": host, "gpu": {"state": r.state, "reason": r.reason}}


def parts(data: dict[str, Any], host: str | None = None) -> list[tuple[str, str]]:
    """(label, value) pairs of the machine line: GPU, driver, CUDA, torch and the stack's versions."""
    env = environment(data)
    n, t, p = env.nvml, env.torch, env.packages
    gpus = [g.name for g in n.gpus] or [d.name for d in t.devices]
    gpu = f"{len(gpus)} x {gpus[0]}" if len(gpus) > 1 and len(set(gpus)) == 1 else ", ".join(gpus) or "none"
    out = [("GPU", gpu)]
    if host:
        out.insert(0, ("host", host))
    out += [("driver", n.driver_version or "none"),
            ("CUDA", f"driver max {n.cuda_driver_version_str or 'none'}, torch {t.cuda_build or 'cpu-only build'}"),
            ("torch", t.version or "missing"),
            ("transformers", p.get("transformers") or "missing"),
            ("peft", p.get("peft") or "missing"),
            ("bitsandbytes", p.get("bitsandbytes") or "missing"),
            ("vLLM", env.vllm.version or "not found")]
    return out


def identity(results: dict[str, Any]) -> str:
    """Which machine a run was on, for trends: its host, else its GPU and driver."""
    machine = results.get("machine") or {}
    env = environment(results.get("environment") or {})
    gpus = [g.name for g in env.nvml.gpus] or [d.name for d in env.torch.devices]
    gpu = (f"{len(gpus)} x {gpus[0]}" if len(set(gpus)) == 1 and len(gpus) > 1 else ", ".join(gpus)) or "no GPU"
    if machine.get("host"):
        return f"{machine['host']} ({gpu})"
    return f"{gpu} (driver {env.nvml.driver_version or 'none'})"
