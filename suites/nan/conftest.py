"""Fixtures of the NaN suite: tiny LoRA / QLoRA models on each device, and small batches."""

from __future__ import annotations

import pytest

from harness.nan.lora import attach_lora, lora_config
from harness.models import load_model

DEVICES = ["cpu", pytest.param("cuda:0", marks=pytest.mark.gpu, id="cuda")]


@pytest.fixture(params=DEVICES, ids=lambda p: p if isinstance(p, str) else None)
def nan_device(request) -> str:
    """Every fault case runs on the CPU (CI) and, where a GPU is usable, on cuda:0."""
    return request.param


@pytest.fixture
def lora_model(tiny_model_dir, nan_device):
    """make(precision, targets=..., init_nonzero=False): a fresh PeftModel of the tiny Qwen2 on
    the test's device, in train mode, dropout 0 (deterministic). nf4/int8 are QLoRA bases."""

    def make(precision: str = "fp32", targets=("q_proj", "v_proj", "up_proj", "down_proj"), init_nonzero=False):
        base = load_model(tiny_model_dir, precision, nan_device)
        model = attach_lora(base, lora_config(r=8, targets=targets, dropout=0.0), init_nonzero=init_nonzero)
        return model.train()

    return make


@pytest.fixture
def make_batch(nan_device):
    """make(rows=2, seq=16, seed=0): token ids in the tiny vocabulary, labels = input_ids."""
    import torch

    def make(rows: int = 2, seq: int = 16, seed: int = 0) -> dict:
        generator = torch.Generator().manual_seed(seed)
        ids = torch.randint(10, 2000, (rows, seq), generator=generator)
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
        return {k: v.to(nan_device) for k, v in batch.items()}

    return make

