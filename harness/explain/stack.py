"""The software stack under the model: driver vs torch's CUDA build, kernels for the card's
architecture, a CPU-only torch, device-side asserts, and bitsandbytes' native library.

Messages: torch's "The NVIDIA driver on your system is too old (found version 12080)" (the
driver's CUDA, 1000*major + 10*minor), "NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is
not compatible with the current PyTorch installation. The current PyTorch install supports CUDA
capabilities sm_50 ... sm_90", "no kernel image is available for execution on the device",
"Torch not compiled with CUDA enabled", "device-side assert triggered"; bitsandbytes' "CUDA Setup
failed despite GPU being available", "Could not find the bitsandbytes CUDA binary at
.../libbitsandbytes_cuda124.so", "compiled without GPU support", BNB_CUDA_VERSION overrides.
"""

from __future__ import annotations

import re

from ..hw.compat import MIN_DRIVER_FOR_CUDA, TORCH_INDEX, check_arch
from . import planners
from .model import Cause, Context, Finding
from .text import Log
from .kinds import declare

declare("driver_cuda_mismatch", "driver/CUDA/torch",
        "install builds that match: a torch (and extensions) built for the CUDA the driver runs and for this "
        "GPU's architecture, or update the driver")
declare("bnb_setup", "bitsandbytes",
        "upgrade bitsandbytes (from 0.43 its wheels ship a library per CUDA version); check with python -m "
        "bitsandbytes")


_TOO_OLD = r"NVIDIA driver on your system is too old \(found version (\d+)\)"
_INSUFFICIENT = r"CUDA driver version is insufficient for CUDA runtime version"
_ARCH = r"with CUDA capability sm_(\d+)(\d) is not compatible with the current PyTorch installation"
_ARCH_LIST = r"current PyTorch install supports CUDA capabilities((?:\s+sm_\d+a?)+)"
_NO_KERNEL = r"no kernel image is available for execution on the device"
_CPU_BUILD = r"Torch not compiled with CUDA enabled"
_ASSERT = r"device-side assert triggered|CUDA error: device-side assert|Assertion `[^`]*` failed"
_MISMATCH = r"Driver/library version mismatch|NVML library version mismatch"
_NO_DRIVER = r"Found no NVIDIA driver on your system|NVIDIA-SMI has failed because it couldn't communicate"
_SMI_CUDA = r"CUDA Version:\s*(\d+)\.(\d+)"
_LIBCUDART = r"(libcudart|libcublas\w*|libcudnn\w*|libnvrtc)\.so\.(\d+)[\d.]*: cannot open shared object file"
_INIT = (r"CUDA unknown error - this may be due to an incorrectly set up environment|error 802|"
         r"system not yet initialized|cudaErrorSystemNotReady|forward compatibility was attempted on non supported HW|"
         r"error 804|system has unsupported display driver / cuda driver combination|error 803")
_FLASH = r"FlashAttention only supports Ampere GPUs or newer|Your setup doesn't support bf16/gpu|bf16.{0,40}requires.{0,60}(?:Ampere|supported device)"


def _driver_cuda(found: int) -> tuple[int, int]:
    return found // 1000, (found % 1000) // 10


def recognise_driver(log: Log, ctx: Context) -> list[Finding]:
    m = log.search(_TOO_OLD)
    if m:
        major, minor = _driver_cuda(int(m.group(1)))
        index = planners.torch_index_for_driver_cuda(major, minor)
        evidence = log.line_of(m)
        causes = [Cause(f"the driver supports CUDA up to {major}.{minor}; this torch was built for a newer CUDA",
                        evidence)]
        if index:
            fix = (f"either install a torch built for the CUDA this driver runs (pip install torch --index-url "
                   f"{index}), or update the NVIDIA driver (>= {MIN_DRIVER_FOR_CUDA[12]} runs CUDA 12 builds, >= "
                   f"{MIN_DRIVER_FOR_CUDA[13]} CUDA 13) and reboot")
        else:
            fix = (f"update the NVIDIA driver: CUDA {major}.{minor} predates every current torch build (>= "
                   f"{MIN_DRIVER_FOR_CUDA[12]} runs CUDA 12 builds, >= {MIN_DRIVER_FOR_CUDA[13]} CUDA 13), then reboot")
        computed = {"driver_cuda": f"{major}.{minor}", "torch_index": index,
                    "source": "the log's driver CUDA version and harness.hw.compat's minor-version rules"}
        return [Finding("driver_cuda_mismatch", f"torch cannot use the GPU: the driver (CUDA {major}.{minor}) is too "
                        "old for this torch build", causes, fix + ".", score=85, position=m.end(),
                        figures_from_log={"found_version": int(m.group(1))}, computed=computed)]
    m = log.search(r"NVIDIA driver on your system is too old|driver version is too old")
    if m:  # the message cut before its version part: the index needs the driver's CUDA version
        smi = log.search(_SMI_CUDA)
        index = planners.torch_index_for_driver_cuda(int(smi.group(1)), int(smi.group(2))) if smi else None
        fix = (f"install the torch build for the driver's CUDA {smi.group(1)}.{smi.group(2)} (pip install torch "
               f"--index-url {index})" if index else
               "add nvidia-smi's first lines (its 'CUDA Version: X.Y') to the text for the torch build this driver "
               "runs") + (f", or update the NVIDIA driver (>= {MIN_DRIVER_FOR_CUDA[12]} runs CUDA 12 builds, >= "
                          f"{MIN_DRIVER_FOR_CUDA[13]} CUDA 13) and reboot")
        return [Finding("driver_cuda_mismatch", "torch cannot use the GPU: the driver is too old for this torch build",
                        [Cause("the driver's CUDA is older than the one this torch was built for (the message's "
                               "version part is not in the text)", log.line_of(m))], fix + ".", score=82,
                        position=m.end(), computed={"torch_index": index, "source": "harness.hw.compat on the "
                                                    "nvidia-smi CUDA version in the text"} if index else None)]
    m = log.search(_INSUFFICIENT)
    if m:
        return [Finding("driver_cuda_mismatch", "the CUDA runtime is newer than the driver",
                        [Cause("the installed driver is older than the CUDA runtime the program ships", log.line_of(m))],
                        f"update the NVIDIA driver (>= {MIN_DRIVER_FOR_CUDA[12]} for CUDA 12, >= "
                        f"{MIN_DRIVER_FOR_CUDA[13]} for CUDA 13) or install a build for an older CUDA "
                        f"({TORCH_INDEX}/cu118 runs on >= 450).", score=80, position=m.end())]
    return []


def recognise_arch(log: Log, ctx: Context) -> list[Finding]:
    m, k = log.search(_ARCH), log.search(_NO_KERNEL)
    if not (m or k):
        return []
    if not m:
        return [Finding("driver_cuda_mismatch", "a CUDA kernel has no binary for this GPU's architecture",
                        [Cause("torch (or an extension: flash-attn, bitsandbytes, a custom kernel) was built without "
                               "code for this card's compute capability", log.line_of(k))],
                        "install builds that list your card's sm_XY: torch from an index that includes it "
                        f"(Blackwell sm_100/sm_120 needs CUDA 12.8: {TORCH_INDEX}/cu128), and rebuild or upgrade "
                        "extensions (TORCH_CUDA_ARCH_LIST) for the same arch; python -c 'import torch; "
                        "print(torch.cuda.get_arch_list())' shows torch's.", score=75, position=k.end())]
    cap = (int(m.group(1)), int(m.group(2)))
    archs = log.search(_ARCH_LIST)
    arch_list = archs.group(1).split() if archs else []
    check = check_arch(cap, arch_list, None, gpu=f"sm_{cap[0]}{cap[1]}")
    fix = check.fix or f"install a torch build that lists sm_{cap[0]}{cap[1]}"
    if cap >= (10, 0):
        fix += "; torch >= 2.7 from the cu128 index ships Blackwell kernels"
    return [Finding("driver_cuda_mismatch", f"this torch build has no kernels for the GPU (sm_{cap[0]}{cap[1]})",
                    [Cause(f"torch ships {' '.join(arch_list) or 'other architectures'}, not sm_{cap[0]}{cap[1]}",
                           log.line_of(m))], fix + ".", score=85, position=max(m.end(), k.end() if k else 0),
                    figures_from_log={"capability": f"{cap[0]}.{cap[1]}", "torch_arch_list": arch_list},
                    computed={"torch_index": f"{TORCH_INDEX}/cu128" if cap >= (10, 0) else None,
                              "source": "harness.hw.compat.check_arch on the capability and arch list in the log"})]


def recognise_cpu_build(log: Log, ctx: Context) -> list[Finding]:
    m = log.search(_CPU_BUILD)
    if not m:
        return []
    smi = log.search(_SMI_CUDA)
    index = planners.torch_index_for_driver_cuda(int(smi.group(1)), int(smi.group(2))) if smi else f"{TORCH_INDEX}/cu126"
    evidence = log.line_of(m)
    fix = (f"install a CUDA build of torch (pip install torch --index-url {index}; torch.version.cuda must not be "
           f"None, a '+cpu' version is the CPU-only build)"
           + (f", chosen for the driver's CUDA {smi.group(1)}.{smi.group(2)} in the log" if smi else "")
           + "; if this machine has no NVIDIA GPU (e.g. a Mac), run on the CPU instead (device='cpu')")
    return [Finding("driver_cuda_mismatch", "this torch is a CPU-only build, and the code asked for CUDA",
                    [Cause("torch was installed without CUDA (the default wheel on some platforms, or pip picked the "
                           "CPU index)", evidence)], fix + ".", score=80, position=m.end(),
                    computed={"torch_index": index, "source": "harness.hw.compat.wheel_for_driver"} if smi else None)]


def recognise_misc_stack(log: Log, ctx: Context) -> list[Finding]:
    out = []
    m = log.search(_ASSERT)
    if m:
        out.append(Finding("driver_cuda_mismatch", "a CUDA kernel's assertion failed (device-side assert)",
                           [Cause("not a driver problem: an index out of range inside a kernel, most often a label "
                                  "or token id >= the vocabulary size (tokens added without resize_token_embeddings, "
                                  "a wrong num_labels, a pad id of -1)", log.line_of(m))],
                           "rerun with CUDA_LAUNCH_BLOCKING=1 (or on the CPU) for the real line; check "
                           "max(input_ids) < embedding rows and labels in [0, num_labels) or -100; restart the "
                           "process (the CUDA context is unusable after the assert).", score=70, position=m.end()))
    m = log.search(_MISMATCH)
    if m:
        out.append(Finding("driver_cuda_mismatch", "the loaded kernel driver and the NVIDIA libraries differ",
                           [Cause("the driver was updated but the old kernel module is still loaded", log.line_of(m))],
                           "reboot (or unload and reload the nvidia kernel modules).", score=80, position=m.end()))
    out.extend(_runtime_problems(log))
    m = log.search(_NO_DRIVER)
    if m:
        out.append(Finding("driver_cuda_mismatch", "no NVIDIA driver answers",
                           [Cause("the driver is not installed or not loaded (or the container has no GPU access)",
                                  log.line_of(m))],
                           "install the NVIDIA driver (>= 525), reboot; in docker pass --gpus all with the NVIDIA "
                           "container toolkit.", score=75, position=m.end()))
    return out


def _runtime_problems(log: Log) -> list[Finding]:
    out = []
    m = log.search(_LIBCUDART)
    if m:
        out.append(Finding("driver_cuda_mismatch", f"a CUDA {m.group(2)} library ({m.group(1)}) is not installed",
                           [Cause(f"a package built for CUDA {m.group(2)} found no {m.group(1)}.so.{m.group(2)}: its CUDA "
                                  "runtime is neither in torch's wheels nor on LD_LIBRARY_PATH", log.line_of(m))],
                           f"install packages built for the CUDA your torch uses (pip install the cu{m.group(2)}x build, or "
                           f"nvidia-*-cu{m.group(2)} wheels), or add the toolkit's lib64 to LD_LIBRARY_PATH.",
                           score=70, position=m.end()))
    m = log.search(_INIT)
    if m:
        code = next((c for c in ("802", "803", "804") if c in m.group(0)), None)
        cause = {"802": "the fabric manager is not running (NVSwitch systems: HGX/DGX)",
                 "803": "the CUDA user-space driver and the kernel module differ (a mixed install)",
                 "804": "CUDA forward compatibility is installed on a GPU that does not support it (consumer cards)"}
        out.append(Finding("driver_cuda_mismatch", "CUDA could not initialise",
                           [Cause(cause.get(code, "the driver state is broken: often after suspend/resume or a driver "
                                  "update without reboot (nvidia_uvm not loaded)"), log.line_of(m))],
                           {"802": "start nvidia-fabricmanager (same version as the driver), then retry.",
                            "803": "reinstall one matching driver (kernel module and libcuda), then reboot.",
                            "804": "remove the cuda-compat package from the library path; use a driver that "
                                   "supports the CUDA build natively."}.get(code, "reboot, or reload nvidia_uvm "
                                   "(sudo rmmod nvidia_uvm && sudo modprobe nvidia_uvm)."),
                           score=75, position=m.end()))
    m = log.search(_FLASH)
    if m:
        out.append(Finding("driver_cuda_mismatch", "the GPU is older than the kernels or dtype asked for",
                           [Cause("FlashAttention-2 and bf16 need compute capability 8.0 (Ampere) or newer",
                                  log.line_of(m))],
                           "use attn_implementation='sdpa' (or 'eager') and fp16 instead of bf16 on this card.",
                           score=75, position=m.end()))
    return out


_BNB = (r"Error named symbol not found at line \d+ in file|CUDA Setup failed despite GPU being available|Could not find the bitsandbytes CUDA binary|"
        r"libbitsandbytes_cuda\d+\w*\.so|compiled without GPU support|Could not load bitsandbytes native library|"
        r"libbitsandbytes_cpu\.so: undefined symbol|CUDA SETUP: Required library version not found|"
        r"bitsandbytes.{0,40}requires the latest version|No module named 'bitsandbytes'")


def recognise_bnb(log: Log, ctx: Context) -> list[Finding]:
    m = log.search(_BNB)
    if not m:
        return []
    evidence = log.line_of(m)
    causes, fixes = [], []
    override = log.search(r"BNB_CUDA_VERSION=(\d+)")
    if override:
        causes.append(Cause(f"BNB_CUDA_VERSION={override.group(1)} makes bitsandbytes load a library for CUDA "
                            f"{override.group(1)} instead of torch's", log.line_of(override)))
        fixes.append("unset BNB_CUDA_VERSION (export BNB_CUDA_VERSION=) unless you built that library and put its "
                     "libcudart on LD_LIBRARY_PATH")
    lib = log.search(r"libbitsandbytes_cuda(\d+)(\w*)\.so")
    if lib and log.has(r"not found|Could not find|No such file|Maybe you need to compile"):
        causes.append(Cause(f"the installed bitsandbytes has no libbitsandbytes_cuda{lib.group(1)}{lib.group(2)}.so "
                            "(an old release, or a source checkout built for another CUDA)", log.line_of(lib)))
    if log.has(r"compiled without GPU support|libbitsandbytes_cpu\.so"):
        causes.append(Cause("bitsandbytes fell back to its CPU library: it found no CUDA library it could load",
                            log.evidence(r"compiled without GPU support|libbitsandbytes_cpu\.so") or evidence))
    if log.has(r"libcudart\.so not found|did not contain \['libcudart"):
        causes.append(Cause("an old bitsandbytes searched for libcudart.so on its own and did not find it",
                            log.evidence(r"libcudart\.so not found.*|did not contain \['libcudart.*") or evidence))
    named = log.search(r"Error named symbol not found at line \d+ in file.*")
    if named:
        causes.append(Cause("the native library has no kernel for this GPU's architecture (a build for other "
                            "compute capabilities)", log.line_of(named)))
    if not causes:
        causes.append(Cause("bitsandbytes could not load its native CUDA library", evidence))
    fixes.append("upgrade bitsandbytes (pip install -U bitsandbytes: from 0.43 its wheels ship a library per CUDA "
                 "version and take the CUDA runtime from torch), then check with python -m bitsandbytes; with a "
                 "CUDA toolkit outside torch's, set BNB_CUDA_VERSION and LD_LIBRARY_PATH to match it")
    return [Finding("bnb_setup", "bitsandbytes failed to set up its CUDA library", causes, "; ".join(fixes) + ".",
                    score=65, position=m.end())]


RECOGNISERS = (recognise_driver, recognise_arch, recognise_cpu_build, recognise_misc_stack, recognise_bnb)
