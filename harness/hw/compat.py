"""Pure compatibility rules: driver vs torch's CUDA build, arch list, bf16, vLLM, visibility.

No probing here: every function takes plain values (from harness.env's probes or from a test
that injects a fault) and returns a CheckResult with the likely cause and the fix.
"""

from __future__ import annotations

import re

from ..pci import PciGpu, gpus_line, missing_driver_fix
from .result import CheckResult

# CUDA major -> oldest driver branch that runs it (minor-version compatibility).
MIN_DRIVER_FOR_CUDA = {11: 450, 12: 525, 13: 580}
BF16_MIN_CAPABILITY = (8, 0)
VLLM_MIN_CAPABILITY = (7, 0)
TORCH_INDEX = "https://download.pytorch.org/whl"
REBOOT = "reboot after a driver update"


def _cc(cap: tuple[int, int] | None) -> str:
    return "unknown" if cap is None else f"{cap[0]}.{cap[1]}"


def parse_cuda(text: str | None) -> tuple[int, int] | None:
    """"12.8" -> (12, 8); None for a CPU-only build or nonsense."""
    m = re.match(r"^(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def driver_cuda(cuda_driver_version: int | None) -> tuple[int, int] | None:
    """nvmlSystemGetCudaDriverVersion's 1000*major + 10*minor -> (major, minor)."""
    if not cuda_driver_version:
        return None
    return cuda_driver_version // 1000, (cuda_driver_version % 1000) // 10


def driver_branch(driver_version: str | None) -> int | None:
    m = re.match(r"^(\d+)", driver_version or "")
    return int(m.group(1)) if m else None


def wheel_for_driver(cuda: tuple[int, int] | None) -> str:
    """The torch wheel index a driver with this max CUDA version can run."""
    if cuda is None:
        return f"{TORCH_INDEX}/cu126"
    if cuda[0] >= 13:
        return f"{TORCH_INDEX}/cu130"
    if cuda[0] == 12:
        return f"{TORCH_INDEX}/cu126" if cuda[1] < 8 else f"{TORCH_INDEX}/cu128"
    return f"{TORCH_INDEX}/cu118"


def check_driver(driver_version: str | None, cuda_driver_version: int | None, gpu_count: int,
                 nvml_reason: str | None = None, driver_evidence: list[str] | None = None,
                 pci_gpus: list[PciGpu] | None = None, gpu_asked: str | None = None) -> CheckResult:
    """The NVIDIA driver answers through NVML, with its version and max CUDA version. With no driver:
    an NVIDIA GPU on the PCI bus (`pci_gpus`, None when the bus could not be read) or a GPU asked for
    (`gpu_asked`: the option, --expect-gpu or --device cuda) makes it a failure; only a box with
    neither is a skip (CPU-only)."""
    expectation = "an NVIDIA driver that NVML can talk to, >= 525 (CUDA 12) or >= 580 (CUDA 13)"
    if driver_version is None:
        detail = re.sub(r"^no NVIDIA driver found \((.*)\)$", r"\1", nvml_reason or "NVML did not answer")
        if pci_gpus and not driver_evidence:
            return CheckResult("driver", "fail", f"{gpus_line(pci_gpus)} but no usable NVIDIA driver ({detail})",
                               expectation, missing_driver_fix(pci_gpus), {"pci_gpus": [g.address for g in pci_gpus]})
        if driver_evidence:
            reason = nvml_reason or "NVML did not answer"
            fix = REBOOT + " (a loaded kernel module older than the installed libraries gives this)"
            if "mismatch" in reason.lower():
                fix = f"driver/library version mismatch: {REBOOT}"
            return CheckResult("driver", "fail", f"driver files present ({', '.join(driver_evidence)}) but {reason}",
                               expectation, fix)
        if pci_gpus is not None:
            value = f"CPU-only: no NVIDIA device on the PCI bus and no NVIDIA driver ({detail})"
        else:
            value = f"no NVIDIA driver found ({detail}; the PCI bus could not be read)"
        if gpu_asked:
            return CheckResult("driver", "fail", f"{gpu_asked}: {value}", expectation,
                               "run on the GPU machine, or check that the card is seated and powered and shows in "
                               "`lspci -nn | grep -i nvidia`")
        return CheckResult("driver", "skip", value, expectation)
    cuda = driver_cuda(cuda_driver_version)
    value = f"driver {driver_version}, CUDA up to {cuda[0]}.{cuda[1]}" if cuda else f"driver {driver_version}"
    value += f", {gpu_count} GPU(s)"
    branch = driver_branch(driver_version)
    if gpu_count == 0:
        return CheckResult("driver", "fail", value, expectation,
                           "the driver sees no GPU: reseat the card and check its power cables; look for Xid 79 "
                           "('fallen off the bus') in the kernel log")
    if branch is not None and branch < MIN_DRIVER_FOR_CUDA[12]:
        return CheckResult("driver", "fail", value, expectation,
                           f"driver {driver_version} predates CUDA 12, which current torch, bitsandbytes and vLLM "
                           f"need: update the driver to >= 580 (CUDA 13) or at least 525, then {REBOOT}",
                           {"branch": branch})
    return CheckResult("driver", "pass", value, expectation, details={"branch": branch, "cuda": cuda})


def check_cuda_compat(driver_version: str | None, cuda_driver_version: int | None,
                      torch_version: str | None, torch_cuda: str | None) -> CheckResult:
    """torch's CUDA build against the driver's max CUDA version: major rule, then minor rule."""
    name = "driver_cuda_compat"
    built = parse_cuda(torch_cuda)
    drv = driver_cuda(cuda_driver_version)
    expectation = "torch's CUDA major <= the driver's; same major needs driver >= 525 (12.x) / >= 580 (13.x)"
    if torch_version is None:
        return CheckResult(name, "fail", "torch is not installed", expectation,
                           f"install torch for your driver: pip install torch --index-url {wheel_for_driver(drv)}")
    if built is None:
        return CheckResult(name, "fail", f"torch {torch_version} is a CPU-only build", expectation,
                           f"reinstall torch with CUDA: pip install torch --index-url {wheel_for_driver(drv)}")
    if drv is None:
        return CheckResult(name, "skip", "the driver's CUDA version is unknown (no driver, or NVML did not answer)",
                           expectation)
    value = f"torch {torch_version} built for CUDA {torch_cuda}; driver {driver_version} supports up to {drv[0]}.{drv[1]}"
    details = {"torch_cuda": built, "driver_cuda": drv}
    if built[0] > drv[0]:
        need = MIN_DRIVER_FOR_CUDA.get(built[0], "a newer")
        fix = (f"driver too old for torch's CUDA {built[0]}: update the driver to >= {need} for CUDA {built[0]}, "
               f"then {REBOOT}; or reinstall torch for CUDA {drv[0]}.x "
               f"(pip install torch --index-url {wheel_for_driver(drv)})")
        return CheckResult(name, "fail", value, expectation, fix, details)
    branch = driver_branch(driver_version)
    need = MIN_DRIVER_FOR_CUDA.get(built[0])
    if built[0] == drv[0] and branch is not None and need is not None and branch < need:
        return CheckResult(name, "fail", value, expectation,
                           f"CUDA {built[0]}.x needs driver >= {need}: update the driver, then {REBOOT}", details)
    if built[0] == drv[0] and built[1] > drv[1]:
        return CheckResult(name, "warn", value + " (runs through minor-version compatibility)", expectation,
                           f"kernels JIT-compiled from newer PTX (Triton, torch.compile, bitsandbytes' Triton "
                           f"paths) can fail with 'unsupported PTX version': update the driver to one that "
                           f"supports CUDA {built[0]}.{built[1]}, then {REBOOT}", details)
    return CheckResult(name, "pass", value, expectation, details=details)


def check_torch_build(torch_version: str | None, torch_cuda: str | None, driver_present: bool,
                      cuda_available: bool, init_error: str | None, diagnosis: str | None = None) -> CheckResult:
    """A CPU-only torch (or one that cannot initialise CUDA) on a machine with a driver, named."""
    name = "torch_cuda_build"
    expectation = "a CUDA build of torch whose torch.cuda.is_available() is True"
    if torch_version is None:
        return CheckResult(name, "fail", init_error or "torch is not installed", expectation,
                           "install torch for your driver (see docs/setup.md)")
    if torch_cuda is None:
        value = f"torch {torch_version} is a CPU-only build"
        if not driver_present:
            return CheckResult(name, "skip", value + " and no NVIDIA driver is installed", expectation)
        return CheckResult(name, "fail", value, expectation,
                           diagnosis or f"reinstall torch with CUDA: pip install torch --index-url {TORCH_INDEX}/cu130 "
                                         f"(cu126 for a driver < 580)")
    value = f"torch {torch_version} built for CUDA {torch_cuda}"
    if cuda_available:
        return CheckResult(name, "pass", value + ", CUDA available", expectation)
    if not driver_present:
        return CheckResult(name, "skip", value + ", but no NVIDIA driver is installed", expectation)
    return CheckResult(name, "fail", f"{value}, CUDA unavailable: {init_error or 'is_available() is False'}",
                       expectation, diagnosis or "see the driver and driver_cuda_compat checks")


def _arch_tuple(arch: str) -> tuple[str, int, int] | None:
    """'sm_86' -> ('sm', 8, 6); 'compute_90' -> ('compute', 9, 0); 'sm_90a' -> ('sm', 9, 0) (arch-specific)."""
    m = re.match(r"^(sm|compute)_(\d+?)(\d)([af]?)$", arch)
    if not m:
        return None
    return m.group(1), int(m.group(2)), int(m.group(3))


def check_arch(capability: tuple[int, int] | None, arch_list: list[str], torch_version: str | None,
               gpu: str = "GPU") -> CheckResult:
    """The card's compute capability has kernels in torch's build (cubin of the same major, or PTX)."""
    name = "arch_list"
    expectation = "sm_XY in torch.cuda.get_arch_list() for the card's capability X.Y (or PTX to JIT)"
    if capability is None:
        return CheckResult(name, "skip", f"{gpu}: compute capability unknown", expectation)
    major, minor = capability
    value = f"{gpu} capability {major}.{minor}; torch {torch_version} ships {' '.join(arch_list) or 'no CUDA arches'}"
    archs = [a for a in map(_arch_tuple, arch_list) if a]
    if any(kind == "sm" and a_major == major and a_minor == minor for kind, a_major, a_minor in archs):
        return CheckResult(name, "pass", value, expectation)
    # A cubin runs on a later minor of the same major (sm_80 code on an 8.6 card).
    if any(kind == "sm" and a_major == major and a_minor <= minor for kind, a_major, a_minor in archs):
        return CheckResult(name, "pass", value + " (binary-compatible within the major)", expectation)
    if any(kind == "compute" and (a_major, a_minor) <= (major, minor) for kind, a_major, a_minor in archs):
        return CheckResult(name, "warn", value + " (PTX only: kernels JIT-compile at first use)", expectation,
                           "first runs are slow and JIT can fail; install a torch build that lists "
                           f"sm_{major}{minor}")
    newest = max(((a[1], a[2]) for a in archs), default=None)
    if newest is not None and (major, minor) > newest:
        fix = (f"this torch has no kernels for sm_{major}{minor} (newer than its newest, sm_{newest[0]}{newest[1]}): "
               f"install a torch built for a newer CUDA (pip install torch --index-url {TORCH_INDEX}/cu128 "
               f"or cu130; Blackwell needs CUDA >= 12.8)")
    else:
        fix = (f"capability {major}.{minor} is older than this torch supports: use an older torch release "
               f"that still ships sm_{major}{minor}, or a newer card")
    return CheckResult(name, "fail", value, expectation, fix)


def check_bf16(capability: tuple[int, int] | None, gpu: str = "GPU") -> CheckResult:
    expectation = f"capability >= {_cc(BF16_MIN_CAPABILITY)} (Ampere or newer)"
    if capability is None:
        return CheckResult("bf16", "skip", f"{gpu}: compute capability unknown", expectation)
    value = f"{gpu} capability {_cc(capability)}"
    if tuple(capability) >= BF16_MIN_CAPABILITY:
        return CheckResult("bf16", "pass", value + ": bf16 supported", expectation)
    return CheckResult("bf16", "warn", value + ": no native bf16", expectation,
                       "train and serve in fp16 (with loss scaling for training); QLoRA with fp16 compute is "
                       "less stable than bf16, so watch for NaN; a card of capability >= 8.0 avoids this")


def check_vllm_capability(capability: tuple[int, int] | None, vllm_version: str | None,
                          gpu: str = "GPU") -> CheckResult:
    name = "vllm_capability"
    expectation = f"capability >= {_cc(VLLM_MIN_CAPABILITY)} (vLLM's minimum)"
    if capability is None:
        return CheckResult(name, "skip", f"{gpu}: compute capability unknown", expectation)
    who = f"vLLM {vllm_version}" if vllm_version else "vLLM"
    value = f"{gpu} capability {_cc(capability)} for {who}"
    if tuple(capability) >= VLLM_MIN_CAPABILITY:
        return CheckResult(name, "pass", value, expectation)
    return CheckResult(name, "fail", value, expectation,
                       f"vLLM does not run on capability {_cc(capability)} (< 7.0): serve with transformers or "
                       f"llama.cpp on this card, or use a Volta-or-newer GPU")


def visible_device_entries(cvd: str | None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as CUDA reads it: None = unset (all); parsing stops at the first bad entry."""
    if cvd is None:
        return None
    out: list[str] = []
    for item in cvd.split(","):
        item = item.strip()
        if re.fullmatch(r"\d+", item):
            out.append(item)
        elif re.match(r"^(GPU|MIG)-[0-9a-fA-F-]+", item):
            out.append(item)
        else:
            break  # "-1", "" or garbage: CUDA ignores this and everything after it
    return out


def check_visibility(nvml_gpus: list[tuple[str, str]], torch_names: list[str], cvd: str | None) -> CheckResult:
    """Every GPU NVML sees (minus what CUDA_VISIBLE_DEVICES hides) is usable from torch, by name."""
    name = "gpu_visibility"
    entries = visible_device_entries(cvd)
    if entries is None:
        expected = [n for n, _ in nvml_gpus]
    else:
        expected = []
        for e in entries:
            if e.isdigit() and int(e) < len(nvml_gpus):
                expected.append(nvml_gpus[int(e)][0])
            else:
                match = [n for n, uuid in nvml_gpus if uuid and uuid.startswith(e)]  # CUDA takes UUID prefixes
                if match:
                    expected.append(match[0])
    shown = "unset" if cvd is None else repr(cvd)
    value = f"NVML: {len(nvml_gpus)} GPU(s), CUDA_VISIBLE_DEVICES={shown}, torch: {len(torch_names)} ({', '.join(torch_names) or 'none'})"
    expectation = f"torch sees {len(expected)} GPU(s): {', '.join(expected) or 'none'}"
    if not nvml_gpus:
        return CheckResult(name, "skip", "NVML sees no GPU", expectation)
    if entries is not None and not expected:
        return CheckResult(name, "fail", value, expectation,
                           f"CUDA_VISIBLE_DEVICES={shown} hides every GPU: unset it or list indices 0..{len(nvml_gpus) - 1}")
    if len(torch_names) != len(expected) or sorted(torch_names) != sorted(expected):
        fix = ("torch sees a different set of GPUs than NVML: check CUDA_VISIBLE_DEVICES (CUDA stops at the "
               "first invalid entry), and for a GPU missing from both, reseat it and check the kernel log")
        return CheckResult(name, "fail", value, expectation, fix)
    return CheckResult(name, "pass", value, expectation)


def check_free_memory(total: int, free: int, processes: list[tuple[int, str, int | None]],
                      gpu: str = "GPU", min_free_fraction: float = 0.9) -> CheckResult:
    """Free against total; other processes named with their memory."""
    from harness.units import format_bytes

    frac = free / total if total else 0.0
    procs = ", ".join(f"{pname or '?'} (pid {pid}, {format_bytes(used) if used else '? B'})"
                      for pid, pname, used in processes) or "none"
    value = f"{gpu}: {format_bytes(free)} free of {format_bytes(total)} ({frac:.0%}); processes: {procs}"
    expectation = f">= {min_free_fraction:.0%} of memory free"
    details = {"total": total, "free": free, "processes": [list(p) for p in processes]}
    if frac >= min_free_fraction:
        return CheckResult("free_memory", "pass", value, expectation, details=details)
    fix = (f"other processes hold GPU memory ({procs}): stop them before fine-tuning or serving, or budget "
           "for what is left (vLLM refuses to start when free memory is below gpu_memory_utilization)")
    if not processes:
        fix = ("memory is used but no process is listed (another container or a leaked context): "
               "find it with nvidia-smi on the host, or reset the GPU")
    return CheckResult("free_memory", "warn", value, expectation, fix, details)


# Error text of bitsandbytes' native library -> (cause, fix).
_BNB_ERRORS: list[tuple[str, str, str]] = [
    (r"BNB_CUDA_VERSION|BNB_ROCM_VERSION", "a BNB_CUDA_VERSION override points at a missing binary",
     "unset BNB_CUDA_VERSION (or set it to a CUDA version listed in bitsandbytes' package)"),
    (r"No compatible \w+ binary found|libbitsandbytes_cuda\d+\S* .*not found|binary .*not found",
     "this bitsandbytes ships no binary for torch's CUDA version",
     "upgrade bitsandbytes (pip install -U bitsandbytes) to a release built for torch's CUDA version"),
    (r"invalid ELF header|file too short|not an ELF|wrong ELF class|truncated",
     "the native library file is corrupt", "reinstall it: pip install --force-reinstall --no-cache-dir bitsandbytes"),
    (r"undefined symbol", "the native library does not match this torch/CUDA",
     "reinstall bitsandbytes for this torch: pip install --force-reinstall bitsandbytes"),
    (r"lib(cudart|cublas|cublasLt|cusparse)\S*\.so\S*: cannot open shared object file|libcudart",
     "a CUDA runtime library it links against is missing",
     "install torch's CUDA runtime wheels (they come with a CUDA build of torch) or add the CUDA "
     "libraries to LD_LIBRARY_PATH"),
    (r"cannot open shared object file|No such file or directory",
     "the native library is missing", "reinstall it: pip install --force-reinstall bitsandbytes"),
    (r"no kernel image is available|CUDA error: no kernel", "its kernels were not built for this card's capability",
     "use a bitsandbytes release that supports this compute capability"),
    (r"No module named 'bitsandbytes'", "bitsandbytes is not installed", "pip install bitsandbytes"),
]


def classify_bnb_error(text: str) -> tuple[str, str]:
    """(likely cause, fix) for an error bitsandbytes raised or logged."""
    for pattern, cause, fix in _BNB_ERRORS:
        if re.search(pattern, text or "", re.IGNORECASE):
            return cause, fix
    return ("bitsandbytes failed in its native code",
            "run `python -m bitsandbytes` for its own diagnosis, then pip install --force-reinstall bitsandbytes")
