"""How far a quantized model drifted from the model it was made from, on the same tokens.

llama.cpp's measure (`llama-perplexity --kl-divergence`): the KL divergence KL(P_base || P_quant)
of the next-token distributions, position by position, summarised by its mean, median and upper
percentiles (p90, p99, max); with the top-1 agreement ("same top p": same argmax) and both
perplexities. KL is the one to gate on: on a random or barely trained model the logits are near
flat, so top-1 agreement swings on ties and perplexity sits near the vocabulary size whatever the
quantizer did. On a real model (smollm2-135m) all of them mean something; the gate there is
`REAL_MODEL_GATE` (thresholds chosen from measured figures: docs/quant.md).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

# Mean KL (nats per token) above which a quantized model is said to have drifted. A good W4A16
# GPTQ/AWQ of a real 7B model lands around 0.01-0.03 in llama.cpp's KL statistics (Q4_K_M ~0.03);
# the tiny models here land far below (docs/architecture.md: ~0.0005-0.0007). 0.05 passes every sane 4-bit
# quantization and fails a broken one (wrong scales or zero points give KL of order 1).
DEFAULT_MAX_MEAN_KL = 0.05


@dataclass(frozen=True)
class Gate:
    """Limits a quantized model must stay within. None: not checked."""

    max_mean_kl: float = DEFAULT_MAX_MEAN_KL
    max_p99_kl: float | None = None
    min_top1: float | None = None  # meaningful on a real model only


# Measured on smollm2-135m (bf16 base) over the held-out text, 1020 positions, W4A16 g64
# (benchmarks/quant/real_drift.py; docs/quant.md): AWQ mean KL 0.15, p99 0.57, top-1 76%; RTN
# 0.37 / 1.43 / 65%; GPTQ 0.61 / 2.31 / 59%; GPTQ repacked in AWQ order (broken) 15.2 / 30.6 /
# 0.1%. The limits sit above the worst sane one (1.6x GPTQ's mean, 2.6x its p99) and the broken
# repack 15x past the mean limit. A 135M model is far more sensitive to 4 bits than a 7B one:
# for larger models tighten --max-mean-kl (llama.cpp's Q4_K_M ~0.03).
REAL_MODEL_GATE = Gate(max_mean_kl=1.0, max_p99_kl=6.0, min_top1=0.5)


@dataclass(frozen=True)
class Drift:
    tokens: int  # positions compared (each predicts the next token)
    mean_kl: float  # nats per token, KL(reference || quantized)
    p99_kl: float
    max_kl: float
    top1_agreement: float  # fraction of positions with the same argmax
    ppl_reference: float  # perplexity of the reference on the text
    ppl_quantized: float
    max_mean_kl: float = DEFAULT_MAX_MEAN_KL
    median_kl: float = 0.0
    p90_kl: float = 0.0
    mean_kl_stderr: float = 0.0  # standard error of the mean, as llama.cpp prints it
    max_p99_kl: float | None = None
    min_top1: float | None = None

    @property
    def failures(self) -> list[str]:
        out = []
        if not (math.isfinite(self.mean_kl) and self.mean_kl <= self.max_mean_kl):
            out.append(f"mean KL {self.mean_kl:.4f} > {self.max_mean_kl}")
        if self.max_p99_kl is not None and not (math.isfinite(self.p99_kl) and self.p99_kl <= self.max_p99_kl):
            out.append(f"p99 KL {self.p99_kl:.4f} > {self.max_p99_kl}")
        if self.min_top1 is not None and not self.top1_agreement >= self.min_top1:
            out.append(f"top-1 agreement {self.top1_agreement:.1%} < {self.min_top1:.0%}")
        return out

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def ppl_ratio(self) -> float:
        return self.ppl_quantized / self.ppl_reference if self.ppl_reference else float("inf")

    def verdict(self) -> str:
        state = "ok" if self.ok else "DRIFTED (" + "; ".join(self.failures) + ")"
        return (f"{state}: mean KL {self.mean_kl:.5f} nats/token (limit {self.max_mean_kl}), p90 {self.p90_kl:.5f}, "
                f"p99 {self.p99_kl:.5f}, max {self.max_kl:.4f}, top-1 agreement {self.top1_agreement:.1%}, "
                f"perplexity {self.ppl_reference:.2f} -> {self.ppl_quantized:.2f} over {self.tokens} tokens")

    def to_dict(self) -> dict:
        return asdict(self) | {"ok": self.ok, "ppl_ratio": self.ppl_ratio, "failures": self.failures}


@dataclass
class _Positions:
    kl: list = field(default_factory=list)
    nll_p: list = field(default_factory=list)
    nll_q: list = field(default_factory=list)
    same: list = field(default_factory=list)


def _row_stats(ref, quant, ids, keep, acc: _Positions) -> None:
    import torch

    vocab = ref.shape[-1]
    log_p = torch.log_softmax(ref[:-1].reshape(-1, vocab).double(), dim=-1)[keep]
    log_q = torch.log_softmax(quant[:-1].reshape(-1, vocab).double(), dim=-1)[keep]
    target = ids[1:][keep]
    acc.kl.append((log_p.exp() * (log_p - log_q)).sum(-1).clamp_min(0.0))
    acc.nll_p.append(-log_p.gather(1, target[:, None]).squeeze(1))
    acc.nll_q.append(-log_q.gather(1, target[:, None]).squeeze(1))
    acc.same.append(log_p.argmax(-1) == log_q.argmax(-1))


def drift(reference_logits, quantized_logits, input_ids, attention_mask=None,
          max_mean_kl: float = DEFAULT_MAX_MEAN_KL, gate: Gate | None = None) -> Drift:
    """Compare two [batch, seq, vocab] logit tensors computed on the same `input_ids`.

    Position t's distribution predicts token t+1, so the last position of each row (and every
    position whose next token is padding) is left out of all measures. Rows are reduced one at a
    time (float64 log-softmax of a 49k vocabulary is large)."""
    import torch

    ref = torch.as_tensor(reference_logits)
    quant = torch.as_tensor(quantized_logits)
    ids = torch.as_tensor(input_ids)
    if ref.shape != quant.shape:
        raise ValueError(f"logits differ in shape: {tuple(ref.shape)} vs {tuple(quant.shape)} (same tokens needed)")
    if ref.dim() != 3 or tuple(ids.shape) != tuple(ref.shape[:2]):
        raise ValueError(f"logits {tuple(ref.shape)} do not match input_ids {tuple(ids.shape)}")
    mask = torch.ones_like(ids, dtype=torch.bool) if attention_mask is None else torch.as_tensor(attention_mask).bool()
    keep = mask[:, :-1] & mask[:, 1:]
    if not bool(keep.any()):
        raise ValueError("no position with a next token to compare")
    acc = _Positions()
    for row in range(ids.shape[0]):
        if bool(keep[row].any()):
            _row_stats(ref[row], quant[row], ids[row], keep[row], acc)
    kl, nll_p, nll_q = torch.cat(acc.kl), torch.cat(acc.nll_p), torch.cat(acc.nll_q)
    gate = gate or Gate(max_mean_kl=max_mean_kl)
    n = kl.numel()
    quantile = (lambda q: float(torch.quantile(kl, q))) if n > 1 else (lambda q: float(kl.max()))
    return Drift(
        tokens=n,
        mean_kl=float(kl.mean()),
        p99_kl=quantile(0.99),
        max_kl=float(kl.max()),
        top1_agreement=float(torch.cat(acc.same).double().mean()),
        ppl_reference=float(nll_p.mean().exp()),
        ppl_quantized=float(nll_q.mean().exp()),
        max_mean_kl=gate.max_mean_kl,
        median_kl=quantile(0.5),
        p90_kl=quantile(0.90),
        mean_kl_stderr=float(kl.std() / math.sqrt(n)) if n > 1 else 0.0,
        max_p99_kl=gate.max_p99_kl,
        min_top1=gate.min_top1,
    )


def model_logits(model_dir, input_ids, device: str = "cpu", dtype: str = "fp32", batch_size: int = 8):
    """[batch, seq, vocab] float32 logits of a model directory on `input_ids` (a list of equal-length
    rows or a tensor). transformers decompresses a compressed-tensors checkpoint to plain Linear
    layers on load (with compressed-tensors installed), so the quantized model's values are exact."""
    import torch

    from ..models import load_model

    ids = torch.as_tensor(input_ids, dtype=torch.long)
    model = load_model(model_dir, dtype, device)
    rows = []
    with torch.no_grad():
        for start in range(0, ids.shape[0], batch_size):
            chunk = ids[start:start + batch_size].to(model.device)
            rows.append(model(chunk).logits.float().cpu())
    del model
    return torch.cat(rows)
