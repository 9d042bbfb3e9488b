"""The broken merged directories users really produce, each built from the good chain output.

Every builder takes (chain, out_dir) and writes a directory the way the mistake happens in real
scripts; VARIANTS pairs it with the finding code check-dir must refuse it with.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file

Q = "model.layers.0.self_attn.q_proj.weight"
EMBED = "model.embed_tokens.weight"


def copy_merged(chain, out: Path) -> Path:
    shutil.copytree(chain.merged_dir, out)
    return out


def _edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data, indent=2))


def _edit_weights(path: Path, edit) -> None:
    tensors = load_file(str(path))
    edit(tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


def unassigned_merge(chain, out):
    """model.merge_and_unload() not assigned; the PeftModel's save_pretrained writes the adapter."""
    shutil.copytree(chain.adapter_dir, out)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        shutil.copy(chain.merged_dir / name, out / name)


def fp32_save(chain, out):
    """Merged in fp32, saved as is; config.json copied from a bf16 base."""
    copy_merged(chain, out)
    _edit_json(out / "config.json", dtype="bfloat16")


def tied_lm_head_dropped(chain, out):
    """An untied model whose lm_head was dropped (config edited to untied, weights saved tied)."""
    copy_merged(chain, out)
    _edit_json(out / "config.json", tie_word_embeddings=False)


def tied_lm_head_trained(chain, out):
    """lm_head trained separately (e.g. modules_to_save) but config still says tied."""
    copy_merged(chain, out)
    _edit_weights(out / "model.safetensors", lambda t: t.__setitem__("lm_head.weight", t[EMBED] + 0.01))


ADDED_TOKEN = "<tool_call>"


def added_tokens_without_resize(chain, out):
    """tokenizer.add_tokens(...) and save, but no model.resize_token_embeddings."""
    from transformers import AutoTokenizer

    copy_merged(chain, out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.add_tokens([ADDED_TOKEN], special_tokens=True)  # gets id 2048: the embedding has 2048 rows
    tokenizer.save_pretrained(out)


def merged_into_4bit(chain, out):
    """The base loaded in NF4 (QLoRA), adapter merged into it and saved: a bnb checkpoint."""
    from peft import PeftModel

    from harness.models import load_model, load_tokenizer

    base = load_model(chain.base_dir, "nf4", "cpu")
    merged = PeftModel.from_pretrained(base, chain.adapter_dir).merge_and_unload()
    merged.save_pretrained(out)
    load_tokenizer(chain.base_dir).save_pretrained(out)


def sharded(chain, out):
    """Shards of an eighth of the merged file (2 MB at least: the tiny model's 2 MB shards)."""
    from harness.models import load_model

    size = (chain.merged_dir / "model.safetensors").stat().st_size
    load_model(chain.merged_dir, "fp32", "cpu").save_pretrained(out, max_shard_size=max(2 * 10**6, size // 8))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(chain.merged_dir / name, out / name)


def truncated_shard(chain, out):
    """An interrupted copy: the last shard lost its tail."""
    sharded(chain, out)
    shard = sorted(out.glob("model-*.safetensors"))[-1]
    with open(shard, "r+b") as fh:
        fh.truncate(shard.stat().st_size // 2)


def missing_shard(chain, out):
    sharded(chain, out)
    sorted(out.glob("model-*.safetensors"))[1].unlink()


def lfs_pointer(chain, out):
    """`git clone` without git-lfs: the weights are 130-byte pointer files."""
    copy_merged(chain, out)
    size = (out / "model.safetensors").stat().st_size
    (out / "model.safetensors").write_text(
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{'ab' * 32}\nsize {size}\n")


def html_page(chain, out):
    """wget of a gated file without a token: the login page saved under the weights' name."""
    copy_merged(chain, out)
    (out / "model.safetensors").write_text("<!DOCTYPE html>\n<html><head><title>Sign in</title></head></html>\n")


class _Payload:
    marker = "PWNED"

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def pickle_payload(chain, out):
    """A pytorch_model.bin from an untrusted upload that runs a shell command when unpickled."""
    copy_merged(chain, out)
    (out / "model.safetensors").unlink()
    state = {k: v for k, v in load_file(str(chain.merged_dir / "model.safetensors")).items()}
    state["__payload__"] = _Payload()
    torch.save(state, out / "pytorch_model.bin")


REMOTE_MARKER = "REMOTE_CODE_RAN"


def remote_code(chain, out):
    copy_merged(chain, out)
    (out / "modeling_custom.py").write_text(
        f"import pathlib\npathlib.Path(__file__).with_name({REMOTE_MARKER!r}).write_text('imported')\n")
    _edit_json(out / "config.json", auto_map={"AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"})


def leftover_adapter_keys(chain, out):
    """Saved from the PeftModel's inner model without merging: base_layer / lora_A keys."""
    from peft import PeftModel

    from harness.models import load_model, load_tokenizer

    base = load_model(chain.base_dir, "fp32", "cpu")
    PeftModel.from_pretrained(base, chain.adapter_dir).get_base_model().save_pretrained(out)
    load_tokenizer(chain.base_dir).save_pretrained(out)


def stray_adapter(chain, out):
    """The merged model saved into the adapter's folder (or the adapter copied along)."""
    copy_merged(chain, out)
    for f in chain.adapter_dir.iterdir():
        if f.name.startswith("adapter_"):
            shutil.copy(f, out / f.name)


DOWN = "model.layers.1.mlp.down_proj.weight"


def nan_weights(chain, out):
    """A diverged fine-tune merged without safe_merge: NaN rows in a projection."""
    copy_merged(chain, out)
    _edit_weights(out / "model.safetensors", lambda t: t[DOWN].__setitem__((slice(0, 4), slice(None)), float("nan")))


def missing_tensor(chain, out):
    """A filtered state dict lost a parameter (e.g. a key-renaming script that skipped one)."""
    copy_merged(chain, out)
    _edit_weights(out / "model.safetensors", lambda t: t.pop(Q))


def vocab_size_mismatch(chain, out):
    """config.vocab_size edited (or copied from a base with another vocabulary)."""
    copy_merged(chain, out)
    _edit_json(out / "config.json", vocab_size=2048 + 64)


def stale_bnb_config(chain, out):
    """config.json copied from the 4-bit training run over bf16/fp32 merged weights."""
    copy_merged(chain, out)
    _edit_json(out / "config.json", quantization_config={
        "quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_compute_dtype": "bfloat16"})


def symlink_escape(chain, out):
    """A weights symlink into another folder (a cache, another user's home): never followed."""
    copy_merged(chain, out)
    target = out.parent / f"{out.name}-elsewhere.safetensors"
    (out / "model.safetensors").rename(target)
    (out / "model.safetensors").symlink_to(target)


@dataclass(frozen=True)
class Variant:
    name: str
    build: Callable
    code: str
    deep: bool = False


VARIANTS = [
    Variant("unassigned merge result", unassigned_merge, "weights.adapter_only"),
    Variant("fp32 save under a bf16 config", fp32_save, "dtype.mismatch"),
    Variant("tied embeddings: lm_head dropped", tied_lm_head_dropped, "tied.lm_head_missing"),
    Variant("tied embeddings: trained lm_head ignored", tied_lm_head_trained, "tied.lm_head_differs", deep=True),
    Variant("added tokens without resize", added_tokens_without_resize, "vocab.tokenizer_overflow"),
    Variant("merged into a 4-bit base", merged_into_4bit, "quant.bitsandbytes_checkpoint"),
    Variant("truncated shard", truncated_shard, "safetensors.truncated"),
    Variant("missing shard", missing_shard, "weights.missing_shard"),
    Variant("git-lfs pointer", lfs_pointer, "safetensors.lfs_pointer"),
    Variant("HTML page as weights", html_page, "safetensors.html_page"),
    Variant("pickle payload", pickle_payload, "safety.pickle_dangerous"),
    Variant("remote code", remote_code, "safety.remote_code"),
    Variant("leftover adapter keys", leftover_adapter_keys, "leftover.adapter_keys"),
    Variant("stray adapter files", stray_adapter, "leftover.adapter_files"),
    Variant("NaN weights", nan_weights, "tensor.nan", deep=True),
    Variant("missing tensor", missing_tensor, "arch.missing_tensor"),
    Variant("vocab_size mismatch", vocab_size_mismatch, "vocab.config_mismatch"),
    Variant("stale bitsandbytes config", stale_bnb_config, "quant.stale_config"),
    Variant("symlink out of the directory", symlink_escape, "safety.path_escape"),
]
