"""Nodes' results -> the fleet's answer: which node is ready, which is slower than its peers,
which runs another driver or vLLM.

Plain data in, plain data out: each node's outcome (its pytest run's JSON, partial when the node
died or ran out of time) becomes a row of verdict, versions and figures; figures are compared
with the median of the same GPU model across the fleet (an outlier is below 0.75 x that median,
the rule the per-model references use), versions with the fleet's most common one.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import env as env_mod
from ..pci import from_dicts as pci_from_dicts
from ..hw.references import FRACTION

# check name (as in the hw suite's records) -> (key in its figures, unit, label)
FIGURES = {
    "d2d_bandwidth": ("gbps", "GB/s", "D2D bandwidth"),
    "bf16_matmul_tflops": ("tflops", "TFLOP/s", "bf16 matmul"),
    "h2d_bandwidth": ("gbps", "GB/s", "H2D bandwidth"),
}
VERSIONS = ("driver", "cuda_driver", "torch", "torch_cuda", "transformers", "bitsandbytes", "vllm")
COMPARED_VERSIONS = {"driver": "NVIDIA driver", "vllm": "vLLM"}  # a node that differs is an outlier
VERDICT_ORDER = ("ready", "not ready", "died", "timed out", "error", "interrupted")


@dataclass
class Figure:
    metric: str  # a FIGURES key
    gpu: str  # e.g. "GPU0 (NVIDIA H200)"
    model: str  # the GPU's name, what figures are grouped by
    value: float
    unit: str


@dataclass
class NodeSummary:
    name: str
    node_id: str
    ip: str
    host: str
    state: str  # finished | died | timed out | error | interrupted | ...
    verdict: str  # one of VERDICT_ORDER
    reason: str  # one line: why that verdict
    gpu_state: str  # ready | absent | broken | unknown (the GPU probe on that node)
    gpu_reason: str
    gpus: list[str]
    ray_gpus: float
    tests: dict[str, int]  # outcome -> count, over what the node finished
    tests_done: int
    failures: list[dict[str, Any]]  # failed/errored tests: test, message, fix
    versions: dict[str, str | None]
    figures: list[Figure]
    seconds: float | None = None
    error: str | None = None
    log_tail: str = ""
    html_file: str | None = None  # the node's own pytest-html report, saved beside the fleet report


@dataclass
class Outlier:
    node: str
    kind: str  # figure | version
    what: str
    detail: str


@dataclass
class FleetReport:
    nodes: list[NodeSummary]
    outliers: list[Outlier]
    counts: dict[str, int]
    expected_tests: int  # most tests any finished node ran: a died node's progress is read against it
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.outliers and all(n.verdict == "ready" for n in self.nodes)

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": 1, "kind": "fleet-run", **self.meta, "ok": self.ok, "counts": self.counts,
                "expected_tests": self.expected_tests, "nodes": [asdict(n) for n in self.nodes],
                "outliers": [asdict(o) for o in self.outliers]}


def environment_from_dict(data: dict[str, Any]) -> env_mod.Environment:
    """The probe a node wrote into its results JSON, back as harness.env's dataclasses."""
    nvml = dict(data.get("nvml") or {"available": False})
    nvml["gpus"] = [env_mod.NvmlGpu(**{**g, "compute_capability": tuple(g["compute_capability"])
                                       if g.get("compute_capability") else None}) for g in nvml.get("gpus", [])]
    torch = dict(data.get("torch") or {"version": None})
    torch["devices"] = [env_mod.TorchDevice(**{**d, "capability": tuple(d["capability"])})
                        for d in torch.get("devices", [])]
    return env_mod.Environment(
        nvml=env_mod.NvmlProbe(**nvml), torch=env_mod.TorchProbe(**torch),
        packages=dict(data.get("packages") or {}), vllm=env_mod.VllmProbe(**(data.get("vllm") or {"python": None})),
        driver_evidence=list(data.get("driver_evidence") or []), pci_gpus=pci_from_dicts(data.get("pci_gpus")))


def versions_of(environment: dict[str, Any]) -> dict[str, str | None]:
    nvml, torch = environment.get("nvml") or {}, environment.get("torch") or {}
    packages, vllm = environment.get("packages") or {}, environment.get("vllm") or {}
    cuda = nvml.get("cuda_driver_version")
    return {"driver": nvml.get("driver_version"),
            "cuda_driver": f"{cuda // 1000}.{(cuda % 1000) // 10}" if isinstance(cuda, int) else None,
            "torch": torch.get("version"), "torch_cuda": torch.get("cuda_build"),
            "transformers": packages.get("transformers"), "bitsandbytes": packages.get("bitsandbytes"),
            "vllm": vllm.get("version")}


def gpu_names(environment: dict[str, Any]) -> list[str]:
    devices = (environment.get("torch") or {}).get("devices") or []
    if devices:
        return [d.get("name", "?") for d in devices]
    return [g.get("name", "?") for g in (environment.get("nvml") or {}).get("gpus") or []]


def figures_of(results: dict[str, Any]) -> list[Figure]:
    """Bandwidth and TFLOP/s the hw suite recorded, one per GPU (a check on several GPUs keeps
    each GPU's figures under details.per_gpu, in torch's device order)."""
    names = gpu_names(results.get("environment") or {})
    out = []
    for test in results.get("tests", []):
        record = test.get("record") or {}
        spec = FIGURES.get(record.get("check"))
        details = record.get("details") or {}
        if spec is None or not details:
            continue
        key, unit, _ = spec
        per_gpu = [d.get("details") or {} for d in details["per_gpu"]] if "per_gpu" in details else [details]
        for i, figs in enumerate(per_gpu):
            if isinstance(figs.get(key), (int, float)):
                model = names[i] if i < len(names) else "unknown GPU"
                out.append(Figure(record["check"], f"GPU{i} ({model})", model, float(figs[key]), unit))
    return out


def _failures(tests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"test": t["nodeid"].split("::")[-1], "message": t.get("message") or "",
             "fix": (t.get("record") or {}).get("fix") or ""}
            for t in tests if t.get("outcome") in ("failed", "error")]


def summarise_node(outcome: dict[str, Any], expected_tests: int = 0) -> NodeSummary:
    """One node's outcome (cluster.NodeOutcome as a dict) -> its row of the fleet report."""
    node, results = outcome["node"], outcome.get("results") or {}
    environment, tests = results.get("environment") or {}, results.get("tests") or []
    counts = dict(Counter(t.get("outcome", "?") for t in tests))
    failures = _failures(tests)
    try:
        readiness = env_mod.gpu_readiness(environment_from_dict(environment)) if environment else None
    except (TypeError, KeyError, ValueError):
        readiness = None
    state = outcome.get("state", "error")
    done = len(tests)
    of = f" of {expected_tests}" if expected_tests and done < expected_tests else ""
    if state == "finished" and not failures and outcome.get("exit_code") in (0, None):
        verdict, reason = "ready", f"{done} tests, none failed"
    elif state == "finished" and failures:
        verdict = "not ready"
        reason = f"{len(failures)} failed: " + ", ".join(f["test"].removeprefix("test_") for f in failures)
        first_fix = next((f["fix"] for f in failures if f["fix"]), "")
        if first_fix:
            reason += f" (fix: {first_fix})"
    elif state == "finished":
        verdict, reason = "error", f"pytest exited {outcome.get('exit_code')} ({done} tests recorded)"
    elif state == "died":
        verdict = "died"
        reason = f"died mid-run after {done}{of} tests" + (
            f" ({len(failures)} failed before: {', '.join(f['test'] for f in failures)})" if failures else "")
    elif state == "timed out":
        verdict, reason = "timed out", f"timed out after {done}{of} tests"
    elif state == "interrupted":
        verdict, reason = "interrupted", f"interrupted after {done}{of} tests"
    else:
        verdict, reason = "error", outcome.get("error") or f"state {state}"
    if outcome.get("error") and verdict in ("died", "timed out"):
        reason += f": {outcome['error']}"
    name = node.get("name") or node.get("host") or node.get("ip")
    return NodeSummary(
        name=name, node_id=node["node_id"], ip=node.get("ip", "?"), host=node.get("host", "?"), state=state,
        verdict=verdict, reason=reason,
        gpu_state=readiness.state if readiness else "unknown",
        gpu_reason=readiness.reason if readiness else "no environment probe reached the driver",
        gpus=gpu_names(environment), ray_gpus=float(node.get("gpus") or 0), tests=counts, tests_done=done,
        failures=failures, versions=versions_of(environment) if environment else {k: None for k in VERSIONS},
        figures=figures_of(results), seconds=outcome.get("seconds"), error=outcome.get("error"),
        log_tail=outcome.get("log_tail") or "")


def figure_outliers(nodes: list[NodeSummary], fraction: float = FRACTION) -> list[Outlier]:
    """A GPU whose figure is below `fraction` x the median of the same metric on the same GPU model."""
    groups: dict[tuple[str, str], list[tuple[NodeSummary, Figure]]] = {}
    for n in nodes:
        for f in n.figures:
            groups.setdefault((f.metric, f.model), []).append((n, f))
    out = []
    for (metric, model), members in sorted(groups.items()):
        if len(members) < 2:
            continue  # nothing to compare with
        median = statistics.median(f.value for _, f in members)
        for n, f in members:
            if f.value < fraction * median:
                out.append(Outlier(n.name, "figure", f"{FIGURES[metric][2]} on {f.gpu}",
                                   f"{f.value:.4g} {f.unit} is {f.value / median:.2f} x the median of {len(members)} "
                                   f"{model} GPUs ({median:.4g} {f.unit}; outlier below {fraction:g} x)"))
    return out


def version_outliers(nodes: list[NodeSummary]) -> list[Outlier]:
    """A node whose driver or vLLM differs from what most nodes run (a missing one differs too)."""
    reporting = [n for n in nodes if any(v is not None for v in n.versions.values())]
    out = []
    for key, label in COMPARED_VERSIONS.items():
        values = Counter(n.versions.get(key) for n in reporting)
        if len(values) < 2:
            continue
        (top, top_count), *rest = values.most_common()
        tie = rest and rest[0][1] == top_count
        for n in reporting:
            mine = n.versions.get(key)
            if tie or mine != top:
                fleet = ", ".join(f"{v or 'none'} on {c}" for v, c in values.most_common())
                out.append(Outlier(n.name, "version", label,
                                   f"{mine or 'none'} here; the fleet: {fleet} of {len(reporting)} nodes"
                                   + (" (no majority)" if tie else "")))
    return out


def fleet_report(outcomes: list[dict[str, Any]], meta: dict[str, Any] | None = None) -> FleetReport:
    finished = [len((o.get("results") or {}).get("tests") or []) for o in outcomes if o.get("state") == "finished"]
    expected = max(finished, default=0)
    nodes = [summarise_node(o, expected) for o in outcomes]
    names = Counter(n.name for n in nodes)
    for n in nodes:  # several nodes on one host (or one name): tell them apart by node id
        if names[n.name] > 1:
            n.name = f"{n.name} ({n.node_id[:8]})"
    counts = {v: sum(n.verdict == v for n in nodes) for v in VERDICT_ORDER}
    outliers = figure_outliers(nodes) + version_outliers(nodes)
    return FleetReport(nodes, outliers, {k: v for k, v in counts.items() if v}, expected, dict(meta or {}))
