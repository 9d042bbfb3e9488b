"""Where the memory goes: an estimate's peak split into the parts a user can act on, and a text
bar chart of them (`estimate --explain`, the vram report's memory picture).

The parts sum to what the card needs: the allocator peak + the allocator's reserve + the CUDA
context. A training step's peak is either the forward/backward peak (activations kept for
backward, logits/loss, the gradients live then) or the optimizer step's (all LoRA gradients +
the step's temporaries), whichever the estimate found larger; a generation's is the prefill's or
the last decode step's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .calibration import precision_group

COMPONENTS = ("weights", "quantization state", "LoRA weights", "gradients", "optimizer states",
              "optimizer step temporaries", "activations kept for backward", "activations",
              "attention scores", "logits/loss", "KV cache", "loading transient", "allocator reserve",
              "CUDA context")
BAR_WIDTH = 40


@dataclass(frozen=True)
class Part:
    component: str
    bytes: int

    def as_dict(self) -> dict:
        return asdict(self)


def quant_state_bytes(shape, precision: str, weights_by_kind: dict) -> int:
    """The quantization state inside the linear layers' bytes: bitsandbytes' absmax / scales beyond
    the packed values (0 for unquantized precisions)."""
    group = precision_group(precision)
    if group not in ("4bit", "int8"):
        return 0
    linear = sum(v for k, v in weights_by_kind.items() if k.startswith("linear."))
    packed = shape.linear_params // 2 if group == "4bit" else shape.linear_params
    return max(0, linear - packed)


def parts(est, shape, context_bytes: int) -> list[Part]:
    """The estimate's card need, part by part (zero parts left out)."""
    bd = est.breakdown
    quant = quant_state_bytes(shape, est.precision, bd.get("weights_by_kind", {}))
    out = [Part("weights", bd["weights"] - quant), Part("quantization state", quant)]
    if est.mode == "train":
        out += _train_parts(est)
    elif est.mode == "weights":
        out.append(Part("loading transient", bd.get("loading_transient", 0)))
    else:
        out += _inference_parts(est)
    out += [Part("allocator reserve", est.reserve_bytes), Part("CUDA context", context_bytes)]
    return [p for p in out if p.bytes > 0]


def _train_parts(est) -> list[Part]:
    bd = est.breakdown
    common = [Part("LoRA weights", bd["lora_weights"]), Part("optimizer states", bd["optimizer_states"])]
    if bd.get("peak_phase") == "optimizer step":  # after backward: every LoRA gradient + the step's temporaries
        return common + [Part("gradients", bd["lora_grads"]),
                         Part("optimizer step temporaries", bd["optimizer_step_transient"])]
    return common + [Part("gradients", bd.get("gradients_live", 0)),
                     Part("activations kept for backward", bd["activations"]), Part("logits/loss", bd["loss_logits"])]


def _inference_parts(est) -> list[Part]:
    bd = est.breakdown
    logits, scores = bd.get("logits", 0), bd.get("attention_scores", 0)
    if est.mode == "generate" and bd.get("decode_peak", 0) >= bd.get("prefill_peak", 0):
        rest = est.peak_bytes - bd["weights"] - bd["kv_cache"] - logits
        return [Part("KV cache", bd["kv_cache"]), Part("activations", rest), Part("logits/loss", logits)]
    peak = bd.get("prefill_peak", est.peak_bytes)
    kv = peak - bd["weights"] - bd["activations"] - logits
    return [Part("KV cache", kv), Part("activations", bd["activations"] - scores),
            Part("attention scores", scores), Part("logits/loss", logits)]


def _size(n: int) -> str:
    from ...units import format_bytes

    return format_bytes(n)


def bar_chart(rows: list[Part], measured: dict[str, int] | None = None, width: int = BAR_WIDTH) -> list[str]:
    """One line per part: name, size, share, a '#' bar to scale; with `measured` (component ->
    bytes, e.g. from an allocator snapshot) a second bar of '=' below each predicted one."""
    total = sum(p.bytes for p in rows) or 1
    scale = max([p.bytes for p in rows] + list((measured or {}).values()) + [1])
    lines = []
    for p in rows:
        bar = "#" * max(1 if p.bytes else 0, round(width * p.bytes / scale))
        lines.append(f"  {p.component:30s} {_size(p.bytes):>10s} {100 * p.bytes / total:5.1f}% |{bar}")
        if measured is not None and p.component in measured:
            m = measured[p.component]
            lines.append(f"  {'  measured':30s} {_size(m):>10s} {'':6s}|{'=' * max(1 if m else 0, round(width * m / scale))}")
    return lines


def describe(est, shape, context_bytes: int, name: str = "") -> list[str]:
    """The picture of one estimate: a header, the bars, and the card total."""
    rows = parts(est, shape, context_bytes)
    what = f"{est.mode} {est.seq_len} tokens x {est.batch}" if est.mode != "weights" else "weights (loading)"
    if est.mode == "train":
        what += (f", LoRA r{est.lora_r} on {','.join(est.lora_targets or [])}, checkpointing "
                 f"{'on' if est.grad_checkpointing else 'off'}, {est.optimizer}")
    if est.mode == "generate":
        what += f" + {est.new_tokens} new"
    total = sum(p.bytes for p in rows)
    head = f"where the memory goes: {name + ' ' if name else ''}{est.precision} {what}"
    foot = (f"  {'card needs':30s} {_size(total):>10s}  (allocator peak {_size(est.peak_bytes)} + reserve "
            f"{_size(est.reserve_bytes)} + CUDA context {_size(context_bytes)})")
    return [head] + bar_chart(rows) + [foot]
