"""NVIDIA GPUs on the PCI bus, read from sysfs: the one probe that sees a card whose driver is missing.

NVML, torch and /dev/nvidia* all need a working driver; the kernel lists every PCI function under
/sys/bus/pci/devices whatever is bound to it. A function with vendor 0x10de and base class 0x03
(display controller: 0x0300 VGA, 0x0302 3D controller) is an NVIDIA GPU. The sysfs root is
$HARNESS_SYSFS_ROOT (else /sys), resolved here only, so a test can point it at a fake tree.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SYSFS_ENV = "HARNESS_SYSFS_ROOT"
NVIDIA_VENDOR = 0x10DE
DISPLAY_CLASS = 0x03  # PCI base class "display controller"


@dataclass
class PciGpu:
    address: str  # 0000:01:00.0
    device_id: str  # 0x2684
    pci_class: str  # 0x030000
    kernel_driver: str | None  # the driver bound to it (nvidia, nouveau, vfio-pci) or None

    def describe(self) -> str:
        bound = f"bound to {self.kernel_driver}" if self.kernel_driver else "no kernel driver bound"
        return f"{self.address} [10de:{self.device_id.removeprefix('0x')}], {bound}"


def sysfs_root() -> Path:
    """Where sysfs is: $HARNESS_SYSFS_ROOT, else /sys."""
    return Path(os.environ.get(SYSFS_ENV) or "/sys")


def _hex(path: Path) -> int | None:
    try:
        return int(path.read_text().strip(), 16)
    except (OSError, ValueError):
        return None


def nvidia_gpus(root: Path | None = None) -> list[PciGpu] | None:
    """Every NVIDIA display-class function on the PCI bus; None when the bus cannot be read here
    (no sysfs: then only the driver probes can tell)."""
    devices = (root or sysfs_root()) / "bus" / "pci" / "devices"
    try:
        entries = sorted(devices.iterdir())
    except OSError:
        return None
    found = []
    for entry in entries:
        vendor, pci_class = _hex(entry / "vendor"), _hex(entry / "class")
        if vendor != NVIDIA_VENDOR or pci_class is None or pci_class >> 16 != DISPLAY_CLASS:
            continue
        device = _hex(entry / "device")
        driver = entry / "driver"
        found.append(PciGpu(entry.name, f"0x{device:04x}" if device is not None else "unknown",
                            f"0x{pci_class:06x}", os.path.basename(os.readlink(driver)) if driver.is_symlink() else None))
    return found


def from_dicts(rows: list[dict] | None) -> list[PciGpu] | None:
    """pci_gpus back from a results file's environment (None: not probed, or an older file)."""
    return None if rows is None else [PciGpu(**row) for row in rows]


def missing_driver_fix(gpus: list[PciGpu]) -> str:
    """What to do about NVIDIA GPUs that no working NVIDIA driver serves."""
    bound = {g.kernel_driver for g in gpus}
    if "nouveau" in bound:
        return ("the open-source nouveau driver holds the card: install the NVIDIA driver (>= 580 for CUDA 13, "
                ">= 525 for CUDA 12; e.g. `sudo ubuntu-drivers install`), which blacklists nouveau, then reboot")
    if "vfio-pci" in bound:
        return "the card is bound to vfio-pci (passed through to a VM): unbind it, or run the harness inside that VM"
    return ("install the NVIDIA driver (>= 580 for CUDA 13, >= 525 for CUDA 12; e.g. `sudo ubuntu-drivers install` "
            "or the CUDA repository's cuda-drivers package), then reboot (a driver installed or updated without "
            "a reboot is not loaded)")


def gpus_line(gpus: list[PciGpu]) -> str:
    """'1 NVIDIA GPU on the PCI bus (0000:01:00.0 [10de:2684], no kernel driver bound)'"""
    plural = "GPU" if len(gpus) == 1 else "GPUs"
    return f"{len(gpus)} NVIDIA {plural} on the PCI bus ({'; '.join(g.describe() for g in gpus)})"
