"""estimate/plan for the serving precisions: w4a16 checkpoints and GGUF files (headers only)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from harness.errors import UsageError
from harness.memory.fit import estimate as E
from harness.memory.fit.shape import model_shape
from harness.memory.fit.weights import kv_cache_bytes, quantized_linear_bytes, w4a16_linear_bytes, weight_bytes
from harness.memory.fit.gguf import read_gguf

HIDDEN, INTER, LAYERS, VOCAB = 256, 512, 2, 2048


def write_gguf(path, types: dict[str, str], tied: bool = False, arch: str = "llama"):
    """A small GGUF file with the gguf package's writer: per tensor kind a GGML type (zero data)."""
    import gguf
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(LAYERS)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_context_length(2048)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)

    def tensor(name, shape, qtype):
        if qtype == "F32":
            w.add_tensor(name, np.zeros(shape, dtype=np.float32))
            return
        qt = T[qtype]
        block, size = GGML_QUANT_SIZES[qt]  # a quantized tensor is given as its bytes, row by row
        w.add_tensor(name, np.zeros((*shape[:-1], shape[-1] // block * size), dtype=np.uint8), raw_dtype=qt)

    tensor("token_embd.weight", (VOCAB, HIDDEN), types["embed"])
    if not tied:
        tensor("output.weight", (VOCAB, HIDDEN), types["output"])
    tensor("output_norm.weight", (HIDDEN,), "F32")
    for i in range(LAYERS):
        for part, shape in (("attn_q", (HIDDEN, HIDDEN)), ("attn_k", (128, HIDDEN)), ("attn_v", (128, HIDDEN)),
                            ("attn_output", (HIDDEN, HIDDEN)), ("ffn_gate", (INTER, HIDDEN)),
                            ("ffn_up", (INTER, HIDDEN)), ("ffn_down", (HIDDEN, INTER))):
            tensor(f"blk.{i}.{part}.weight", shape, types.get(part, types["linear"]))
        tensor(f"blk.{i}.attn_norm.weight", (HIDDEN,), "F32")
        tensor(f"blk.{i}.ffn_norm.weight", (HIDDEN,), "F32")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


Q4_K_M = {"embed": "Q4_K", "output": "Q6_K", "linear": "Q4_K", "attn_v": "Q6_K", "ffn_down": "Q6_K"}


def test_gguf_weight_bytes_are_exact_per_tensor_type(tmp_path):
    path = write_gguf(tmp_path / "tiny-q4_k_m.gguf", Q4_K_M)
    info = read_gguf(path)
    q4k = 144 / 256  # bytes per weight: 2+2 (d, dmin) + 12 (scales) + 128 (quants) per 256
    q6k = 210 / 256
    emb = VOCAB * HIDDEN
    per_layer_q4 = HIDDEN * HIDDEN * 2 + 128 * HIDDEN + INTER * HIDDEN * 2
    per_layer_q6 = 128 * HIDDEN + HIDDEN * INTER
    assert info.bytes_by_type["Q4_K"] == (emb + LAYERS * per_layer_q4) * q4k
    assert info.bytes_by_type["Q6_K"] == (emb + LAYERS * per_layer_q6) * q6k
    assert info.bytes_by_type["F32"] == 4 * HIDDEN * (2 * LAYERS + 1)
    assert info.file_type == "MOSTLY_Q4_K_M"
    assert info.config["num_hidden_layers"] == LAYERS and info.config["vocab_size"] == VOCAB
    assert 4.5 < info.bits_per_weight < 6.6  # a Q4_K_M mix: between Q4_K and Q6_K
    # what the file holds on disk beyond the tensors is the header (and alignment padding)
    assert 0 < path.stat().st_size - info.weight_bytes < 64 * 1024


def test_estimate_and_plan_read_a_gguf_file(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", Q4_K_M)
    shape = model_shape(path)
    assert shape.source == "gguf" and shape.hidden == HIDDEN and shape.layers == LAYERS and not shape.tied
    est = E.estimate(shape, E.Query("gguf", "generate", seq_len=512, new_tokens=64))
    assert est.breakdown["weights"] == read_gguf(path).weight_bytes
    assert "llama.cpp" in est.breakdown["engine"]
    assert est.breakdown["kv_cache"] == kv_cache_bytes(shape, "bf16", 1, 512, 63)  # f16 cache, 575 tokens
    out = subprocess.run([sys.executable, "-m", "harness", "plan", "--config", str(path), "--budget", "6GiB", "--json"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    plans = {p["precision"]: p for p in json.loads(out.stdout)["plans"]}
    assert plans["gguf"]["weights_bytes"] == read_gguf(path).weight_bytes and plans["gguf"]["fits"]
    assert "llama.cpp" in plans["gguf"]["engine"] and "vLLM" in plans["w4a16"]["engine"]
    est = subprocess.run([sys.executable, "-m", "harness", "estimate", "--config", str(path), "--mode", "weights",
                          "--json"], capture_output=True, text=True)
    assert est.returncode == 0, est.stderr
    assert [r["precision"] for r in json.loads(est.stdout)] == ["gguf"]  # a GGUF's own precision by default


def test_gguf_precision_needs_a_gguf_file_and_bad_files_are_one_line_errors(tmp_path):
    with pytest.raises(UsageError, match="GGUF file"):
        E.estimate(model_shape("qwen2.5-0.5b"), E.Query("gguf", "weights"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 20)
    out = subprocess.run([sys.executable, "-m", "harness", "estimate", "--config", str(bad)], capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr and "bad.gguf" in out.stderr
    (tmp_path / "html.gguf").write_text("<html></html>")
    with pytest.raises(UsageError, match="not a GGUF file"):
        model_shape(tmp_path / "html.gguf")


def test_w4a16_weights_pack_four_bits_with_a_scale_per_group():
    n_in, n_out = 4096, 11008
    stored = w4a16_linear_bytes(n_in, n_out, rounded=False)
    assert stored == n_in * n_out // 2 + n_out * (n_in // 128) * 2 + 16  # packed + bf16 scales + shape
    asym = w4a16_linear_bytes(n_in, n_out, zero_points=True, rounded=False)
    assert asym - stored == (n_out // 8) * (n_in // 128) * 4  # int32-packed 4-bit zero points
    assert quantized_linear_bytes(n_in, n_out, "w4a16") == w4a16_linear_bytes(n_in, n_out)
    # qwen2.5-7b: docs/architecture.md: measured 5.55 GB stored (W4A16 group 128, lm_head and embedding bf16)
    s = model_shape("qwen2.5-7b")
    est = E.estimate(s, E.Query("w4a16", "weights"))
    assert est.breakdown["weights"] == pytest.approx(5.55e9, rel=0.01)
    # transformers decompresses it at the first forward: 15.4 GB allocated (docs/architecture.md), the bf16 figure
    assert est.breakdown["transformers_decompressed_weights"] == weight_bytes(s, "bf16")
    assert est.breakdown["transformers_decompressed_weights"] == pytest.approx(15.4e9, rel=0.02)


def test_w4a16_sits_between_nf4_and_bf16_and_trains_as_bf16():
    s = model_shape("qwen2.5-1.5b")
    w = {p: weight_bytes(s, p) for p in ("bf16", "w4a16", "nf4")}
    assert w["w4a16"] < w["nf4"] < w["bf16"]  # per weight: w4a16 0.5 + 2/128, nf4 0.5 + 4/64 bytes
    train = E.estimate(s, E.Query("w4a16", "train", seq_len=512))
    assert train.peak_bytes == E.estimate(s, E.Query("bf16", "train", seq_len=512)).peak_bytes
