"""GGUF files for the check-dir tests: a tiny llama written with the gguf package, and the three
ways a real one breaks (cut short, a tensor offset past the end, a shape that disagrees),
applied as byte edits to a copy of any GGUF file."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

TINY = dict(layers=2, hidden=64, heads=4, kv_heads=2, ff=128, vocab=96)


def write_tiny_llama(path: Path, untie: bool = False) -> Path:
    """A llama-architecture GGUF llama.cpp's converter would write: Q8_0 matrices, F32 norms."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    t = TINY
    head_dim = t["hidden"] // t["heads"]
    rng = np.random.default_rng(0)
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(t["layers"])
    writer.add_context_length(256)
    writer.add_embedding_length(t["hidden"])
    writer.add_feed_forward_length(t["ff"])
    writer.add_head_count(t["heads"])
    writer.add_head_count_kv(t["kv_heads"])
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"tok{i}" for i in range(t["vocab"])])

    def matrix(name, rows, cols):  # numpy [rows, cols] -> GGML dims [cols, rows]
        data = rng.standard_normal((rows, cols)).astype(np.float32) * 0.02
        writer.add_tensor(name, quantize(data, GGMLQuantizationType.Q8_0), raw_dtype=GGMLQuantizationType.Q8_0)

    def vector(name, n):
        writer.add_tensor(name, np.ones(n, dtype=np.float32))

    matrix("token_embd.weight", t["vocab"], t["hidden"])
    vector("output_norm.weight", t["hidden"])
    if untie:
        matrix("output.weight", t["vocab"], t["hidden"])
    for i in range(t["layers"]):
        b = f"blk.{i}."
        vector(b + "attn_norm.weight", t["hidden"])
        vector(b + "ffn_norm.weight", t["hidden"])
        matrix(b + "attn_q.weight", t["heads"] * head_dim, t["hidden"])
        matrix(b + "attn_k.weight", t["kv_heads"] * head_dim, t["hidden"])
        matrix(b + "attn_v.weight", t["kv_heads"] * head_dim, t["hidden"])
        matrix(b + "attn_output.weight", t["hidden"], t["heads"] * head_dim)
        matrix(b + "ffn_gate.weight", t["ff"], t["hidden"])
        matrix(b + "ffn_up.weight", t["ff"], t["hidden"])
        matrix(b + "ffn_down.weight", t["hidden"], t["ff"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _tensor_field(path: Path, name: str):
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    for t in reader.tensors:
        if t.name == name:
            return reader, t.field
    raise KeyError(name)


def truncated(src: Path, out: Path, keep: float = 0.6) -> Path:
    """The first `keep` of the file: an interrupted download."""
    data = src.read_bytes()
    out.write_bytes(data[:int(len(data) * keep)])
    return out


def offset_past_end(src: Path, out: Path, name: str) -> Path:
    """Tensor `name`'s data offset pointed 1 MiB past the end of the file (a corrupt tensor info)."""
    reader, field = _tensor_field(src, name)
    size = src.stat().st_size
    pos = field.offset + sum(int(p.nbytes) for p in field.parts[:5])  # name_len, name, n_dims, dims, type
    shutil.copy(src, out)
    relative = size + 2**20 - reader.data_offset
    relative -= relative % reader.alignment
    with open(out, "r+b") as fh:
        fh.seek(pos)
        fh.write(np.uint64(relative).tobytes())
    return out


def shape_swapped(src: Path, out: Path, name: str) -> Path:
    """Tensor `name`'s two dims swapped: the same bytes, a shape the architecture does not have."""
    _, field = _tensor_field(src, name)
    dims = field.parts[3]
    pos = field.offset + sum(int(p.nbytes) for p in field.parts[:3])
    shutil.copy(src, out)
    with open(out, "r+b") as fh:
        fh.seek(pos)
        fh.write(np.asarray(dims[::-1], dtype=np.uint64).tobytes())
    return out
