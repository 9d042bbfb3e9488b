"""A Llama-2-7B directory (bf16, three safetensors shards, 13.5 GB) that costs a few MB of disk.

Every tensor holds random bf16 values where check-dir's default check samples (its first,
middle and last 4 KiB, harness.modeldir.weight_sample) and a hole elsewhere: the files have
their real sizes, headers and index, so check-dir reads exactly what it reads on the real
model. Used by benchmarks/modeldir/directory_cases.py --big-7b for the timing only.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
    "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32, "vocab_size": 32000,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "max_position_embeddings": 4096, "tie_word_embeddings": False,
    "dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
}
SAMPLE = 4096


def _tensors() -> list[tuple[str, list[int]]]:
    h, i, v = CONFIG["hidden_size"], CONFIG["intermediate_size"], CONFIG["vocab_size"]
    out = [("model.embed_tokens.weight", [v, h])]
    for n in range(CONFIG["num_hidden_layers"]):
        p = f"model.layers.{n}."
        out += [(p + f"self_attn.{x}_proj.weight", [h, h]) for x in "qkvo"]
        out += [(p + "mlp.gate_proj.weight", [i, h]), (p + "mlp.up_proj.weight", [i, h]),
                (p + "mlp.down_proj.weight", [h, i])]
        out += [(p + "input_layernorm.weight", [h]), (p + "post_attention_layernorm.weight", [h])]
    return out + [("model.norm.weight", [h]), ("lm_head.weight", [v, h])]


def build(target: Path, shards: int = 3, tokenizer_from: Path | None = None) -> Path:
    import torch

    from harness.models import tiny_model_dir

    target.mkdir(parents=True, exist_ok=True)
    tensors = _tensors()
    total = sum(2 * _numel(shape) for _, shape in tensors)
    per_shard = total // shards + 1
    groups, current, size = [], [], 0
    for name, shape in tensors:
        if current and size + 2 * _numel(shape) > per_shard:
            groups.append(current)
            current, size = [], 0
        current.append((name, shape))
        size += 2 * _numel(shape)
    groups.append(current)
    weight_map = {}
    for k, group in enumerate(groups, 1):
        fname = f"model-{k:05d}-of-{len(groups):05d}.safetensors"
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name, shape in group:
            nbytes = 2 * _numel(shape)
            header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            weight_map[name] = fname
        blob = json.dumps(header).encode()
        blob += b" " * (-len(blob) % 8)
        start = 8 + len(blob)
        with open(target / fname, "wb") as fh:
            fh.write(struct.pack("<Q", len(blob)) + blob)
            for name, shape in group:
                begin, end = (start + x for x in header[name]["data_offsets"])
                for at in (begin, begin + ((end - begin) // 2 - SAMPLE // 2) // 2 * 2, end - SAMPLE):
                    fh.seek(at)
                    fh.write((torch.randn(SAMPLE // 2) * 0.02).to(torch.bfloat16).view(torch.int16).numpy().tobytes())
            fh.truncate(start + offset)
    (target / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    (target / "config.json").write_text(json.dumps(CONFIG, indent=1))
    source = tokenizer_from or tiny_model_dir("qwen2")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(source / name, target / name)
    (target / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    return target


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
