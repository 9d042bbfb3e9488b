"""Faults injected on purpose, so that each detector can be shown to catch and locate them.

Every helper names what it touched and returns something that undoes it (a hook handle) or the
new object; none of them imports pytest. torch is imported inside functions.
"""

from __future__ import annotations

from typing import Any, Iterable

from ..errors import UsageError
from .locate import IGNORE_INDEX


def get_module(model, name: str):
    try:
        return model.get_submodule(name)
    except AttributeError:
        candidates = [n for n, _ in model.named_modules() if n.endswith(name)]
        if len(candidates) == 1:
            return model.get_submodule(candidates[0])
        raise UsageError(f"no module {name!r} in the model" + (f" (ambiguous: {candidates[:3]})" if candidates else ""))


def module_name(model, suffix: str) -> str:
    """The qualified name of the one module whose name ends with `suffix` (peft adds prefixes)."""
    names = [n for n, _ in model.named_modules() if n == suffix or n.endswith("." + suffix)]
    if len(names) != 1:
        raise UsageError(f"{len(names)} modules end with {suffix!r}: {names[:3]}")
    return names[0]


# -- data -----------------------------------------------------------------------------------

def ignore_all_labels(batch: dict, rows: Iterable[int] | None = None, keep_first: bool = False) -> dict:
    """A copy of `batch` whose labels are all ignore_index on `rows` (all rows by default).
    With keep_first, position 0 keeps its label: still no target once labels shift."""
    labels = batch.get("labels", batch["input_ids"]).clone()
    rows = range(labels.shape[0]) if rows is None else list(rows)
    for row in rows:
        first = labels[row, 0].clone()
        labels[row] = IGNORE_INDEX
        if keep_first:
            labels[row, 0] = first
    return {**batch, "labels": labels}


# -- weights --------------------------------------------------------------------------------

def scale_weight(model, name: str, factor: float):
    """Multiply the weight of module `name` by `factor` in place (e.g. to overflow fp16)."""
    import torch

    module = get_module(model, name)
    with torch.no_grad():
        module.weight.mul_(factor)
    return module


def set_parameter_value(model, param_name: str, value: float = float("inf"), index: tuple[int, ...] | None = None):
    """Write `value` (Inf, NaN) into one element of a parameter (index 0,...,0 by default)."""
    import torch

    params = dict(model.named_parameters())
    if param_name not in params:
        matches = [n for n in params if n.endswith(param_name)]
        if len(matches) != 1:
            raise UsageError(f"no single parameter ending with {param_name!r} ({len(matches)} match)")
        param_name = matches[0]
    param = params[param_name]
    if not param.is_floating_point():
        raise UsageError(f"{param_name} is not a floating tensor (quantized storage cannot hold {value})")
    index = index if index is not None else (0,) * param.dim()
    with torch.no_grad():
        param[index] = value
    return param_name


# -- activations and gradients ---------------------------------------------------------------

def _first_tensor(output):
    return output[0] if isinstance(output, (tuple, list)) else output


def _replace_first(output, tensor):
    if isinstance(output, tuple):
        return (tensor, *output[1:])
    if isinstance(output, list):
        return [tensor, *output[1:]]
    return tensor


def nan_in_backward(model, name: str, value: float = float("nan")):
    """From now on, the backward of module `name` emits `value` (as an overflowing bf16 backward
    would): its output is wrapped in an identity whose gradient is filled with NaN.
    Returns the hook handle (remove() undoes it)."""
    import torch

    class _PoisonGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            return torch.full_like(grad, value)

    def hook(module, args, output):
        tensor = _first_tensor(output)
        if torch.is_tensor(tensor) and tensor.requires_grad:
            return _replace_first(output, _PoisonGrad.apply(tensor))
        return None

    return get_module(model, name).register_forward_hook(hook)


def fill_masked_positions(model, name: str, attention_mask, value: float = float("nan")):
    """The output of module `name` becomes `value` at the positions `attention_mask` masks out
    (what an eager attention with a -inf mask does to fully masked padding rows). The gradient
    does not flow back through the filled positions (torch.where). Returns the hook handle."""
    import torch

    def hook(module, args, output):
        tensor = _first_tensor(output)
        if tensor.shape[:2] != attention_mask.shape:
            return None
        masked = ~attention_mask.bool().to(tensor.device)
        filled = torch.where(masked.unsqueeze(-1), torch.full_like(tensor, value), tensor)
        return _replace_first(output, filled)

    return get_module(model, name).register_forward_hook(hook)


def fill_positions(model, name: str, positions: list[tuple[int, int]], value: float = float("nan")):
    """The output of module `name` becomes `value` at (batch, seq) `positions`. Returns the handle."""
    import torch

    def hook(module, args, output):
        tensor = _first_tensor(output)
        mask = torch.zeros(tensor.shape[:2], dtype=torch.bool, device=tensor.device)
        for b, s in positions:
            mask[b, s] = True
        filled = torch.where(mask.unsqueeze(-1), torch.full_like(tensor, value), tensor)
        return _replace_first(output, filled)

    return get_module(model, name).register_forward_hook(hook)


# -- caches ---------------------------------------------------------------------------------

def poison_cache(cache, layer: int, kind: str = "value", value: float = float("nan"),
                 index: tuple[int, ...] | None = None) -> Any:
    """Write `value` into one element of layer `layer`'s keys or values, in place."""
    import torch

    from .locate import _cache_layers

    if kind not in ("key", "value"):
        raise UsageError(f"kind must be 'key' or 'value', not {kind!r}")
    for _, i, keys, values in _cache_layers(cache):
        if i == layer:
            tensor = keys if kind == "key" else values
            index = index if index is not None else (0,) * tensor.dim()
            with torch.no_grad():
                tensor[index] = value
            return cache
    raise UsageError(f"the cache has no layer {layer}")
