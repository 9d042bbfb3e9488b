"""Quick level: is this machine's stack consistent, is the GPU healthy, do the kernels compute
correctly. Select one with -k (e.g. -k driver, -k bnb, -k throttle)."""

from __future__ import annotations

import os

import pytest

from harness import env as env_mod
from harness.hw import compat, compute, health, kernel_log
from harness.hw.result import combine


# ---- driver and torch's CUDA build (run whenever a driver is installed) -----------------------

def test_driver(harness_env, settings, verdict):
    """Fails (never skips) when an NVIDIA GPU is on the PCI bus without a usable driver, or when a GPU
    was asked for (--expect-gpu, --device cuda)."""
    from harness.plugin_run import gpu_asked

    n = harness_env.nvml
    verdict(compat.check_driver(n.driver_version, n.cuda_driver_version, len(n.gpus), n.reason,
                                harness_env.driver_evidence, harness_env.pci_gpus, gpu_asked(settings)))


def test_driver_cuda_compat(harness_env, driver, verdict):
    t = harness_env.torch
    verdict(compat.check_cuda_compat(driver.driver_version, driver.cuda_driver_version, t.version, t.cuda_build))


def test_torch_cuda_build(harness_env, driver, verdict):
    t = harness_env.torch
    diagnosis = None if t.cuda_available else env_mod.diagnose_torch_cuda(harness_env)
    verdict(compat.check_torch_build(t.version, t.cuda_build, harness_env.driver_present, t.cuda_available,
                                     t.init_error, diagnosis))


def test_gpu_visibility(harness_env, driver, verdict):
    verdict(compat.check_visibility([(g.name, g.uuid) for g in driver.gpus],
                                    [d.name for d in harness_env.torch.devices],
                                    os.environ.get("CUDA_VISIBLE_DEVICES")))


def test_free_memory(driver, verdict):
    results = [compat.check_free_memory(g.memory_total, g.memory_free, health.running_processes(g.index),
                                        f"GPU{g.index} ({g.name})") for g in driver.gpus]
    if not results:
        pytest.skip("NVML lists no GPU")
    verdict(combine("free_memory", results))


# ---- what torch can do with the card ----------------------------------------------------------

@pytest.mark.gpu
def test_arch_list(harness_env, verdict):
    t = harness_env.torch
    verdict(combine("arch_list", [compat.check_arch(d.capability, t.arch_list, t.version, f"GPU{d.index} ({d.name})")
                                  for d in t.devices]))


@pytest.mark.gpu
def test_bf16(harness_env, verdict):
    verdict(combine("bf16", [compat.check_bf16(d.capability, f"GPU{d.index} ({d.name})")
                             for d in harness_env.torch.devices]))


@pytest.mark.gpu
def test_allocation(cuda_devices, verdict):
    verdict(combine("allocation", [compute.check_allocation(d) for d in cuda_devices]))


@pytest.mark.gpu
def test_matmul(cuda_devices, verdict):
    verdict(combine("matmul", [compute.check_matmul(d) for d in cuda_devices]))


# ---- bitsandbytes: proven by computing on the GPU ----------------------------------------------

@pytest.mark.gpu
def test_bnb_native_library(bnb_probe, verdict):
    from harness.hw.bnb_probe import native_library_result

    verdict(native_library_result(bnb_probe))


@pytest.mark.gpu
def test_bnb_4bit_roundtrip(bnb_probe, cuda_devices, verdict):
    from harness.hw.bnb_probe import nf4_result

    verdict(combine("bnb_4bit_roundtrip", [nf4_result(bnb_probe, d) for d in cuda_devices]))


@pytest.mark.gpu
def test_bnb_int8_matmul(bnb_probe, cuda_devices, verdict):
    from harness.hw.bnb_probe import int8_result

    verdict(combine("bnb_int8_matmul", [int8_result(bnb_probe, d) for d in cuda_devices]))


# ---- vLLM ---------------------------------------------------------------------------------------

@pytest.mark.vllm
def test_vllm_importable(settings, verdict):
    from harness.hw.vllm_check import check_vllm_import

    verdict(check_vllm_import(str(settings.vllm_python) if settings.vllm_python else None))


@pytest.mark.gpu
def test_vllm_capability(harness_env, verdict):
    verdict(combine("vllm_capability", [
        compat.check_vllm_capability(d.capability, harness_env.vllm.version, f"GPU{d.index} ({d.name})")
        for d in harness_env.torch.devices]))


# ---- NVML health ----------------------------------------------------------------------------------

def test_ecc_errors(gpu_health, verdict):
    verdict(combine("ecc_errors", [health.check_ecc(h) for h in gpu_health]))


def test_retired_pages(gpu_health, verdict):
    verdict(combine("retired_pages", [health.check_retired_pages(h) for h in gpu_health]))


def test_clock_throttle(gpu_health, verdict):
    verdict(combine("clock_throttle", [health.check_throttle(h) for h in gpu_health]))


def test_pcie_link(harness_env, gpu_health, verdict):
    """Read under load where torch can drive the GPU: idle links drop their generation to save power."""
    under_load = env_mod.gpu_readiness(harness_env).state == "ready"
    results = []
    for h in gpu_health:
        if under_load:
            torch_index = next((d.index for d in harness_env.torch.devices
                                if compute.nvml_index(d.index) == h.index), None)
            if torch_index is not None:
                h.__dict__.update(compute.pcie_under_load(f"cuda:{torch_index}"))
        results.append(health.check_pcie(h, under_load=under_load))
    verdict(combine("pcie_link", results))


def test_temperature(gpu_health, verdict):
    verdict(combine("temperature", [health.check_temperature(h) for h in gpu_health]))


def test_power(gpu_health, verdict):
    verdict(combine("power", [health.check_power(h) for h in gpu_health]))


def test_kernel_log_xid(verdict):
    verdict(kernel_log.check_kernel_log(kernel_log.read_kernel_log()))
