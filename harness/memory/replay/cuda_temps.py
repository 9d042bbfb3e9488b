"""The temporaries CUDA kernels allocate that the meta device does not (safe softmax, bitsandbytes' gemm_4bit
and quantize_4bit), recorded in the order H200 allocator histories show. `rec` is the step trace's
recorder (step_trace._Recorder).
"""

from __future__ import annotations


def safe_softmax_temps(rec, x, dim: int) -> list[int]:
    """aten._safe_softmax on CUDA after its output: which elements are -inf (bool), which rows are
    all -inf (bool), the zero scalar (an H200 history's order); the keys in the order they go."""
    rows = x.numel() // max(1, x.shape[dim])
    made = [rec.synthetic(x.numel()), rec.synthetic(rows), rec.synthetic(4)]
    return made[::-1]  # freed last first


def gemm_4bit_temps(rec, A, B, shapeB, absmax, blocksize, quant_type, bias=None, absmax_8bit=None,
                     absmax_code=None, absmax_offset=None) -> list[int]:
    """bitsandbytes' CUDA gemm_4bit past 4 tokens on sm90 (_dequant_linear_fallback): the nested
    absmax dequantized and offset (fp32), the weight dequantized at the input's dtype."""
    temps = []
    if absmax_8bit is not None:
        temps += [rec.synthetic(absmax_8bit.numel() * 4), rec.synthetic(absmax_8bit.numel() * 4)]
    temps.append(rec.synthetic(shapeB[0] * shapeB[1] * A.element_size()))
    return temps


def quantize_events(rec, numel: int, element_size: int) -> None:
    """bitsandbytes' CUDA quantize_4bit with double quantization (blocksize 64, nested 256) of a
    weight arriving at element_size bytes: the weight, fp32 absmax, packed weight, the code, the
    offset, the centred absmax and its 8-bit quantization; the temporaries go (an H200 trace's order)."""
    s = rec.synthetic
    weight, absmax = s(numel * element_size), s(numel // 64 * 4)
    s(numel // 2)  # packed
    s(64)  # the 4-bit code
    temps = [s(64), s(4)]
    s(4)  # offset
    temps += [s(192), s(4)]
    centred = s(numel // 64 * 4)
    s(1024)
    s(max(1, numel // 64 // 256) * 4)
    s(numel // 64)
    s(1024)
    for key in temps + [centred, absmax, weight]:
        rec.free(key)
