"""A quantized checkpoint broken the way converters break them, for the drift gate to catch.

`repack_in_awq_order`: a compressed-tensors pack-quantized checkpoint whose 4-bit values sit in
each int32 in AWQ's interleaved order (0,2,4,6,1,3,5,7) instead of sequential: the classic
GPTQ <-> AWQ repacking bug. Shapes, dtypes and config stay right, check-dir passes, it loads and
runs: only the drift shows it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def repack_in_awq_order(src_dir, out_dir) -> Path:
    import torch
    from safetensors.torch import load_file, save_file

    out_dir = Path(out_dir)
    shutil.copytree(src_dir, out_dir)
    files = sorted(out_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{src_dir}: no safetensors files to repack")
    shifts = torch.arange(8, dtype=torch.int64) * 4
    order = torch.tensor(AWQ_ORDER)
    repacked_any = False
    for path in files:
        tensors = load_file(str(path))
        for name in [n for n in tensors if n.endswith(".weight_packed")]:
            packed = tensors[name].to(torch.int64) & 0xFFFFFFFF
            nibbles = (packed[..., None] >> shifts) & 0xF
            repacked = (nibbles[..., order] << shifts).sum(-1)
            tensors[name] = torch.where(repacked >= 2**31, repacked - 2**32, repacked).to(torch.int32)
            repacked_any = True
        save_file(tensors, str(path), metadata={"format": "pt"})
    if not repacked_any:
        raise ValueError(f"{src_dir}: no weight_packed tensors (not a pack-quantized checkpoint)")
    return out_dir
