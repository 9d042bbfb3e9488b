"""--deep: read every tensor in bounded memory and look for NaN, Inf and all-zero weights.

Each tensor is read in chunks of at most CHUNK_BYTES with readinto() into one reused buffer (no
mmap: mapped pages would count as resident memory), so peak memory does not grow with the model.
"""

from __future__ import annotations

import sys
import time

from .findings import Collector
from .paths import DirView
from .safetensors_header import SafetensorsHeader, TensorInfo

CHUNK_BYTES = 16 * 1024 * 1024
TORCH_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64"}


class TensorStats:
    __slots__ = ("nan", "inf", "nonzero")

    def __init__(self) -> None:
        self.nan = 0
        self.inf = 0
        self.nonzero = False


def scan_file(view: DirView, rel: str, header: SafetensorsHeader, out: Collector,
              progress: bool = False, chunk_bytes: int = CHUNK_BYTES) -> dict[str, TensorStats]:
    import torch

    buffer = bytearray(chunk_bytes)
    stats: dict[str, TensorStats] = {}
    started = last_note = time.monotonic()
    done = 0
    total = sum(t.end - t.begin for t in header.tensors.values())
    with view.open_binary(rel) as fh:
        for info in sorted(header.tensors.values(), key=lambda t: t.begin):
            dtype = getattr(torch, TORCH_DTYPES[info.dtype]) if info.dtype in TORCH_DTYPES else None
            item = _itemsize(info)
            step = max(item, chunk_bytes - chunk_bytes % max(item, 1))
            s = TensorStats()
            fh.seek(header.data_start + info.begin)
            remaining = info.end - info.begin
            while remaining > 0:
                n = min(step, remaining)
                view_mem = memoryview(buffer)[:n]
                got = fh.readinto(view_mem)
                if got != n:
                    raise OSError(f"short read in {info.name}")
                remaining -= n
                if dtype is not None:
                    t = torch.frombuffer(view_mem, dtype=dtype)
                    if not bool(torch.isfinite(t).all()):  # the common case costs one pass
                        s.nan += int(torch.isnan(t).sum())
                        s.inf += int(torch.isinf(t).sum())
                    if not s.nonzero:
                        s.nonzero = bool(t.any())
                elif not s.nonzero:
                    s.nonzero = any(view_mem)
                done += n
                if progress and time.monotonic() - last_note > 2:
                    last_note = time.monotonic()
                    print(f"\r[check-dir --deep] {rel}: {done / max(total, 1):6.1%}", end="", file=sys.stderr, flush=True)
            stats[info.name] = s
            _report(info, s, rel, out)
    if progress and time.monotonic() - started > 2:
        print(f"\r[check-dir --deep] {rel}: done in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    return stats


def _itemsize(info: TensorInfo) -> int:
    from .safetensors_header import DTYPE_BITS

    return max(1, DTYPE_BITS[info.dtype] // 8)


def _report(info: TensorInfo, s: TensorStats, rel: str, out: Collector) -> None:
    n = max(info.numel, 1)
    if s.nan:
        out.add("tensor.nan", rel, f"{info.name}: {s.nan} NaN of {n} values ({s.nan / n:.2%}): the training or merge "
                "diverged; go back to the last finite checkpoint (merge with safe_merge=True to catch it)")
    if s.inf:
        out.add("tensor.inf", rel, f"{info.name}: {s.inf} Inf of {n} values: overflow (fp16?); re-merge in bf16 or fp32")
    if not s.nonzero and len(info.shape) >= 2 and info.numel > 0:
        out.add("tensor.all_zero", rel, f"{info.name} {list(info.shape)} is all zeros: a weight matrix that was never "
                "trained or was zeroed while saving; check the source checkpoint")


def tensors_equal(view: DirView, a: tuple[str, SafetensorsHeader, TensorInfo],
                  b: tuple[str, SafetensorsHeader, TensorInfo], chunk_bytes: int = CHUNK_BYTES) -> bool:
    """Byte-compare two stored tensors chunk by chunk (same dtype and shape assumed)."""
    (rel_a, head_a, ta), (rel_b, head_b, tb) = a, b
    if ta.dtype != tb.dtype or ta.shape != tb.shape:
        return False
    with view.open_binary(rel_a) as fa, view.open_binary(rel_b) as fb:
        fa.seek(head_a.data_start + ta.begin)
        fb.seek(head_b.data_start + tb.begin)
        remaining = ta.end - ta.begin
        while remaining > 0:
            n = min(chunk_bytes, remaining)
            if fa.read(n) != fb.read(n):
                return False
            remaining -= n
    return True
