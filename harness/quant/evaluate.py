"""The headline question for two model directories: did quantizing change what the model says?

`compare_models(base, quant)` runs both on the same held-out text (the paragraphs shipped in
data/heldout.txt, or a --text file) for the drift statistics, and on a fixed prompt set for the
greedy answers side by side. The logits come from this process (transformers + compressed-tensors
of the harness venv) or, with `python=`, from the llm-compressor venv's worker (the pair that
wrote the checkpoint: transformers 5.24 refuses the asymmetric zero points compressed-tensors 0.19
packs).
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .drift import Drift, Gate, drift
from .tokens import HELDOUT_TEXT, text_token_ids

# Short factual and instruction prompts a 135M instruct model answers sensibly when healthy.
PROMPTS = (
    "What is the capital of France?",
    "Name the three primary colors.",
    "What is 12 plus 7?",
    "What do bees make?",
    "Write a Python function that returns the square of a number.",
    "Translate 'thank you' into Spanish.",
)
MAX_NEW_TOKENS = 32


@dataclass(frozen=True)
class Answer:
    prompt: str
    base: str
    quantized: str

    @property
    def same(self) -> bool:
        return self.base.strip() == self.quantized.strip()


@dataclass
class Comparison:
    base_dir: str
    quantized_dir: str
    text: str  # where the evaluation text came from
    seq_len: int
    rows: int
    drift: Drift
    answers: list[Answer] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.drift.ok

    def to_dict(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k not in ("drift", "answers")}
        return out | {"ok": self.ok, "drift": self.drift.to_dict(),
                      "answers": [asdict(a) | {"same": a.same} for a in self.answers]}


def prompt_ids(tokenizer, prompts=PROMPTS) -> list[list[int]]:
    """The prompts through the model's chat template (as plain text when it has none)."""
    out = []
    for prompt in prompts:
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                 add_generation_prompt=True)
        else:
            text = prompt
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def greedy_ids(model, prompts: list[list[int]], max_new_tokens: int = MAX_NEW_TOKENS) -> list[list[int]]:
    import torch

    out = []
    with torch.no_grad():
        for ids in prompts:
            tensor = torch.tensor([ids], dtype=torch.long, device=model.device)
            generated = model.generate(tensor, attention_mask=torch.ones_like(tensor), max_new_tokens=max_new_tokens,
                                       do_sample=False)
            out.append(generated[0, len(ids):].tolist())
    return out


def outputs_here(model_dir, rows, prompts, device: str = "cpu", max_new_tokens: int = MAX_NEW_TOKENS):
    """(fp32 logits on `rows`, greedy continuation ids of each prompt) of a model directory, in
    this process (its transformers and compressed-tensors)."""
    import torch

    from ..models import load_model

    model = load_model(model_dir, "fp32", device)
    with torch.no_grad():
        logits = torch.cat([model(torch.tensor(rows[i:i + 4], device=model.device)).logits.float().cpu()
                            for i in range(0, len(rows), 4)])
    answers = greedy_ids(model, prompts, max_new_tokens)
    del model
    return logits, answers


def compare_models(base_dir, quantized_dir, text: str | None = None, text_name: str | None = None,
                   seq_len: int = 256, gate: Gate | None = None, device: str = "cpu", python=None,
                   prompts=PROMPTS, progress: bool = True) -> Comparison:
    from ..models import load_tokenizer

    tokenizer = load_tokenizer(base_dir)
    text = HELDOUT_TEXT.read_text(encoding="utf-8") if text is None else text
    rows = text_token_ids(tokenizer, text, seq_len)
    p_ids = prompt_ids(tokenizer, prompts)
    if python is not None:
        from .quantize import worker_logits

        results = worker_logits(python, [Path(base_dir), Path(quantized_dir)], rows, device, progress=progress,
                                prompts=p_ids, max_new_tokens=MAX_NEW_TOKENS)
        (ref, ref_answers), (quant, quant_answers) = results
    else:
        if progress:
            print(f"[drift] {len(rows)} rows x {seq_len} tokens and {len(prompts)} prompts through each model ...",
                  file=sys.stderr, flush=True)
        ref, ref_answers = outputs_here(base_dir, rows, p_ids, device)
        quant, quant_answers = outputs_here(quantized_dir, rows, p_ids, device)
    result = drift(ref, quant, rows, gate=gate)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    answers = [Answer(p, decode(a), decode(b)) for p, a, b in zip(prompts, ref_answers, quant_answers)]
    return Comparison(str(base_dir), str(quantized_dir), text_name or str(HELDOUT_TEXT), seq_len, len(rows),
                      result, answers)
