"""Memory in an upgrade rehearsal: what each vLLM's start-up logged (KV cache tokens, max
concurrency, KV / model / CUDA-graph memory where that build logs them) beside the plan's
prediction for that version, the predicted KV delta beside the logged one, and the KV capacity
gated like a latency metric (the `kv_cache_tokens` row of gate_metrics.STARTUP_GATE_METRICS).

Logged KV tokens are deterministic (the same flags on the same release log the same figure), so
there is no noise interval: a drop beyond the threshold is REGRESSED, anything else OK; a log
without the figure is UNDECIDED, never OK. `gate_kv` is pure; `predict` calls the plan.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

from . import gate_metrics as gm

# The lines vLLM logs at start-up (0.32: v1/core/kv_cache_utils.py, v1/worker/cpu_worker.py,
# gpu_worker.py, gpu_model_runner.py). The CPU build logs no model or graph memory.
_KV_TOKENS = re.compile(r"(CPU|GPU|XPU|TPU)? ?KV cache size:\s*([\d,]+)\s*tokens")
_MAX_CONC = re.compile(r"Maximum concurrency for\s*([\d,]+)\s*tokens per request:\s*([\d.,]+)x")
_KV_SPACE_CPU = re.compile(r"Explicitly set \(([\d.]+)/[\d.]+\) GiB for KV cache")
_KV_MEM_GPU = re.compile(r"Available KV cache memory:\s*([\d.]+)\s*GiB")
_MODEL_MEM = re.compile(r"Model loading took\s*([\d.]+)\s*Gi?B")  # "GB" before 0.9
_GRAPH_MEM = re.compile(r"Graph capturing finished in [\d.]+ secs?, took\s*([\d.]+)\s*GiB"
                        r"|([\d.]+)\s*GiB for CUDAGraph memory")
_VERSION = re.compile(r"LLM engine \(v(\d+\.\d+\.\d+[^\s)]*)\)|vLLM API server version\s+v?(\d+\.\d+\.\d+\S*)")

KV_METRIC = gm.STARTUP_BY_NAME["kv_cache_tokens"]


def _num(text: str) -> float:
    return float(text.replace(",", ""))


@dataclass(frozen=True)
class StartupMemory:
    """What one start-up log says about memory (None: the log does not say)."""

    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_concurrency_at_tokens: int | None = None
    device: str | None = None  # "cpu" / "gpu" from the KV line
    kv_cache_gib: float | None = None  # CPU: VLLM_CPU_KVCACHE_SPACE as echoed; GPU: available KV memory
    model_gib: float | None = None
    graph_gib: float | None = None
    version: str | None = None


def parse_startup_memory(text: str) -> StartupMemory:
    tokens, conc = _KV_TOKENS.search(text), _MAX_CONC.search(text)
    kv_mem = _KV_SPACE_CPU.search(text) or _KV_MEM_GPU.search(text)
    model, graph, version = _MODEL_MEM.search(text), _GRAPH_MEM.search(text), _VERSION.search(text)
    return StartupMemory(
        kv_cache_tokens=int(_num(tokens.group(2))) if tokens else None,
        max_concurrency=_num(conc.group(2)) if conc else None,
        max_concurrency_at_tokens=int(_num(conc.group(1))) if conc else None,
        device=tokens.group(1).lower() if tokens and tokens.group(1) else None,
        kv_cache_gib=float(kv_mem.group(1)) if kv_mem else None,
        model_gib=float(model.group(1)) if model else None,
        graph_gib=float(graph.group(1) or graph.group(2)) if graph else None,
        version=(version.group(1) or version.group(2)) if version else None,
    )


@dataclass(frozen=True)
class Predicted:
    """The plan's figures for one server (verdict: the plan's starts yes / no / unknown)."""

    kv_cache_tokens: int | None
    max_concurrency: float | None
    verdict: str
    why: str = ""


@dataclass(frozen=True)
class KvSide:
    version: str
    logged: StartupMemory
    predicted: Predicted | None = None  # None: not planned (a CUDA build, or no start-up log to read)
    source: str = "start-up log"  # where `logged` came from


def _change(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or a <= 0 else b / a - 1


@dataclass(frozen=True)
class KvUpgrade:
    baseline: KvSide
    candidate: KvSide
    threshold: float
    logged_change: float | None
    predicted_change: float | None
    decision: str  # gate_metrics OK / REGRESSED / UNDECIDED
    why: str
    cause: str = ""  # the plan's cause of the predicted delta (plan --vllm-version A,B)

    def line(self) -> str:
        b, c = self.baseline.logged.kv_cache_tokens, self.candidate.logged.kv_cache_tokens
        figures = f"{_fmt(b)} -> {_fmt(c)} {KV_METRIC.unit}"
        if self.logged_change is not None:
            figures += f" ({100 * self.logged_change:+.1f}%"
            if self.predicted_change is not None:
                figures += f", predicted {100 * self.predicted_change:+.1f}%"
            figures += ")"
        return f"{KV_METRIC.name} {figures} vs -{100 * self.threshold:g}%: {self.decision}" + (
            f" ({self.why})" if self.decision != gm.OK else "")

    def rows(self) -> list[dict]:
        """One row per figure: logged and predicted for each version, and the two deltas."""
        out = []
        pairs = [("KV cache tokens", "kv_cache_tokens"), ("max concurrency", "max_concurrency")]
        for label, key in pairs:
            row: dict = {"figure": label}
            for side in (self.baseline, self.candidate):
                row[f"{side.version} logged"] = getattr(side.logged, key)
                row[f"{side.version} predicted"] = getattr(side.predicted, key) if side.predicted else None
            lb, lc = getattr(self.baseline.logged, key), getattr(self.candidate.logged, key)
            pb = getattr(self.baseline.predicted, key) if self.baseline.predicted else None
            pc = getattr(self.candidate.predicted, key) if self.candidate.predicted else None
            row["logged change %"] = _round_pct(_change(lb, lc))
            row["predicted change %"] = _round_pct(_change(pb, pc))
            out.append(row)
        for label, key in (("KV cache memory GiB", "kv_cache_gib"), ("model memory GiB", "model_gib"),
                           ("CUDA graph memory GiB", "graph_gib")):
            row = {"figure": label}
            for side in (self.baseline, self.candidate):
                row[f"{side.version} logged"] = getattr(side.logged, key)
            row["logged change %"] = _round_pct(_change(getattr(self.baseline.logged, key),
                                                        getattr(self.candidate.logged, key)))
            out.append(row)
        return out

    def table(self) -> str:
        """A plain-text table for the report page (None shows as 'not logged' / '-')."""
        header = ["figure"] + [f"{s.version} {w}" for s in (self.baseline, self.candidate)
                               for w in ("logged", "predicted")] + ["logged change", "predicted change"]
        lines = [header]
        for row in self.rows():
            cells = [row["figure"]]
            for s in (self.baseline, self.candidate):
                logged = row.get(f"{s.version} logged")
                cells.append("not logged" if logged is None else _fmt(logged))
                key = f"{s.version} predicted"
                cells.append("-" if key not in row or row[key] is None else _fmt(row[key]))
            for key in ("logged change %", "predicted change %"):
                cells.append("-" if row.get(key) is None else f"{row[key]:+.1f}%")
            lines.append(cells)
        widths = [max(len(str(r[i])) for r in lines) for i in range(len(header))]
        text = "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in lines)
        tail = "".join(f"\n{s.version}: figures from {s.source}" for s in (self.baseline, self.candidate)
                       if s.source != "start-up log")
        tail += f"\n{self.line()}"
        if self.cause:
            tail += f"\nplan's cause of the delta: {self.cause}"
        return text + tail

    def to_json(self) -> dict:
        return asdict(self) | {"metric": KV_METRIC.name, "unit": KV_METRIC.unit, "line": self.line()}


def _fmt(value) -> str:
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.2f}"
    return "-" if value is None else str(value)


def _round_pct(x: float | None) -> float | None:
    return None if x is None else round(100 * x, 2)


def gate_kv(baseline: KvSide, candidate: KvSide, threshold: float | None = None, cause: str = "") -> KvUpgrade:
    """The KV capacity's decision between two start-ups: REGRESSED when the candidate logged more
    than `threshold` (a share) fewer KV tokens than the baseline, OK otherwise, UNDECIDED when a
    log lacks the figure or the two were not sized from the same input (the CPU build's KV space)."""
    threshold = KV_METRIC.threshold if threshold is None else threshold
    b, c = baseline.logged, candidate.logged
    pb = baseline.predicted.kv_cache_tokens if baseline.predicted else None
    pc = candidate.predicted.kv_cache_tokens if candidate.predicted else None
    logged, predicted = _change(b.kv_cache_tokens, c.kv_cache_tokens), _change(pb, pc)
    missing = [f"the {name}'s ({s.version})" for name, s in (("baseline", baseline), ("candidate", candidate))
               if s.logged.kv_cache_tokens is None]
    if missing:
        decision = gm.UNDECIDED
        why = (f"{' and '.join(missing)} start-up log{'s have' if len(missing) > 1 else ' has'} no "
               "'KV cache size: N tokens' line")
    elif not b.kv_cache_tokens:
        decision, why = gm.UNDECIDED, "the baseline logged 0 KV tokens: nothing to take a ratio of"
    elif b.device == c.device == "cpu" and None not in (b.kv_cache_gib, c.kv_cache_gib) \
            and b.kv_cache_gib != c.kv_cache_gib:
        decision = gm.UNDECIDED
        why = (f"the two CPU servers were given different KV space ({b.kv_cache_gib:g} vs {c.kv_cache_gib:g} GiB, "
               "VLLM_CPU_KVCACHE_SPACE): not the same experiment")
    elif logged < -threshold:
        decision, why = gm.REGRESSED, f"KV capacity fell {-100 * logged:.1f}%, beyond the -{100 * threshold:g}% threshold"
    else:
        decision, why = gm.OK, "within the threshold"
    return KvUpgrade(baseline, candidate, threshold, logged, predicted, decision, why, cause)


def predict(model_dir: str | Path, flags: list[str], logged: StartupMemory, version: str,
            gpu=None) -> Predicted | None:
    """The plan for the server these flags started: on the CPU build from the KV space its log
    echoed (VLLM_CPU_KVCACHE_SPACE, an input: exact); on a CUDA build the plan for `gpu` (the
    card as CUDA reports it, harness.memory.fit.gpus.Gpu). None where neither is known."""
    return _as_predicted(_plan(model_dir, flags, logged, version, gpu))


def _as_predicted(plan) -> Predicted | None:
    if plan is None or isinstance(plan, Predicted):
        return plan
    return Predicted(plan.kv_cache_tokens, plan.max_concurrency, plan.verdict or ("yes" if plan.starts else "no"),
                     plan.reason)


def _plan(model_dir, flags: list[str], logged: StartupMemory, version: str, gpu):
    from ..errors import HarnessError
    from ..memory.vllm import vllm_servers as vs

    try:
        if logged.device == "cpu" and logged.kv_cache_gib is not None:
            return vs.cpu_server_plan(model_dir, list(flags), {"VLLM_CPU_KVCACHE_SPACE": logged.kv_cache_gib}, version)
        if logged.device == "gpu" and gpu is not None:
            from ..memory.vllm.vllm_plan import plan
            from ..memory.vllm.vllm_model import model_facts

            facts = model_facts(str(model_dir))
            return plan(facts, vs.gpu_query(facts, vs.flags_dict(list(flags)), gpu, version), search=False)
    except HarnessError as exc:  # a version or layout the rules do not cover: shown, never guessed
        return Predicted(None, None, "unknown", str(exc))
    return None


def rehearsal_kv(model_dir: str | Path, baseline: dict, candidate: dict, threshold: float | None = None,
                 gpu=None) -> KvUpgrade:
    """The KV part of an upgrade rehearsal from the `environment` blocks of the two bench results
    (server_version, flags, and server_log: the start-up log the launcher wrote); `gpu`: the card a
    CUDA build ran on, for its plan."""
    sides, plans = [], []
    for env in (baseline, candidate):
        path = env.get("server_log")
        if path and Path(path).is_file():
            logged, source = parse_startup_memory(Path(path).read_text(errors="replace")), "start-up log"
        else:  # moved results: the launcher's parse of the same log, without the device (so no plan)
            startup = env.get("startup") or {}
            logged = StartupMemory(startup.get("kv_cache_tokens"), startup.get("max_concurrency"),
                                   startup.get("max_concurrency_at_tokens"), None, startup.get("kv_cache_memory_gib"),
                                   version=startup.get("version"))
            source = (f"the results' startup block (start-up log {path or '(none)'} not found; not planned)"
                      if startup else f"nothing (start-up log {path or '(none)'} not found, no startup block)")
        version = env.get("server_version") or logged.version or "unknown"
        plans.append(_plan(model_dir, env.get("flags") or [], logged, version, gpu))
        sides.append(KvSide(version, logged, _as_predicted(plans[-1]), source))
    cause = ""
    if not any(p is None or isinstance(p, Predicted) for p in plans):
        from ..memory.vllm.vllm_upgrade_cause import cause as plan_cause

        cause = plan_cause(plans[0], plans[1], sides[0].version, sides[1].version)
    return gate_kv(sides[0], sides[1], threshold, cause)


def rehearsal_verdict(latency_verdict: str, latency_line: str, kv: KvUpgrade) -> str:
    """One verdict line for the rehearsal: the worse of the latency gate's and the KV gate's words."""
    word = gm.overall([latency_verdict, kv.decision])
    return f"{word}: memory: {kv.line()}; latency/throughput: {latency_line}"
