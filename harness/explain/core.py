"""Run every recogniser over the normalised text and pick the failure the text is about.

The primary finding is the most specific one (highest score: a vLLM KV-cache refusal beats the
CUDA OOM it mentions, a hardware Xid beats the NCCL error it caused); ties go to the one whose
evidence comes later in the text. The others are listed under `also`.
"""

from __future__ import annotations

from . import finetune, hardware, multiproc, oom, serving, stack, training, vllm
from .model import Context, Explanation, Finding
from .text import Log, condense

RECOGNISERS = (*vllm.RECOGNISERS, oom.recognise_cuda_oom, oom.recognise_host_oom, *stack.RECOGNISERS,
               *hardware.RECOGNISERS, *training.RECOGNISERS,
               *finetune.RECOGNISERS, *serving.RECOGNISERS, *multiproc.RECOGNISERS)


def not_recognised() -> str:
    from .kinds import REGISTRY

    return (f"no known failure pattern in this text ({', '.join(k.title for k in REGISTRY.values())}); "
            "explain does not guess")


def findings(text: str, ctx: Context | None = None) -> list[Finding]:
    ctx = ctx or Context()
    log = Log.of(condense(text))
    found: list[Finding] = []
    for recognise in RECOGNISERS:
        found.extend(recognise(log, ctx))
    return sorted(found, key=lambda f: (f.score, f.position), reverse=True)


def explain(text: str, config: str | None = None, gpu_memory: str | None = None) -> Explanation:
    found = findings(text, Context(config=config, gpu_memory=gpu_memory))
    if not found:
        return Explanation(False, None, not_recognised(), [], "", None)
    top = found[0]
    also = [{"kind": f.kind, "what_happened": f.what_happened} for f in found[1:]
            if (f.kind, f.what_happened) != (top.kind, top.what_happened)]
    return Explanation(True, top.kind, top.what_happened, top.causes, top.fix, top.computed,
                       top.figures_from_log, also)


def explain_short(text: str, limit: int = 400) -> str | None:
    """One line for a report row: kind, what happened and the fix; None when not recognised."""
    try:
        result = explain(text)
    except Exception:  # a report must never fail because an explanation did
        return None
    if not result.recognised:
        return None
    line = f"[{result.kind}] {result.what_happened}. Fix: {result.fix}"
    return line if len(line) <= limit else line[:limit - 3] + "..."
