"""LoRA / QLoRA steps and merging through peft.

A small API that suites and helpers share:

- ``lora_config(r, alpha, targets, dropout)``: a peft LoraConfig for a causal LM.
- ``attach_lora(model, config=None, **lora_kwargs)``: wrap a model into a PeftModel (4-bit and
  8-bit bases go through ``prepare_model_for_kbit_training`` first).
- ``train_steps(model, batches, steps, lr)``: plain AdamW steps on labels = input_ids; returns
  the per-step losses (NaN is returned as NaN, never filtered).
- ``merge_and_save(peft_model, out_dir, safe_merge=True, dtype=...)``: merge_and_unload, cast,
  save as safetensors; returns the merged model. The *result* of merge_and_unload is what is
  saved: forgetting to assign it is the most common merge bug (see harness.modeldir).

torch and peft are imported inside functions: importing this module is cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora_config(r: int = 8, alpha: int | None = None, targets: Sequence[str] = DEFAULT_TARGETS,
                dropout: float = 0.05, **extra: Any):
    """A causal-LM LoraConfig; alpha defaults to 2r (the convention of docs/architecture.md)."""
    from peft import LoraConfig, TaskType

    return LoraConfig(
        r=r,
        lora_alpha=alpha if alpha is not None else 2 * r,
        target_modules=list(targets),
        lora_dropout=dropout,
        bias="none",
        task_type=TaskType.CAUSAL_LM,
        **extra,
    )


def is_quantized(model) -> bool:
    return bool(getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False))


def attach_lora(model, config=None, *, gradient_checkpointing: bool = False, seed: int | None = 0,
                init_nonzero: bool = False, **lora_kwargs: Any):
    """Wrap `model` into a PeftModel with fresh LoRA weights.

    `init_nonzero=True` gives lora_B small random values instead of zeros, so that an adapter
    changes the output from the first step (tests of merging need a visible delta).
    """
    import torch
    from peft import get_peft_model, prepare_model_for_kbit_training

    if seed is not None:
        torch.manual_seed(seed)
    config = config if config is not None else lora_config(**lora_kwargs)
    if is_quantized(model):
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=gradient_checkpointing)
    elif gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.enable_input_require_grads()
    peft_model = get_peft_model(model, config)
    if init_nonzero:
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0.0, 0.02)
    return peft_model


@dataclass
class TrainResult:
    losses: list[float]
    steps: int

    @property
    def finite(self) -> bool:
        import math

        return all(math.isfinite(x) for x in self.losses)


def train_steps(model, batches: Iterable[Any], steps: int = 3, lr: float = 1e-3,
                max_grad_norm: float | None = 1.0, on_step=None) -> TrainResult:
    """`steps` AdamW steps over `batches` (cycled): each batch is an input_ids tensor or a dict
    with input_ids (and optionally attention_mask, labels). labels default to input_ids."""
    import torch

    batches = list(batches)
    if not batches:
        raise ValueError("train_steps needs at least one batch")
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr)
    device = next(model.parameters()).device
    model.train()
    losses: list[float] = []
    for step in range(steps):
        batch = batches[step % len(batches)]
        if not isinstance(batch, dict):
            batch = {"input_ids": batch}
        batch = {k: v.to(device) for k, v in batch.items()}
        batch.setdefault("labels", batch["input_ids"])
        loss = model(**batch).loss
        loss.backward()
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
    model.eval()
    return TrainResult(losses=losses, steps=steps)


def merge_and_save(peft_model, out_dir: str | Path, safe_merge: bool = True, dtype: Any = None,
                   tokenizer=None, max_shard_size: str | None = None):
    """merge_and_unload (safe_merge raises on NaN/Inf), cast to `dtype`, save as safetensors.

    Returns the merged (plain transformers) model. `dtype` may be a torch dtype or a name
    ("bf16", "float16", ...); None keeps the dtype the model has.
    """
    merged = peft_model.merge_and_unload(safe_merge=safe_merge)
    if dtype is not None:
        if isinstance(dtype, str):
            from ..models import torch_dtype

            dtype = torch_dtype(dtype)
        merged = merged.to(dtype)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    merged.save_pretrained(out_dir, **kwargs)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return merged
