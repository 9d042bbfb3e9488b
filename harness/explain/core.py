"""Run every recogniser over the normalised text and pick the failure the text is about.

The primary finding is the most specific one (highest score: a vLLM KV-cache refusal beats the
CUDA OOM it mentions, a hardware Xid beats the NCCL error it caused); ties go to the one whose
evidence comes later in the text. The others are listed under `also`.

Before the recognisers run, the text is matched against the catalog of the libraries' own raise
and logging sites (harness.explain.catalog). A catalog hit names the raise site (library, version,
file, line) on the finding of the same kind; where no recogniser knows the message, the hit is the
finding itself, with its kind's general fix (kinds.Kind.fix) and a low score, so a recogniser
that read the text's figures still wins and the catalog's kind is listed under `also`. A catalog
kind comes from a rule over the message (scripts/explain_catalog.py), which is coarser than a
recogniser: it never overrides one.
"""

from __future__ import annotations

from . import catalog, finetune, hardware, multiproc, oom, serving, stack, training, vllm
from .kinds import REGISTRY
from .model import Cause, Context, Explanation, Finding
from .text import Log, condense

RECOGNISERS = (*vllm.RECOGNISERS, oom.recognise_cuda_oom, oom.recognise_host_oom, *stack.RECOGNISERS,
               *hardware.RECOGNISERS, *training.RECOGNISERS,
               *finetune.RECOGNISERS, *serving.RECOGNISERS, *multiproc.RECOGNISERS)


KINDS = tuple(REGISTRY)  # every recogniser module is imported above, so every kind is declared


def not_recognised() -> str:
    return (f"no known failure pattern in this text ({', '.join(k.title for k in REGISTRY.values())}); "
            "explain does not guess")


def _from_catalog(site: catalog.Site) -> Finding:
    kind = REGISTRY[site.kind]
    when = f" when {site.condition}" if site.condition else ""
    cause = Cause(f"{site.library} raises this ({site.exception}) at {site.file}:{site.line} in {site.library} "
                  f"{site.version or '?'}{when}", site.evidence)
    fix = (f"{kind.fix}. The message is {site.library}'s own: the code around {site.file}:{site.line} shows what "
           "triggers it.")
    message = site.evidence if len(site.evidence) <= 160 else site.evidence[:157] + "..."
    return Finding(site.kind, f"{kind.title}: {site.library} says {message!r}", [cause], fix, score=45,
                   position=site.position, source=site.as_dict())


def findings(text: str, ctx: Context | None = None) -> tuple[list[Finding], catalog.Site | None]:
    ctx = ctx or Context()
    log = Log.of(condense(text))
    site = catalog.match(log.text)
    found: list[Finding] = []
    for recognise in RECOGNISERS:
        found.extend(recognise(log, ctx))
    found.sort(key=lambda f: (f.score, f.position), reverse=True)
    if site and site.kind:
        same = [f for f in found if f.kind == site.kind]
        if same:
            same[0].source = site.as_dict()
        elif site.call == "raise" or site.call.startswith(("logger.error", "logger.critical", "logger.exception",
                                                          "logger.fatal")):  # a warning alone is no failure
            found.append(_from_catalog(site))
            found.sort(key=lambda f: (f.score, f.position), reverse=True)
    return found, site


def explain(text: str, config: str | None = None, gpu_memory: str | None = None) -> Explanation:
    found, site = findings(text, Context(config=config, gpu_memory=gpu_memory))
    if not found:
        what = not_recognised()
        if site:  # a library's message whose family explain does not map: say whose it is, claim no kind
            what += f"; the text matches {site.library}'s message at {site.file}:{site.line} ({site.exception})"
        return Explanation(False, None, what, [], "", None, source=site.as_dict() if site else None)
    top = found[0]
    also = [{"kind": f.kind, "what_happened": f.what_happened} for f in found[1:]
            if (f.kind, f.what_happened) != (top.kind, top.what_happened)]
    return Explanation(True, top.kind, top.what_happened, top.causes, top.fix, top.computed,
                       top.figures_from_log, also, top.source)


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
