"""Common cards by name: the memory CUDA reports as total, and the compute capability.

The total is what `torch.cuda.mem_get_info()` (cudaMemGetInfo) returns, which is what vLLM
multiplies by `--gpu-memory-utilization`: less than the marketing size, because the driver keeps
part of the memory (and ECC, where it is on, takes more). It moves by a few tens of MiB between
drivers, so treat it as +-0.1 GiB; pass an exact size (`--gpu-memory 14.74GiB`) when you know it.
Where a published vLLM start-up log printed the total, that figure is used (noted as `log`);
otherwise the total PyTorch reports in its out-of-memory messages for that card (`oom`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...errors import UsageError

GiB = 1024**3


@dataclass(frozen=True)
class Gpu:
    name: str
    total_bytes: int
    compute_capability: tuple[int, int]
    source: str  # where the total comes from

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GiB

    @property
    def supports_bf16(self) -> bool:
        return self.compute_capability >= (8, 0)

    @property
    def has_marlin(self) -> bool:
        """vLLM runs AWQ/GPTQ/compressed-tensors 4-bit through Marlin kernels from sm80 on; older
        cards use kernels that dequantize a whole weight for large batches."""
        return self.compute_capability >= (8, 0)


def _g(name: str, total_gib: float, cc: tuple[int, int], source: str) -> Gpu:
    return Gpu(name, int(round(total_gib * GiB)), cc, source)


# key -> card; keys are lower-case with spaces/underscores folded to '-' (see gpu_by_name)
GPUS: dict[str, Gpu] = {
    "rtx-2060-6gb": _g("RTX 2060 6GB", 5.79, (7, 5), "oom"),
    "rtx-2060-12gb": _g("RTX 2060 12GB", 11.76, (7, 5), "oom"),
    "rtx-3060-6gb": _g("RTX 3060 Laptop 6GB", 5.80, (8, 6), "oom"),
    "rtx-3060-12gb": _g("RTX 3060 12GB", 11.76, (8, 6), "oom"),
    "rtx-3070-8gb": _g("RTX 3070 8GB", 7.79, (8, 6), "oom"),
    "rtx-3080-10gb": _g("RTX 3080 10GB", 9.77, (8, 6), "oom"),
    "rtx-3090": _g("RTX 3090 24GB", 23.57, (8, 6), "log (23.55-23.58)"),
    "rtx-4050-6gb": _g("RTX 4050 Laptop 6GB", 5.80, (8, 9), "oom"),
    "rtx-4060-8gb": _g("RTX 4060 8GB", 7.75, (8, 9), "oom"),
    "rtx-4060-ti-16gb": _g("RTX 4060 Ti 16GB", 15.70, (8, 9), "oom"),
    "rtx-4070-12gb": _g("RTX 4070 12GB", 11.72, (8, 9), "oom"),
    "rtx-4080-16gb": _g("RTX 4080 16GB", 15.69, (8, 9), "oom"),
    "rtx-4090": _g("RTX 4090 24GB", 23.55, (8, 9), "log"),
    "rtx-5090": _g("RTX 5090 32GB", 31.36, (12, 0), "log"),
    "gtx-1080": _g("GTX 1080 8GB", 7.92, (6, 1), "log"),
    "t4": _g("Tesla T4 16GB", 14.74, (7, 5), "log (Colab; some T4s report 14.56)"),
    "v100-16gb": _g("V100 16GB", 15.77, (7, 0), "oom"),
    "v100-32gb": _g("V100 32GB", 31.74, (7, 0), "log"),
    "a10": _g("A10 / A10G 24GB", 22.19, (8, 6), "oom"),
    "l4": _g("L4 24GB", 22.16, (8, 9), "oom"),
    "l40s": _g("L40S 48GB", 44.31, (8, 9), "log (requested 39.88 GiB at 0.90)"),
    "a100-40gb": _g("A100 40GB", 39.39, (8, 0), "oom (SXM4; Colab's reports 39.56)"),
    "a100-80gb": _g("A100 80GB", 79.15, (8, 0), "log (SXM4; PCIe reports 79.25)"),
    "h100": _g("H100 80GB", 79.19, (9, 0), "log (SXM; PCIe reports 79.25)"),
    "h200": _g("H200 141GB", 139.80, (9, 0), "log"),
}

ALIASES: dict[str, str] = {
    "2060": "rtx-2060-6gb", "rtx-2060": "rtx-2060-6gb",
    "3060": "rtx-3060-12gb", "rtx-3060": "rtx-3060-12gb", "rtx-3060-laptop": "rtx-3060-6gb",
    "3070": "rtx-3070-8gb", "rtx-3070": "rtx-3070-8gb", "3080": "rtx-3080-10gb", "rtx-3080": "rtx-3080-10gb",
    "3090": "rtx-3090", "rtx-3090-24gb": "rtx-3090",
    "4050": "rtx-4050-6gb", "rtx-4050": "rtx-4050-6gb",
    "4060": "rtx-4060-8gb", "rtx-4060": "rtx-4060-8gb", "rtx-4060-ti": "rtx-4060-ti-16gb",
    "4070": "rtx-4070-12gb", "rtx-4070": "rtx-4070-12gb", "4080": "rtx-4080-16gb", "rtx-4080": "rtx-4080-16gb",
    "4090": "rtx-4090", "rtx-4090-24gb": "rtx-4090", "5090": "rtx-5090", "rtx-5090-32gb": "rtx-5090",
    "1080": "gtx-1080", "tesla-t4": "t4", "v100": "v100-16gb", "a10g": "a10", "a10-24gb": "a10",
    "l4-24gb": "l4", "a100": "a100-40gb", "a100-40": "a100-40gb", "a100-80": "a100-80gb",
    "h100-80gb": "h100", "h200-141gb": "h200",
}


def _fold(text: str) -> str:
    key = re.sub(r"[\s_]+", "-", text.strip().lower())
    key = re.sub(r"^(nvidia|geforce)-", "", key)
    key = re.sub(r"^(geforce)-", "", key)
    key = re.sub(r"^(rtx|gtx)(\d)", r"\1-\2", key)  # rtx3060-6gb as rtx-3060-6gb
    key = re.sub(r"(\d)(ti)\b", r"\1-\2", key)  # 4060ti as 4060-ti
    return key


def gpu_by_name(name: str) -> Gpu | None:
    key = _fold(name)
    if key in GPUS:
        return GPUS[key]
    if key in ALIASES:
        return GPUS[ALIASES[key]]
    return None


def known_names() -> list[str]:
    return sorted(GPUS)


def resolve_gpu(spec: str) -> Gpu:
    """A GPU from a table name ("t4", "RTX 3060 6GB", "a100-80gb") or a size ("6GiB", "14.74GiB").
    A bare size gives a card of unknown kind, assumed sm80+ (bf16, Marlin kernels)."""
    from ...units import parse_bytes

    card = gpu_by_name(spec)
    if card is not None:
        return card
    try:
        total = parse_bytes(spec, "--gpu-memory")
    except UsageError as exc:
        if str(spec).strip()[:1].isdigit():  # a size with a missing or unclear unit: say which
            raise UsageError(f"{exc} (or a known card: {', '.join(known_names())})") from None
        raise UsageError(f"--gpu-memory: {spec!r} is neither a size (e.g. 6GiB) nor a known card "
                         f"({', '.join(known_names())})") from None
    return Gpu(f"{total / GiB:.2f} GiB card", total, (8, 0), "given")
