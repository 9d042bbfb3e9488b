"""Xid and "fallen off the bus" lines in the kernel log, where the log is readable."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .result import CheckResult

# Xid -> (meaning, fix). From NVIDIA's Xid catalogue; the hardware-side ones fail the check.
XID_HARDWARE = {
    48: ("double-bit ECC error", "reset the GPU or reboot; if it recurs, the card needs service/RMA"),
    61: ("internal micro-controller breakpoint", "update the driver; if it recurs, reboot and report it"),
    62: ("internal micro-controller halt", "update the driver; if it recurs, reboot and report it"),
    63: ("ECC page retirement or row remapping recorded", "reset the GPU or reboot so the remap takes effect"),
    64: ("ECC page retirement or row remapping failed", "the card needs service/RMA"),
    74: ("NVLink error", "check the NVLink bridge or baseboard; reset the GPUs"),
    79: ("GPU has fallen off the bus", "power, thermals or seating: reseat the card, check its power cables and "
         "PSU rating, check cooling; then reboot"),
    92: ("high single-bit ECC error rate", "watch retired pages; plan service if it continues"),
    94: ("contained ECC error", "restart the affected application; reset the GPU if it recurs"),
    95: ("uncontained ECC error", "reset the GPU or reboot; if it recurs, the card needs service/RMA"),
    119: ("GSP RPC timeout", "update the driver; reboot"),
    120: ("GSP error", "update the driver; reboot"),
}
# Usually an application's fault (bad memory access, killed context): a warning, not a hardware verdict.
XID_SOFTWARE = {13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
                45: "preemptive cleanup (a process was killed)", 69: "graphics engine class error"}

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([^)]*)\): (\d+)")
_OFF_BUS = re.compile(r"fallen off the bus", re.IGNORECASE)


@dataclass
class KernelLog:
    lines: list[str] | None  # None: not readable
    source: str  # "dmesg", "/var/log/kern.log", or why it could not be read


def read_kernel_log() -> KernelLog:
    """dmesg first (may need privileges), then /var/log/kern.log; never raises."""
    reasons = []
    try:
        proc = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10)
        if proc.returncode == 0 and proc.stdout.strip():
            return KernelLog(proc.stdout.splitlines(), "dmesg")
        reasons.append(f"dmesg: {(proc.stderr.strip().splitlines() or ['no output'])[0]}")
    except (OSError, subprocess.TimeoutExpired) as exc:
        reasons.append(f"dmesg: {type(exc).__name__}")
    for path in ("/var/log/kern.log", "/var/log/messages"):
        try:
            text = Path(path).read_text(errors="replace")
            return KernelLog(text.splitlines()[-200000:], path)
        except OSError as exc:
            reasons.append(f"{path}: {exc.strerror or type(exc).__name__}")
    return KernelLog(None, "; ".join(reasons))


def check_kernel_log(log: KernelLog) -> CheckResult:
    check, exp = "kernel_log_xid", "no hardware Xid and no 'fallen off the bus' in the kernel log"
    if log.lines is None:
        return CheckResult(check, "skip", f"kernel log not readable ({log.source})", exp)
    hardware: dict[int, int] = {}
    software: dict[int, int] = {}
    off_bus = 0
    samples: list[str] = []
    for line in log.lines:
        if _OFF_BUS.search(line):
            off_bus += 1
            samples.append(line.strip())
        m = _XID.search(line)
        if not m:
            continue
        xid = int(m.group(2))
        bucket = software if xid in XID_SOFTWARE else hardware  # an unlisted Xid counts as hardware
        bucket[xid] = bucket.get(xid, 0) + 1
        if len(samples) < 5:
            samples.append(line.strip())
    details = {"source": log.source, "hardware_xids": hardware, "software_xids": software,
               "fallen_off_bus": off_bus, "samples": samples[:5]}
    if off_bus:
        hardware[79] = hardware.get(79, 0) + (0 if 79 in hardware else off_bus)
    if hardware:
        parts = [f"Xid {x} x{n} ({XID_HARDWARE.get(x, ('unlisted Xid', ''))[0]})" for x, n in sorted(hardware.items())]
        fixes = [f"Xid {x}: {XID_HARDWARE[x][1]}" for x in sorted(hardware) if x in XID_HARDWARE]
        return CheckResult(check, "fail", f"{log.source}: " + ", ".join(parts), exp,
                           "; ".join(fixes) or "look the Xid up in NVIDIA's Xid catalogue", details)
    if software:
        parts = [f"Xid {x} x{n} ({XID_SOFTWARE[x]})" for x, n in sorted(software.items())]
        return CheckResult(check, "warn", f"{log.source}: " + ", ".join(parts), exp,
                           "usually an application fault (bad memory access, killed process); if it comes with "
                           "crashes of known-good code, suspect the driver or the card", details)
    return CheckResult(check, "pass", f"{log.source}: {len(log.lines)} lines, no Xid", exp, details=details)
