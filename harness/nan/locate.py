"""Where did the NaN come from: detection and location of non-finite values.

- ``first_nonfinite(model, batch)``: runs ``model(**batch)`` (and backward when the batch has
  labels) with hooks on every module and names the first module whose output, the loss, or the
  first gradient that went non-finite. Positions masked out by ``attention_mask`` are ignored:
  padding rows may legitimately hold NaN.
- ``nonfinite_in_cache(cache)``: scans a transformers cache (DynamicCache, StaticCache,
  EncoderDecoderCache, legacy tuples) layer by layer, keys and values.
- ``nonfinite_tensors(model_or_state_dict)``: scans weights (a merged model before saving, a
  loaded safetensors file).
- ``check_labels(samples)``: flags samples whose labels are all ignored, or that keep no target
  once the labels are shifted, before training starts.

The training guard (HF Trainer callback and plain-loop context manager) lives in
``harness.nan.guard``. torch is imported inside functions.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Iterator

from ..errors import CheckFailed, UsageError

IGNORE_INDEX = -100


@dataclass
class NonFinite:
    """One place where a non-finite value was found."""

    phase: str  # "forward" | "loss" | "backward" (first_nonfinite); the guard adds "update"
    module: str  # qualified module name ("" is the model itself); for a parameter, its module
    tensor: str  # which tensor: "output", "output[0]", "output.logits", "grad(output)", "weight.grad", "loss"
    shape: tuple[int, ...] = ()
    dtype: str = ""
    count: int = 0  # non-finite elements among the checked positions
    nan: int = 0
    inf: int = 0
    first_index: tuple[int, ...] = ()
    checked: int = 0  # elements checked (masked positions excluded)
    note: str = ""
    step: int | None = None

    @property
    def where(self) -> str:
        return f"{self.module}.{self.tensor}" if self.module else self.tensor

    def describe(self) -> str:
        if self.count:
            parts = [f"{self.phase}: {self.count} non-finite ({self.nan} NaN, {self.inf} Inf) in {self.where}"]
        else:
            parts = [f"{self.phase}: {self.where}"]
        if self.shape:
            parts.append(f"shape {list(self.shape)} {self.dtype}, first at {list(self.first_index)}")
        if self.step is not None:
            parts.append(f"step {self.step}")
        if self.note:
            parts.append(self.note)
        return "; ".join(parts)

    __str__ = describe

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["shape"] = list(self.shape)
        data["first_index"] = list(self.first_index)
        return data


@dataclass
class CacheFinding:
    layer: int
    kind: str  # "key" | "value"
    count: int
    nan: int = 0
    inf: int = 0
    shape: tuple[int, ...] = ()
    first_index: tuple[int, ...] = ()
    part: str = "self"  # "self" | "cross" (EncoderDecoderCache)

    def describe(self) -> str:
        return (f"layer {self.layer} {self.kind}s ({self.part}-attention): {self.count} non-finite "
                f"({self.nan} NaN, {self.inf} Inf), first at {list(self.first_index)} of {list(self.shape)}")


@dataclass
class LabelProblem:
    index: int  # position of the sample in what was checked
    reason: str  # "all labels ignored" | "no target after the shift"
    labelled: int  # labels that are not ignore_index
    length: int


class NonFiniteError(CheckFailed):
    """Training stopped at a non-finite value (or a divergence); `.finding` says where."""

    def __init__(self, finding: NonFinite, saved: Any = None):
        self.finding = finding
        self.saved = saved
        text = f"non-finite value caught at {finding.describe()}"
        if saved is not None:
            text += f"; last good state kept in {saved}"
        super().__init__(text)


class BadLabelsError(CheckFailed):
    def __init__(self, problems: list[LabelProblem]):
        self.problems = problems
        shown = ", ".join(f"#{p.index} ({p.reason})" for p in problems[:10])
        more = f" and {len(problems) - 10} more" if len(problems) > 10 else ""
        super().__init__(f"{len(problems)} sample(s) have no training target: {shown}{more}")


# ---------------------------------------------------------------------------------------------
# Tensor statistics


def tensor_stats(t, valid=None, seq_dim: int = 1) -> dict[str, Any] | None:
    """Non-finite statistics of a floating tensor, or None when every checked element is finite.

    `valid` is a (batch, seq) boolean mask: when the tensor's batch dim and `seq_dim` match it,
    only positions where it is True are checked.
    """
    import torch

    if not torch.is_tensor(t) or not (t.is_floating_point() or t.is_complex()):
        return None
    bad = ~torch.isfinite(t.detach())
    checked = t.numel()
    if valid is not None and t.dim() > seq_dim and t.shape[0] == valid.shape[0] and t.shape[seq_dim] == valid.shape[1]:
        shape = [1] * t.dim()
        shape[0], shape[seq_dim] = valid.shape
        keep = valid.to(bad.device).reshape(shape).expand_as(bad)
        bad = bad & keep
        checked = int(keep.sum())
    count = int(bad.sum())
    if count == 0:
        return None
    nan = int((torch.isnan(t.detach()) & bad).sum())
    first = tuple(int(i) for i in bad.nonzero()[0].tolist())
    return {"shape": tuple(t.shape), "dtype": str(t.dtype).replace("torch.", ""), "count": count,
            "nan": nan, "inf": count - nan, "first_index": first, "checked": checked}


def _walk_tensors(value, path: str) -> Iterator[tuple[str, Any]]:
    """(path, tensor) pairs in a module output: tensors, tuples, lists, dicts and ModelOutputs.
    A "loss" entry is skipped (the loss is its own phase); cache objects are not walked."""
    import torch

    if torch.is_tensor(value):
        yield path, value
    elif isinstance(value, dict):  # ModelOutput is an OrderedDict
        for key, item in value.items():
            if key == "loss" or item is None:
                continue
            yield from _walk_tensors(item, f"{path}.{key}")
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            yield from _walk_tensors(item, f"{path}[{i}]")


# ---------------------------------------------------------------------------------------------
# first_nonfinite


class _Stop(Exception):
    pass


def _valid_mask(batch: dict) -> Any:
    mask = batch.get("attention_mask")
    if mask is None or getattr(mask, "dim", lambda: 0)() != 2:
        return None
    return mask.bool()


def count_targets(labels, ignore_index: int = IGNORE_INDEX, shift: bool = True):
    """Per-sample number of positions that contribute to a causal-LM loss."""
    targets = labels[:, 1:] if shift else labels
    return (targets != ignore_index).sum(dim=1)


def _loss_note(labels, ignore_index: int) -> str:
    """Why a non-finite loss can be a mean over nothing: a batch or samples left without a target."""
    import torch

    if not (torch.is_tensor(labels) and labels.dim() == 2):
        return ""
    targets = count_targets(labels, ignore_index)
    if int(targets.sum()) == 0:
        return "no target token in the batch after the label shift (mean over zero tokens)"
    empty = [i for i, n in enumerate(targets.tolist()) if n == 0]
    return f"samples without a target after the shift: {empty}" if empty else ""


def first_nonfinite(model, batch: dict, *, backward: bool | None = None,
                    ignore_index: int = IGNORE_INDEX) -> NonFinite | None:
    """Run ``model(**batch)`` (and backward when the batch has labels) and return where the first
    non-finite value appeared, or None.

    forward: the first module whose output holds a non-finite value at an unmasked position (the
    innermost module fires first: a Linear before its decoder layer). loss: the forward was
    finite but the loss is not. backward: the first gradient, in the order autograd computes them,
    that is non-finite (a module's output gradient or a trainable parameter's gradient).

    Gradients are computed with torch.autograd.grad: the model's .grad fields are left untouched.
    The model's train/eval mode is kept as it is.
    """
    import torch

    if not isinstance(batch, dict) or "input_ids" not in batch and "inputs_embeds" not in batch:
        raise UsageError("first_nonfinite needs a batch dict with input_ids (and optionally attention_mask, labels)")
    has_labels = batch.get("labels") is not None
    run_backward = has_labels if backward is None else (backward and has_labels)
    valid = _valid_mask(batch)
    names = {module: name for name, module in model.named_modules()}
    state = {"phase": "forward", "first": None, "events": 0}
    handles = []

    def grad_hook(module_name: str, tensor_path: str):
        def hook(grad):
            if state["first"] is None:
                stats = tensor_stats(grad, valid)
                if stats:
                    state["first"] = NonFinite(phase="backward", module=module_name,
                                               tensor=f"grad({tensor_path})", **stats)
            return None

        return hook

    def forward_hook(module, args, output):
        name = names.get(module, "?")
        for path, tensor in _walk_tensors(output, "output"):
            if state["phase"] == "forward" and state["first"] is None:
                stats = tensor_stats(tensor, valid)
                if stats:
                    state["first"] = NonFinite(phase="forward", module=name, tensor=path, **stats)
                    raise _Stop
            if run_backward and tensor.requires_grad and tensor.is_floating_point():
                tensor.register_hook(grad_hook(name, path))

    for module in names:
        handles.append(module.register_forward_hook(forward_hook))
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    try:
        with torch.enable_grad() if run_backward else torch.no_grad():
            try:
                outputs = model(**batch)
            except _Stop:
                return state["first"]
            if not has_labels:
                return None
            loss = outputs["loss"] if isinstance(outputs, dict) else getattr(outputs, "loss", None)
            if loss is None:
                return None
            stats = tensor_stats(loss)
            if stats:
                return NonFinite(phase="loss", module="", tensor="loss",
                                 note=_loss_note(batch["labels"], ignore_index), **stats)
            if not run_backward or not params or not loss.requires_grad:
                return None
            state["phase"] = "backward"
            for pname, param in params:
                module_name, _, leaf = pname.rpartition(".")
                handles.append(param.register_hook(grad_hook(module_name, f"{leaf}.grad")))
            grads = torch.autograd.grad(loss, [p for _, p in params], allow_unused=True)
            del grads
            return state["first"]
    finally:
        for handle in handles:
            handle.remove()


# ---------------------------------------------------------------------------------------------
# KV caches


def _cache_layers(cache) -> Iterator[tuple[str, int, Any, Any]]:
    """(part, layer index, keys, values) of a transformers cache or a legacy tuple cache."""
    if hasattr(cache, "self_attention_cache") and hasattr(cache, "cross_attention_cache"):
        for part, sub in (("self", cache.self_attention_cache), ("cross", cache.cross_attention_cache)):
            for _, i, k, v in _cache_layers(sub):
                yield part, i, k, v
        return
    if hasattr(cache, "layers"):
        for i, layer in enumerate(cache.layers):
            yield "self", i, getattr(layer, "keys", None), getattr(layer, "values", None)
        return
    if isinstance(cache, (tuple, list)):
        for i, entry in enumerate(cache):
            if not isinstance(entry, (tuple, list)) or len(entry) < 2:
                raise UsageError(f"legacy cache entry {i} is not a (key, value) pair")
            yield "self", i, entry[0], entry[1]
        return
    raise UsageError(f"not a KV cache: {type(cache).__name__} (expected a transformers Cache or a tuple of (key, value))")


def nonfinite_in_cache(cache, attention_mask=None) -> list[CacheFinding]:
    """Every (layer, key|value) of the cache holding non-finite values; [] when clean.

    Keys and values are [batch, kv_heads, seq, head_dim]. With an `attention_mask` of
    [batch, seq] (the cached positions), padded positions are not checked.
    """
    valid = attention_mask.bool() if attention_mask is not None else None
    findings = []
    for part, layer, keys, values in _cache_layers(cache):
        for kind, tensor in (("key", keys), ("value", values)):
            if tensor is None or getattr(tensor, "numel", lambda: 0)() == 0:
                continue
            stats = tensor_stats(tensor, valid, seq_dim=2)
            if stats:
                findings.append(CacheFinding(layer=layer, kind=kind, count=stats["count"], nan=stats["nan"],
                                             inf=stats["inf"], shape=stats["shape"],
                                             first_index=stats["first_index"], part=part))
    return findings


# ---------------------------------------------------------------------------------------------
# Weights


def nonfinite_tensors(model_or_state_dict) -> list[NonFinite]:
    """Every floating parameter or buffer (or state-dict entry) holding NaN/Inf, phase "weights".
    Packed quantized storage (uint8 of 4-bit, int8) is not floating and is skipped."""
    if hasattr(model_or_state_dict, "named_parameters"):
        items: Iterable = itertools.chain(model_or_state_dict.named_parameters(),
                                          model_or_state_dict.named_buffers())
    elif isinstance(model_or_state_dict, dict):
        items = model_or_state_dict.items()
    else:
        raise UsageError(f"expected a model or a state dict, got {type(model_or_state_dict).__name__}")
    findings = []
    for name, tensor in items:
        stats = tensor_stats(tensor)
        if stats:
            module, _, leaf = name.rpartition(".")
            findings.append(NonFinite(phase="weights", module=module, tensor=leaf, **stats))
    return findings


# ---------------------------------------------------------------------------------------------
# Data check


def _labels_of(sample) -> Any:
    if isinstance(sample, dict):
        if "labels" in sample and sample["labels"] is not None:
            return sample["labels"]
        raise UsageError("check_labels: a sample has no 'labels'")
    return sample


def check_labels(samples, ignore_index: int = IGNORE_INDEX, shift: bool = True) -> list[LabelProblem]:
    """Samples that would contribute nothing to a causal-LM loss.

    `samples`: a dataset/iterable of dicts with "labels" (lists or tensors), or a 2-D labels
    tensor / batch dict. With `shift` (causal LMs: the label at position 0 is never predicted),
    a sample labelled only at position 0 has no target either. A batch made only of such samples
    gives loss 0/0 = NaN.
    """
    import torch

    if isinstance(samples, dict) and "labels" in samples and torch.is_tensor(samples["labels"]):
        samples = samples["labels"]
    if torch.is_tensor(samples):
        if samples.dim() == 1:
            samples = samples.unsqueeze(0)
        rows: Iterable = samples
    else:
        rows = (_labels_of(s) for s in samples)
    problems = []
    for index, labels in enumerate(rows):
        labels = labels.tolist() if torch.is_tensor(labels) else list(labels)
        labelled = sum(1 for x in labels if x != ignore_index)
        targets = sum(1 for x in (labels[1:] if shift else labels) if x != ignore_index)
        if labelled == 0:
            problems.append(LabelProblem(index, "all labels ignored", 0, len(labels)))
        elif targets == 0:
            problems.append(LabelProblem(index, "no target after the shift", labelled, len(labels)))
    return problems


def require_labels_ok(samples, ignore_index: int = IGNORE_INDEX, shift: bool = True) -> None:
    """check_labels, raising BadLabelsError (a CheckFailed) when any sample has no target."""
    problems = check_labels(samples, ignore_index, shift)
    if problems:
        raise BadLabelsError(problems)


