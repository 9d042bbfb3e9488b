"""Fault injection for the compatibility rules: each fault gives a failure and the right fix."""

from __future__ import annotations

import json

import pytest

from harness import env as env_mod
from harness.hw import compat
from harness.hw.static import static_checks

ARCHS_CU124 = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
ARCHS_CU130 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_110", "sm_120"]


# ---- driver too old -----------------------------------------------------------------------------

def test_driver_older_than_torchs_cuda_major_fails_with_update_and_reboot():
    r = compat.check_cuda_compat("535.104.05", 12020, "2.11.0+cu130", "13.0")
    assert r.verdict == "fail"
    assert "supports up to 12.2" in r.value and "CUDA 13.0" in r.value
    assert ">= 580" in r.fix and "reboot" in r.fix
    assert "cu126" in r.fix  # or a torch this driver can run


def test_driver_for_cuda_12_runs_a_cu128_torch_only_through_minor_compat():
    r = compat.check_cuda_compat("535.104.05", 12020, "2.9.0+cu128", "12.8")
    assert r.verdict == "warn"
    assert "PTX" in r.fix and "reboot" in r.fix


@pytest.mark.parametrize("driver, cuda, torch_cuda", [("580.159.04", 13000, "13.0"), ("580.159.04", 13000, "12.8"),
                                                       ("570.86", 12080, "12.6")])
def test_matching_or_newer_driver_passes(driver, cuda, torch_cuda):
    assert compat.check_cuda_compat(driver, cuda, "2.x", torch_cuda).verdict == "pass"


def test_pre_cuda12_driver_fails_the_driver_check():
    r = compat.check_driver("470.82.01", 11040, 1)
    assert r.verdict == "fail" and "update the driver" in r.fix and "reboot" in r.fix


def test_driver_files_without_nvml_answer_is_a_failure_not_a_skip():
    r = compat.check_driver(None, None, 0, "NVML: Driver/library version mismatch", ["/dev/nvidiactl"])
    assert r.verdict == "fail" and "reboot" in r.fix
    assert compat.check_driver(None, None, 0, "no NVIDIA driver found").verdict == "skip"


def test_driver_that_sees_no_gpu_says_reseat():
    r = compat.check_driver("580.159.04", 13000, 0)
    assert r.verdict == "fail" and "reseat" in r.fix


# ---- CPU-only torch -------------------------------------------------------------------------------

def test_a_gpu_less_box_reads_torchs_build_without_importing_it():
    """torch/version.py read as torch wrote it gives what the import gives (the file beside the
    import, in a fresh interpreter, so that nothing imported torch before)."""
    import subprocess
    import sys

    code = ("import json, sys; from harness import env; light = env.probe_torch(gpu_evidence=False); "
            "imported = 'torch' in sys.modules; import torch; "
            "print(json.dumps([light.version, light.cuda_build, imported, str(torch.__version__), torch.version.cuda]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    version, cuda, imported, real_version, real_cuda = json.loads(out.strip().splitlines()[-1])
    if real_cuda is not None:
        assert (version, cuda) == (real_version, real_cuda)  # a CUDA build is imported and probed
        return
    assert (version, cuda, imported) == (real_version, None, False)


def test_this_machines_cpu_only_torch_is_named_when_a_driver_is_present():
    t = env_mod.probe_torch()  # the real probe: this machine runs a CPU-only build
    if not t.cpu_only_build:
        pytest.skip(f"torch {t.version} here is a CUDA build")
    r = compat.check_torch_build(t.version, t.cuda_build, True, t.cuda_available, t.init_error)
    assert r.verdict == "fail"
    assert t.version in r.value and "CPU-only" in r.value
    assert "reinstall torch with CUDA" in r.fix and "download.pytorch.org/whl/cu" in r.fix
    r = compat.check_cuda_compat("580.159.04", 13000, t.version, t.cuda_build)
    assert r.verdict == "fail" and "cu130" in r.fix


def test_cpu_only_torch_without_driver_skips():
    assert compat.check_torch_build("2.13.0+cpu", None, False, False, None).verdict == "skip"


def test_environment_with_driver_and_cpu_torch_reads_broken_with_diagnosis():
    environment = env_mod.Environment(
        nvml=env_mod.NvmlProbe(True, driver_version="580.159.04", cuda_driver_version=13000,
                               gpus=[env_mod.NvmlGpu(0, "NVIDIA GeForce RTX 3060", "GPU-1", 12 << 30, 0, 12 << 30, (8, 6))]),
        torch=env_mod.TorchProbe("2.13.0+cpu"), packages={}, vllm=env_mod.VllmProbe(None, error="none"))
    assert env_mod.gpu_readiness(environment).state == "broken"
    checks = {c.check: c for c in static_checks(environment, None)}
    assert checks["driver"].verdict == "pass"
    assert checks["torch_cuda_build"].verdict == "fail"
    assert "CPU-only" in checks["torch_cuda_build"].fix
    assert checks["gpu_visibility"].verdict == "fail"  # NVML sees the card, torch does not


# ---- capability ---------------------------------------------------------------------------------

def test_card_newer_than_torchs_arch_list_fails_with_newer_cuda_build():
    r = compat.check_arch((12, 0), ARCHS_CU124, "2.5.1+cu124", "GPU0 (NVIDIA GeForce RTX 5070)")
    assert r.verdict == "fail"
    assert "sm_120" in r.fix and "cu128" in r.fix


def test_card_older_than_torchs_arch_list_fails_with_older_torch():
    r = compat.check_arch((6, 1), ARCHS_CU130, "2.11.0+cu130", "GPU0 (NVIDIA GeForce GTX 1080)")
    assert r.verdict == "fail" and "older torch" in r.fix


@pytest.mark.parametrize("cap, archs, verdict", [((8, 6), ARCHS_CU124, "pass"), ((8, 9), ARCHS_CU124, "pass"),
                                                 ((9, 0), ARCHS_CU130, "pass"),
                                                 ((10, 3), ["sm_90", "compute_90"], "warn")])
def test_arch_rule_accepts_same_major_cubins_and_warns_on_ptx_only(cap, archs, verdict):
    assert compat.check_arch(cap, archs, "2.x").verdict == verdict


def test_vllm_refuses_pascal_and_bf16_needs_ampere():
    r = compat.check_vllm_capability((6, 1), "0.32.0")
    assert r.verdict == "fail" and "7.0" in r.fix
    assert compat.check_vllm_capability((7, 5), "0.32.0").verdict == "pass"
    r = compat.check_bf16((7, 5), "GPU0 (Tesla T4)")
    assert r.verdict == "warn" and "fp16" in r.fix
    assert compat.check_bf16((8, 0)).verdict == "pass"


# ---- visibility and memory ----------------------------------------------------------------------

GPUS = [("NVIDIA H200", "GPU-aaaa"), ("NVIDIA H200", "GPU-bbbb")]


def test_cuda_visible_devices_that_hides_everything_fails():
    r = compat.check_visibility(GPUS, [], "")
    assert r.verdict == "fail" and "hides every GPU" in r.fix
    assert compat.check_visibility(GPUS, [], "-1").verdict == "fail"


def test_cuda_visible_devices_is_honoured():
    assert compat.check_visibility(GPUS, ["NVIDIA H200"], "1").verdict == "pass"
    assert compat.check_visibility(GPUS, ["NVIDIA H200"], "GPU-bbbb").verdict == "pass"
    assert compat.check_visibility(GPUS, ["NVIDIA H200", "NVIDIA H200"], None).verdict == "pass"
    assert compat.check_visibility(GPUS, ["NVIDIA H200"], None).verdict == "fail"
    assert compat.visible_device_entries("0,bad,1") == ["0"]  # CUDA stops at the first bad entry


def test_free_memory_names_the_processes_holding_it():
    r = compat.check_free_memory(8 << 30, 2 << 30, [(4242, "python3", 5 << 30)], "GPU0 (RTX 4060)")
    assert r.verdict == "warn"
    assert "python3 (pid 4242, 5.00 GiB)" in r.value and "python3" in r.fix
    assert compat.check_free_memory(8 << 30, 8 << 30, []).verdict == "pass"
