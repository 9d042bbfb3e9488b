"""Per-model reference figures and DCGM's rule: a figure passes at >= 0.75 x the reference.

Each entry names its source. "measured" figures were read on a machine of that model (the
harness's own runs or the lending service's notes); "datasheet" figures are vendor peaks, used
only where a plain copy or matmul reaches close to them. A GPU or a metric missing from the table
gets its figure reported, never failed.
"""

from __future__ import annotations

from dataclasses import dataclass

from .result import CheckResult

FRACTION = 0.75  # DCGM's diag rule: ~0.75 x a reference for that GPU model
IMPLAUSIBLE = 1.5  # a figure this far above a measured reference is a measuring error, not a fast card


@dataclass(frozen=True)
class Reference:
    value: float
    unit: str
    source: str


METRICS = {
    "d2d_bandwidth": "GB/s",  # device-to-device copy, bytes read + written
    "bf16_matmul": "TFLOP/s",  # dense bf16 GEMM, large square
    "h2d_bandwidth": "GB/s",  # pinned host-to-device
    "allreduce_busbw": "GB/s",  # NCCL all-reduce bus bandwidth, 2 GPUs
    "p2p_bandwidth": "GB/s",  # peer-to-peer copy between two GPUs
}

_DS = "vendor datasheet peak memory bandwidth"
# Keys are matched as substrings of the NVML/torch device name; the longest key that matches wins.
REFERENCES: dict[str, dict[str, Reference]] = {
    "H200": {
        "d2d_bandwidth": Reference(4300, "GB/s", "measured: 4.3 TB/s D2D copy, H200 SXM (device notes KINDS.md, "
                                   "2026-10-28; this suite read 4,269 GB/s on 2026-11-29)"),
        "bf16_matmul": Reference(790, "TFLOP/s", "measured: 769-798 TFLOP/s, 8192^3 bf16 (device notes KINDS.md, "
                                 "2026-11-04; this suite read 779 on 2026-11-29)"),
        "h2d_bandwidth": Reference(55, "GB/s", "measured: 55.0 GB/s pinned, 512 MiB, PCIe Gen5 x16 "
                                   "(this suite on nvidia-h200-x2, 2026-11-29)"),
        "allreduce_busbw": Reference(297, "GB/s", "measured: 297 GB/s busbw, 2 GPUs over NVLink, 256 MiB, "
                                     "NCCL_NVLS_ENABLE=0 (this suite on nvidia-h200-x2, 2026-11-29)"),
        "p2p_bandwidth": Reference(387, "GB/s", "measured: 387 GB/s cuda:0 -> cuda:1 copy, 512 MiB, NVLink "
                                   "(this suite on nvidia-h200-x2, 2026-11-29)"),
    },
    "H100 80GB HBM3": {"d2d_bandwidth": Reference(3350, "GB/s", _DS),
                       "h2d_bandwidth": Reference(50, "GB/s", "PCIe Gen5 x16, ~50 GB/s achievable pinned")},
    "A100-SXM4-80GB": {"d2d_bandwidth": Reference(2039, "GB/s", _DS),
                       "h2d_bandwidth": Reference(25, "GB/s", "PCIe Gen4 x16, ~25 GB/s achievable pinned")},
    "A100-SXM4-40GB": {"d2d_bandwidth": Reference(1555, "GB/s", _DS)},
    "A100-PCIE-40GB": {"d2d_bandwidth": Reference(1555, "GB/s", _DS)},
    "A100 80GB PCIe": {"d2d_bandwidth": Reference(1935, "GB/s", _DS)},
    "A10": {"d2d_bandwidth": Reference(600, "GB/s", _DS)},
    "L4": {"d2d_bandwidth": Reference(300, "GB/s", _DS)},
    "Tesla T4": {"d2d_bandwidth": Reference(320, "GB/s", _DS)},
    "RTX 4090": {"d2d_bandwidth": Reference(1008, "GB/s", _DS)},
    "RTX 4080": {"d2d_bandwidth": Reference(717, "GB/s", _DS)},
    "RTX 4070": {"d2d_bandwidth": Reference(504, "GB/s", _DS)},
    "RTX 4060 Ti": {"d2d_bandwidth": Reference(288, "GB/s", _DS)},
    "RTX 4060": {"d2d_bandwidth": Reference(272, "GB/s", _DS)},
    "RTX 3090": {"d2d_bandwidth": Reference(936, "GB/s", _DS)},
    "RTX 3080": {"d2d_bandwidth": Reference(760, "GB/s", _DS)},
    "RTX 3070": {"d2d_bandwidth": Reference(448, "GB/s", _DS)},
    "RTX 3060 Ti": {"d2d_bandwidth": Reference(448, "GB/s", _DS)},
    "RTX 3060": {"d2d_bandwidth": Reference(360, "GB/s", _DS)},
    "RTX 2080 Ti": {"d2d_bandwidth": Reference(616, "GB/s", _DS)},
    "RTX 2060": {"d2d_bandwidth": Reference(336, "GB/s", _DS)},
}


def reference_for(gpu_name: str, metric: str) -> tuple[str, Reference] | None:
    """(table key, reference) for this GPU and metric, or None."""
    if metric not in METRICS:
        raise KeyError(f"unknown metric {metric!r} (one of {', '.join(METRICS)})")
    hits = [key for key in REFERENCES if key.lower() in gpu_name.lower() and metric in REFERENCES[key]]
    if not hits:
        return None
    key = max(hits, key=len)  # "RTX 4060 Ti" over "RTX 4060"
    return key, REFERENCES[key][metric]


def judge(check: str, metric: str, value: float, gpu_name: str, details: dict | None = None) -> CheckResult:
    """value against FRACTION x the reference; missing reference -> pass with the figure reported."""
    unit = METRICS[metric]
    found = reference_for(gpu_name, metric)
    details = dict(details or {}, value=value, unit=unit, gpu=gpu_name)
    shown = f"{gpu_name}: {value:,.1f} {unit}"
    if found is None:
        return CheckResult(check, "pass", shown, f"no {metric} reference for {gpu_name}: figure reported only",
                           details=details)
    key, ref = found
    floor = FRACTION * ref.value
    details.update(reference=ref.value, reference_source=ref.source, floor=floor, ratio=value / ref.value)
    expectation = f">= {floor:,.0f} {unit} ({FRACTION} x {ref.value:,.0f}, {key}: {ref.source})"
    shown += f" ({value / ref.value:.0%} of reference)"
    if value > IMPLAUSIBLE * ref.value:
        return CheckResult(check, "warn", shown, expectation,
                           f"more than {IMPLAUSIBLE} x the reference: the measurement itself is suspect (timing on "
                           "the wrong device or stream, work skipped); re-run before trusting it", details)
    if value >= floor:
        return CheckResult(check, "pass", shown, expectation, details=details)
    return CheckResult(check, "fail", shown, expectation,
                       "below 0.75 x the reference for this model: check clock throttling and power limit, "
                       "PCIe link (for host copies), other processes on the GPU, then cooling and seating",
                       details)
