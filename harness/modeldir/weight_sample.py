"""The default check's look at the weights' values: a bounded sample of every floating tensor.

A tensor is sampled at SAMPLES places (its start, middle and end), SAMPLE_BYTES each, at most
BUDGET_BYTES for the directory, so the cost does not grow with the model. A region SEEK_DATA
says is a hole of a sparse file is zeros without being read. NaN or Inf in a sample is an error
(tensor.nan / tensor.inf); a weight matrix whose every sampled value is the same (all zeros, a
hole, a constant) is an error too (tensor.all_zero / tensor.constant): a trained matrix never is.
`--deep` reads every value instead (harness.modeldir.deep).
"""

from __future__ import annotations

from .findings import Collector
from .format_reads import hole_from
from .paths import DirView
from .safetensors_header import SafetensorsHeader, TensorInfo

SAMPLES = 3
SAMPLE_BYTES = 4096
BUDGET_BYTES = 32 * 1024 * 1024
NUMPY_DTYPES = {"F16": "float16", "F32": "float32", "F64": "float64", "BF16": "bfloat16"}


def sample_weights(view: DirView, headers: dict[str, SafetensorsHeader], out: Collector) -> None:
    budget = BUDGET_BYTES
    for rel, header in headers.items():
        with view.open_binary(rel) as fh:
            fd = fh._fh.fileno()
            for info in sorted(header.tensors.values(), key=lambda t: t.begin):
                if info.dtype not in NUMPY_DTYPES or info.numel < 2 or budget <= 0:
                    continue
                values, hole, cost = _sample(fh, fd, header, info)
                budget -= cost
                _judge(rel, info, values, hole, out)


def _sample(fh, fd: int, header: SafetensorsHeader, info: TensorInfo):
    item = 2 if info.dtype in ("F16", "BF16") else 4 if info.dtype == "F32" else 8
    begin, end = header.data_start + info.begin, header.data_start + info.end
    if hole_from(fd, begin, end):
        return None, True, 0
    span = min(SAMPLE_BYTES - SAMPLE_BYTES % item, end - begin)
    starts = sorted({begin, begin + ((end - begin) // 2 - span // 2) // item * item, end - span})
    chunks = []
    for start in starts[:SAMPLES]:
        fh.seek(start)
        chunks.append(fh.read(span))
    data = bytearray(b"".join(chunks))
    data = data[: len(data) - len(data) % item]
    if not data:
        return None, False, 0
    return _as_float32(bytes(data), info.dtype), False, len(data)


def _as_float32(data: bytes, dtype: str):
    """The values as float32, as torch.frombuffer(...).float() gives them (without importing torch):
    bf16 is the upper half of a float32, so widening it is exact; F64 narrows (overflow -> inf)."""
    import numpy as np

    if dtype == "BF16":
        return (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    with np.errstate(over="ignore"):
        return np.frombuffer(data, dtype="<" + {"F16": "f2", "F32": "f4", "F64": "f8"}[dtype]).astype(np.float32)


def _judge(rel: str, info: TensorInfo, values, hole: bool, out: Collector) -> None:
    import numpy as np

    matrix = len(info.shape) >= 2 and info.name.endswith("weight")
    where = f"{info.name} {list(info.shape)}"
    if hole:
        if matrix:
            out.add("tensor.all_zero", rel, f"{where}: its bytes are a hole of a sparse file (all zeros, never "
                    "written): the save or copy did not finish; copy the weights again")
        return
    nan, inf = int(np.isnan(values).sum()), int(np.isinf(values).sum())
    if nan:
        out.add("tensor.nan", rel, f"{where}: {nan} NaN in {values.size} sampled values: the training or merge "
                "diverged; go back to the last finite checkpoint (merge with safe_merge=True to catch it)")
    if inf:
        out.add("tensor.inf", rel, f"{where}: {inf} Inf in {values.size} sampled values: overflow (fp16?); "
                "re-merge in bf16 or fp32")
    if matrix and not (nan or inf) and values.size > 1 and bool((values == values[0]).all()):
        if float(values[0]) == 0.0:
            out.add("tensor.all_zero", rel, f"{where}: all {values.size} sampled values are zero (start, middle, "
                    "end): a weight matrix that was never trained or was zeroed while saving; check the source "
                    "checkpoint (--deep reads every value)")
        else:
            out.add("tensor.constant", rel, f"{where}: all {values.size} sampled values are {float(values[0]):g}: "
                    "a weight matrix is never constant once trained; check the source checkpoint")
