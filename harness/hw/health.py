"""NVML health: ECC, retired/remapped pages, clock-throttle reasons, PCIe link, temperature, power.

`read_health()` reads what NVML offers (a field a card does not support stays None: consumer
cards have no ECC, no row remapping); the `check_*` rules are pure and take a GpuHealth, so tests
can feed them a throttling or failing card.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .result import CheckResult

# nvmlClocksEventReason* bits (same values as the older nvmlClocksThrottleReason*).
THROTTLE_BITS = {
    0x1: "GpuIdle",
    0x2: "ApplicationsClocksSetting",
    0x4: "SwPowerCap",
    0x8: "HwSlowdown",
    0x10: "SyncBoost",
    0x20: "SwThermalSlowdown",
    0x40: "HwThermalSlowdown",
    0x80: "HwPowerBrakeSlowdown",
    0x100: "DisplayClockSetting",
}
# Reasons that mean the hardware is protecting itself: heat, power delivery, an external brake.
BAD_THROTTLE = {
    0x8: "HW slowdown (overheating or a power-supply problem asserted by the board)",
    0x20: "software thermal slowdown (the GPU is running too hot)",
    0x40: "hardware thermal slowdown (the GPU is overheating)",
    0x80: "hardware power brake (the PSU or system asserted an external power brake)",
}
RETIRED_PAGES_LIMIT = 60  # DCGM's rule: pages retired for SBE + DBE beyond this means replace the card


@dataclass
class GpuHealth:
    index: int
    name: str
    ecc_enabled: bool | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    ecc_volatile_corrected: int | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    remapped_correctable: int | None = None
    remapped_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    throttle_reasons: int | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_max_gen: int | None = None  # the link's max (GPU and slot together)
    pcie_max_width: int | None = None
    pcie_gpu_max_gen: int | None = None  # the card's own max
    temperature_c: int | None = None
    temp_slowdown_c: int | None = None
    temp_shutdown_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    power_default_limit_w: float | None = None
    errors: dict[str, str] = field(default_factory=dict)  # field -> why NVML could not read it

    @property
    def label(self) -> str:
        return f"GPU{self.index} ({self.name})"


def _read(h: GpuHealth, key: str, fn):
    try:
        return fn()
    except Exception as exc:  # NVMLError_NotSupported on consumer cards, NoPermission in containers
        h.errors[key] = type(exc).__name__
        return None


def read_health(indices: list[int] | None = None) -> list[GpuHealth]:
    """Read every field NVML offers for each GPU (all by default). Returns [] without NVML."""
    try:
        import pynvml as N
        N.nvmlInit()
    except Exception:
        return []
    out = []
    try:
        count = N.nvmlDeviceGetCount()
        for i in (range(count) if indices is None else indices):
            d = N.nvmlDeviceGetHandleByIndex(i)
            name = N.nvmlDeviceGetName(d)
            h = GpuHealth(i, name.decode() if isinstance(name, bytes) else str(name))
            mode = _read(h, "ecc", lambda: N.nvmlDeviceGetEccMode(d))
            if mode is not None:
                h.ecc_enabled = bool(mode[0])
                if h.ecc_enabled:
                    unc, cor = N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, N.NVML_MEMORY_ERROR_TYPE_CORRECTED
                    h.ecc_volatile_uncorrected = _read(h, "ecc_volatile", lambda: N.nvmlDeviceGetTotalEccErrors(d, unc, N.NVML_VOLATILE_ECC))
                    h.ecc_aggregate_uncorrected = _read(h, "ecc_aggregate", lambda: N.nvmlDeviceGetTotalEccErrors(d, unc, N.NVML_AGGREGATE_ECC))
                    h.ecc_volatile_corrected = _read(h, "ecc_corrected", lambda: N.nvmlDeviceGetTotalEccErrors(d, cor, N.NVML_VOLATILE_ECC))
            sbe = _read(h, "retired_sbe", lambda: N.nvmlDeviceGetRetiredPages(d, N.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS))
            dbe = _read(h, "retired_dbe", lambda: N.nvmlDeviceGetRetiredPages(d, N.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR))
            h.retired_pages_sbe = None if sbe is None else len(sbe)
            h.retired_pages_dbe = None if dbe is None else len(dbe)
            pending = _read(h, "retired_pending", lambda: N.nvmlDeviceGetRetiredPagesPendingStatus(d))
            h.retired_pages_pending = None if pending is None else bool(pending)
            rows = _read(h, "remapped_rows", lambda: N.nvmlDeviceGetRemappedRows(d))
            if rows is not None:
                h.remapped_correctable, h.remapped_uncorrectable = int(rows[0]), int(rows[1])
                h.remap_pending, h.remap_failure = bool(rows[2]), bool(rows[3])
            getter = getattr(N, "nvmlDeviceGetCurrentClocksEventReasons", None) or N.nvmlDeviceGetCurrentClocksThrottleReasons
            h.throttle_reasons = _read(h, "throttle", lambda: int(getter(d)))
            h.pcie_gen = _read(h, "pcie_gen", lambda: N.nvmlDeviceGetCurrPcieLinkGeneration(d))
            h.pcie_width = _read(h, "pcie_width", lambda: N.nvmlDeviceGetCurrPcieLinkWidth(d))
            h.pcie_max_gen = _read(h, "pcie_max_gen", lambda: N.nvmlDeviceGetMaxPcieLinkGeneration(d))
            h.pcie_max_width = _read(h, "pcie_max_width", lambda: N.nvmlDeviceGetMaxPcieLinkWidth(d))
            h.pcie_gpu_max_gen = _read(h, "pcie_gpu_max_gen", lambda: N.nvmlDeviceGetGpuMaxPcieLinkGeneration(d))
            h.temperature_c = _read(h, "temperature", lambda: N.nvmlDeviceGetTemperature(d, N.NVML_TEMPERATURE_GPU))
            h.temp_slowdown_c = _read(h, "temp_slowdown", lambda: N.nvmlDeviceGetTemperatureThreshold(d, N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN))
            h.temp_shutdown_c = _read(h, "temp_shutdown", lambda: N.nvmlDeviceGetTemperatureThreshold(d, N.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN))
            mw = _read(h, "power", lambda: N.nvmlDeviceGetPowerUsage(d))
            h.power_w = None if mw is None else mw / 1000
            lim = _read(h, "power_limit", lambda: N.nvmlDeviceGetEnforcedPowerLimit(d))
            h.power_limit_w = None if lim is None else lim / 1000
            dlim = _read(h, "power_default_limit", lambda: N.nvmlDeviceGetPowerManagementDefaultLimit(d))
            h.power_default_limit_w = None if dlim is None else dlim / 1000
            out.append(h)
    finally:
        try:
            N.nvmlShutdown()
        except Exception:
            pass
    return out


def running_processes(index: int) -> list[tuple[int, str, int | None]]:
    """(pid, process name, GPU memory bytes) of compute processes on a GPU, names via psutil."""
    try:
        import pynvml as N
        N.nvmlInit()
    except Exception:
        return []
    try:
        d = N.nvmlDeviceGetHandleByIndex(index)
        procs = N.nvmlDeviceGetComputeRunningProcesses(d)
    except Exception:
        return []
    finally:
        try:
            N.nvmlShutdown()
        except Exception:
            pass
    out = []
    for p in procs:
        try:
            import psutil
            name = psutil.Process(p.pid).name()
        except Exception:
            name = "?"  # another container's pid namespace, or already gone
        used = getattr(p, "usedGpuMemory", None)
        out.append((int(p.pid), name, int(used) if used else None))
    return out


def _unsupported(check: str, h: GpuHealth, what: str, expectation: str) -> CheckResult:
    return CheckResult(check, "skip", f"{h.label}: {what} not reported by NVML on this card", expectation)


def check_ecc(h: GpuHealth) -> CheckResult:
    check, exp = "ecc_errors", "no uncorrectable ECC errors since boot"
    if h.ecc_enabled is None:
        return _unsupported(check, h, "ECC", exp)
    if not h.ecc_enabled:
        return CheckResult(check, "pass", f"{h.label}: ECC supported but disabled", exp)
    value = (f"{h.label}: volatile uncorrected {h.ecc_volatile_uncorrected}, aggregate uncorrected "
             f"{h.ecc_aggregate_uncorrected}, volatile corrected {h.ecc_volatile_corrected}")
    if h.ecc_volatile_uncorrected:
        return CheckResult(check, "fail", value, exp,
                           "uncorrectable memory errors since boot: results may be corrupt; reset the GPU or "
                           "reboot, run --hw-level full, and if they recur the card needs service/RMA")
    if h.ecc_aggregate_uncorrected:
        return CheckResult(check, "warn", value, exp,
                           "uncorrectable errors in the card's lifetime history: watch for more, check retired/"
                           "remapped pages")
    return CheckResult(check, "pass", value, exp)


def check_retired_pages(h: GpuHealth) -> CheckResult:
    check, exp = "retired_pages", f"no pending retirement or remap, fewer than {RETIRED_PAGES_LIMIT} retired pages"
    have_retired = h.retired_pages_sbe is not None or h.retired_pages_dbe is not None
    have_remap = h.remap_pending is not None
    if not have_retired and not have_remap:
        return _unsupported(check, h, "page retirement / row remapping", exp)
    parts = []
    if have_retired:
        parts.append(f"retired pages SBE {h.retired_pages_sbe} DBE {h.retired_pages_dbe}, pending {h.retired_pages_pending}")
    if have_remap:
        parts.append(f"remapped rows correctable {h.remapped_correctable} uncorrectable "
                     f"{h.remapped_uncorrectable}, pending {h.remap_pending}, failure {h.remap_failure}")
    value = f"{h.label}: " + "; ".join(parts)
    if h.remap_failure:
        return CheckResult(check, "fail", value, exp,
                           "row remapping failed (no spare rows left): the card needs service/RMA")
    if h.remap_pending or h.retired_pages_pending:
        return CheckResult(check, "fail", value, exp,
                           "a memory page is waiting to be retired/remapped: reset the GPU or reboot to apply it")
    retired = (h.retired_pages_sbe or 0) + (h.retired_pages_dbe or 0)
    if retired >= RETIRED_PAGES_LIMIT:
        return CheckResult(check, "fail", value, exp,
                           f"{retired} pages retired (>= {RETIRED_PAGES_LIMIT}): the card's memory is failing; RMA")
    return CheckResult(check, "pass", value, exp)


def decode_throttle(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit]


def check_throttle(h: GpuHealth) -> CheckResult:
    check, exp = "clock_throttle", "no thermal, HW-slowdown or power-brake throttling"
    if h.throttle_reasons is None:
        return _unsupported(check, h, "clock-throttle reasons", exp)
    names = decode_throttle(h.throttle_reasons) or ["none"]
    value = f"{h.label}: {', '.join(names)} (0x{h.throttle_reasons:x})"
    if h.temperature_c is not None:
        value += f" at {h.temperature_c} C"
    bad = [text for bit, text in BAD_THROTTLE.items() if h.throttle_reasons & bit]
    if bad:
        return CheckResult(check, "fail", value, exp,
                           "; ".join(bad) + ": check airflow, fans and dust, the power cables and PSU rating, "
                           "and that the card is seated; sustained throttling cuts throughput")
    if h.throttle_reasons & 0x4:
        return CheckResult(check, "warn", value, exp,
                           "clocks held at the power cap: normal under full load, suspicious when idle; check "
                           "nvidia-smi -q -d POWER for a lowered power limit")
    return CheckResult(check, "pass", value, exp)


def check_pcie(h: GpuHealth, under_load: bool = True) -> CheckResult:
    """Current link against the max. Read it under load: idle links drop their generation to save power."""
    check, exp = "pcie_link", "current PCIe generation and width equal the link's max (under load)"
    if h.pcie_gen is None or h.pcie_max_gen is None:
        return _unsupported(check, h, "PCIe link", exp)
    value = (f"{h.label}: Gen{h.pcie_gen} x{h.pcie_width} (link max Gen{h.pcie_max_gen} x{h.pcie_max_width}"
             + (f", card max Gen{h.pcie_gpu_max_gen}" if h.pcie_gpu_max_gen else "") + ")")
    if h.pcie_width is not None and h.pcie_max_width and h.pcie_width < h.pcie_max_width:
        return CheckResult(check, "fail", value, exp,
                           f"the link trained at x{h.pcie_width} of x{h.pcie_max_width}: reseat the card, use a "
                           "full-width slot, check risers and BIOS lane settings")
    if h.pcie_gen < h.pcie_max_gen and not under_load:
        return CheckResult(check, "warn", value + " read at idle", exp,
                           "idle links drop their generation to save power: re-run with a usable GPU so the check "
                           "reads the link under load")
    if h.pcie_gen < h.pcie_max_gen:
        return CheckResult(check, "fail", value, exp,
                           f"the link runs at Gen{h.pcie_gen} under load, below its Gen{h.pcie_max_gen}: reseat the "
                           "card, check the riser/slot and the BIOS PCIe speed setting")
    if h.pcie_gpu_max_gen and h.pcie_max_gen < h.pcie_gpu_max_gen:
        return CheckResult(check, "warn", value, exp,
                           f"the slot limits the card to Gen{h.pcie_max_gen} (it can do Gen{h.pcie_gpu_max_gen}): "
                           "host-to-device copies (model loading, offload) are slower")
    return CheckResult(check, "pass", value, exp)


def check_temperature(h: GpuHealth, margin_c: int = 5) -> CheckResult:
    check = "temperature"
    exp = (f"below the slowdown threshold ({h.temp_slowdown_c} C) by {margin_c} C" if h.temp_slowdown_c
           else "below the slowdown threshold")
    if h.temperature_c is None:
        return _unsupported(check, h, "temperature", exp)
    value = f"{h.label}: {h.temperature_c} C (slowdown {h.temp_slowdown_c} C, shutdown {h.temp_shutdown_c} C)"
    if h.temp_slowdown_c and h.temperature_c >= h.temp_slowdown_c:
        return CheckResult(check, "fail", value, exp,
                           "the GPU is at its slowdown temperature: improve airflow, clean fans and heatsink, "
                           "check the fan curve and thermal paste/pads")
    if h.temp_slowdown_c and h.temperature_c >= h.temp_slowdown_c - margin_c:
        return CheckResult(check, "warn", value, exp, "close to thermal slowdown: improve cooling before long runs")
    return CheckResult(check, "pass", value, exp)


def check_power(h: GpuHealth) -> CheckResult:
    check, exp = "power", "draw below the enforced limit, and the limit at its default"
    if h.power_w is None or h.power_limit_w is None:
        return _unsupported(check, h, "power draw", exp)
    value = f"{h.label}: {h.power_w:.0f} W of {h.power_limit_w:.0f} W limit"
    if h.power_default_limit_w:
        value += f" (default {h.power_default_limit_w:.0f} W)"
    if h.power_default_limit_w and h.power_limit_w < 0.9 * h.power_default_limit_w:
        return CheckResult(check, "warn", value, exp,
                           f"the power limit was lowered to {h.power_limit_w:.0f} W: throughput figures will be "
                           "low; restore it with nvidia-smi -pl if that was not intended")
    if h.power_w > h.power_limit_w * 1.05:
        return CheckResult(check, "fail", value, exp,
                           "drawing above the enforced limit: the power sensor or board is suspect")
    return CheckResult(check, "pass", value, exp)
