"""How far a quantized model drifted from the model it was made from, on the same tokens.

llama.cpp's measure: the KL divergence KL(P_ref || P_quant) of the next-token distributions,
position by position, averaged; with the top-1 agreement (same argmax) and both perplexities.
KL is the one to gate on: on a random or barely trained model the logits are near flat, so top-1
agreement swings on ties and perplexity sits near the vocabulary size whatever the quantizer did.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

# Mean KL (nats per token) above which a quantized model is said to have drifted. A good W4A16
# GPTQ/AWQ of a real 7B model lands around 0.01-0.03 in llama.cpp's KL statistics (Q4_K_M ~0.03);
# the tiny models here land far below (docs/architecture.md: ~0.0005-0.0007). 0.05 passes every sane 4-bit
# quantization and fails a broken one (wrong scales or zero points give KL of order 1).
DEFAULT_MAX_MEAN_KL = 0.05


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

    @property
    def ok(self) -> bool:
        return math.isfinite(self.mean_kl) and self.mean_kl <= self.max_mean_kl

    @property
    def ppl_ratio(self) -> float:
        return self.ppl_quantized / self.ppl_reference if self.ppl_reference else float("inf")

    def verdict(self) -> str:
        state = "ok" if self.ok else "DRIFTED"
        return (f"{state}: mean KL {self.mean_kl:.5f} nats/token (limit {self.max_mean_kl}), p99 {self.p99_kl:.5f}, "
                f"top-1 agreement {self.top1_agreement:.1%}, perplexity {self.ppl_reference:.2f} -> "
                f"{self.ppl_quantized:.2f} over {self.tokens} tokens")

    def to_dict(self) -> dict:
        return asdict(self) | {"ok": self.ok, "ppl_ratio": self.ppl_ratio}


def drift(reference_logits, quantized_logits, input_ids, attention_mask=None,
          max_mean_kl: float = DEFAULT_MAX_MEAN_KL) -> Drift:
    """Compare two [batch, seq, vocab] logit tensors computed on the same `input_ids`.

    Position t's distribution predicts token t+1, so the last position of each row (and every
    position whose next token is padding) is left out of all measures."""
    import torch

    ref = torch.as_tensor(reference_logits)
    quant = torch.as_tensor(quantized_logits)
    ids = torch.as_tensor(input_ids)
    if ref.shape != quant.shape:
        raise ValueError(f"logits differ in shape: {tuple(ref.shape)} vs {tuple(quant.shape)} (same tokens needed)")
    if ref.dim() != 3 or tuple(ids.shape) != tuple(ref.shape[:2]):
        raise ValueError(f"logits {tuple(ref.shape)} do not match input_ids {tuple(ids.shape)}")
    mask = torch.ones_like(ids, dtype=torch.bool) if attention_mask is None else torch.as_tensor(attention_mask).bool()
    keep = (mask[:, :-1] & mask[:, 1:]).reshape(-1)
    if not bool(keep.any()):
        raise ValueError("no position with a next token to compare")
    vocab = ref.shape[-1]
    log_p = torch.log_softmax(ref[:, :-1].reshape(-1, vocab).double(), dim=-1)[keep]
    log_q = torch.log_softmax(quant[:, :-1].reshape(-1, vocab).double(), dim=-1)[keep]
    target = ids[:, 1:].reshape(-1)[keep]
    kl = (log_p.exp() * (log_p - log_q)).sum(-1).clamp_min(0.0)
    nll_p = -log_p.gather(1, target[:, None]).squeeze(1)
    nll_q = -log_q.gather(1, target[:, None]).squeeze(1)
    return Drift(
        tokens=int(keep.sum()),
        mean_kl=float(kl.mean()),
        p99_kl=float(torch.quantile(kl, 0.99)) if kl.numel() > 1 else float(kl.max()),
        max_kl=float(kl.max()),
        top1_agreement=float((log_p.argmax(-1) == log_q.argmax(-1)).double().mean()),
        ppl_reference=float(nll_p.mean().exp()),
        ppl_quantized=float(nll_q.mean().exp()),
        max_mean_kl=max_mean_kl,
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


def compare_dirs(reference_dir, quantized_dir, input_ids, device: str = "cpu", dtype: str = "fp32",
                 max_mean_kl: float = DEFAULT_MAX_MEAN_KL) -> Drift:
    """Drift of `quantized_dir` against `reference_dir`, both run here on the same ids."""
    reference = model_logits(reference_dir, input_ids, device, dtype)
    quantized = model_logits(quantized_dir, input_ids, device, dtype)
    return drift(reference, quantized, input_ids, max_mean_kl=max_mean_kl)
