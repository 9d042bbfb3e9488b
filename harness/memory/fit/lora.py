"""LoRA adapters and optimizer states: which modules peft wraps for a target list, and the bytes
of the adapters, their gradients and the optimizer states (fp32 LoRA: 16 bytes a parameter with
AdamW; bitsandbytes 8-bit and paged optimizers as bitsandbytes allocates them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from ...errors import UsageError
from .shape import LinearGroup, ModelShape
from .weights import block_rounded

DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

ALL_LINEAR = "all-linear"


@dataclass(frozen=True)
class LoraTargets:
    """What peft would wrap for a target list on this architecture.

    peft matches each module's dotted name against every target: equal, or ending in "." + target
    ("all-linear" = every Linear/Conv1D but the output layer). A target that matches nothing is
    not an error to peft as long as another target matches: the model just gets fewer adapters
    than the user thinks (q_proj on phi-3, whose attention is one fused qkv_proj)."""

    requested: tuple[str, ...]
    groups: tuple[LinearGroup, ...]  # the wrapped projections
    unmatched: tuple[str, ...]  # requested targets that match no module

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(g.kind for g in self.groups))

    @property
    def modules(self) -> int:
        return sum(g.count for g in self.groups)

    def note(self, shape: "ModelShape") -> str | None:
        """A one-line warning when some targets match nothing, None when all do."""
        if not self.unmatched:
            return None
        have = ", ".join(dict.fromkeys(g.kind for g in shape.linears))
        wrapped = ", ".join(self.kinds) or "nothing"
        return (f"LoRA target(s) {', '.join(self.unmatched)} match no module of this {shape.family} model "
                f"(its projections: {have}); peft would wrap only {wrapped}")


def _target_matches(group: LinearGroup, target: str) -> bool:
    if target == group.kind:
        return True
    if "." not in target:
        return False
    # a dotted target ("self_attn.q_proj", "mlp.down_proj") matches a suffix of the full name
    key = f"model.layers.0.{group.parent}.{group.kind}" if group.parent else f"model.layers.0.{group.kind}"
    return key == target or key.endswith("." + target)


def resolve_lora_targets(shape: ModelShape, targets: Iterable[str] | str) -> LoraTargets:
    """peft's matching of `target_modules` (a list, or "all-linear") against this architecture."""
    requested = (targets,) if isinstance(targets, str) else tuple(targets)
    if any(t.lower() == ALL_LINEAR for t in requested):
        return LoraTargets(requested, tuple(shape.linears), ())
    groups = tuple(g for g in shape.linears if any(_target_matches(g, t) for t in requested))
    unmatched = tuple(t for t in requested if not any(_target_matches(g, t) for g in shape.linears))
    return LoraTargets(requested, groups, unmatched)


def check_lora_targets(shape: ModelShape, targets: Iterable[str] | str, flag: str = "--lora-targets") -> str | None:
    """A usage error when no target matches (peft refuses to train nothing); a one-line note when
    only some do (peft wraps fewer modules than asked, silently); None when all match."""
    resolved = resolve_lora_targets(shape, targets)
    if not resolved.groups:
        kinds = ", ".join(dict.fromkeys(g.kind for g in shape.linears))
        raise UsageError(f"{flag}: {', '.join(resolved.requested)} not in this model (linear layers: {kinds}); "
                         f"peft would find no module to wrap")
    return resolved.note(shape)


def lora_params(shape: ModelShape, r: int, targets: Iterable[str] | str) -> int:
    return sum(g.count * r * (g.in_features + g.out_features)
               for g in resolve_lora_targets(shape, targets).groups)


# Optimizers: the names HF Trainer's `optim` uses, and short aliases.
OPTIMIZERS = ("adamw_torch", "adamw_8bit", "paged_adamw_32bit", "paged_adamw_8bit")
OPTIMIZER_ALIASES = {"adamw": "adamw_torch", "adamw_bnb_8bit": "adamw_8bit", "adamw8bit": "adamw_8bit",
                     "paged_adamw": "paged_adamw_32bit", "paged_adamw_32": "paged_adamw_32bit"}
# bitsandbytes (optim/optimizer.py): tensors under min_8bit_size elements keep 32-bit states;
# paged optimizers page only tensors of at least 1e5 elements (cudaMallocManaged, outside torch's
# allocator), smaller ones are ordinary allocations; 8-bit states keep a float32 absmax per 256.
BNB_MIN_8BIT_SIZE = 4096
BNB_PAGED_MIN = 100_000
BNB_BLOCK = 256


def optimizer_name(name: str) -> str:
    key = str(name).strip().lower()
    key = OPTIMIZER_ALIASES.get(key, key)
    if key not in OPTIMIZERS:
        raise UsageError(f"unknown optimizer {name!r} (choose from {', '.join(OPTIMIZERS)}; aliases "
                         f"{', '.join(sorted(OPTIMIZER_ALIASES))})")
    return key


def _state_bytes(numel: int, optimizer: str) -> tuple[int, int]:
    """(allocator bytes, paged bytes) of the optimizer states of one fp32 trainable tensor."""
    eight = optimizer in ("adamw_8bit", "paged_adamw_8bit") and numel >= BNB_MIN_8BIT_SIZE
    paged = optimizer.startswith("paged") and numel >= BNB_PAGED_MIN
    states = 2 * (numel if eight else 4 * numel)
    extra = 2 * block_rounded(4 * math.ceil(numel / BNB_BLOCK)) if eight else 0  # absmax1, absmax2
    if paged:
        return extra, states
    return 2 * block_rounded(states // 2) + extra, 0


def adapter_bytes(shape: ModelShape, r: int, targets: LoraTargets, optimizer: str = "adamw_torch") -> dict[str, int]:
    """LoRA weights, their gradients and the optimizer states (fp32 LoRA: peft upcasts adapters),
    each tensor its own allocation. `paged_states` live outside torch's allocator."""
    optimizer = optimizer_name(optimizer)
    weights = grads = states = paged = 0
    tensors: list[int] = []
    for g in targets.groups:
        tensors += [r * g.in_features] * g.count + [r * g.out_features] * g.count  # lora_A, lora_B
    for n in tensors:
        weights += block_rounded(4 * n)
        alloc, paged_n = _state_bytes(n, optimizer)
        states += alloc
        paged += paged_n
    grads = weights
    # torch's multi-tensor AdamW (the default on CUDA) builds sqrt(exp_avg_sq) for every tensor at
    # once during step(): one more fp32 copy of the adapter, after backward freed the activations
    step_temp = weights if optimizer == "adamw_torch" else 0
    return {"lora_weights": weights, "lora_grads": grads, "optimizer_states": states,
            "paged_optimizer_states": paged, "optimizer_step_transient": step_temp}
