"""Server fixtures for the serving suite.

Starting vLLM on CPU costs 15-25 s of one core, mostly importing it in two processes. The
session-wide pool starts each kind of server once: the old version (upgrade baseline), the new one,
the new one with --max-num-seqs 1 (the slowdown the gate must catch, and the server killed mid-run),
and the new one with the HTTP-layer TTFT middleware. On the CPU build, where an idle server takes no
core (0.35 CPU-s in 20 s, measured) and memory allows, the kinds the selected tests declare
(`server_kinds` marker) start side by side at the first one's use and stay up: the starts share the
cores instead of following each other. With a GPU, or where memory is short, one server at a time.
With --endpoint the suite targets that server as "new": --model names the served model (checked
against /v1/models before anything runs), prompts are measured with the server's own tokenizer
unless --model is also a local directory, and what needs a restart, or would crash, kill or
overload the server (`destructive`), skips.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.plugin_run import run_state
from harness.serving import prompts
from harness.serving.client import RequestSpec, Target
from harness.serving.endpoint import resolve_served_model
from harness.serving.launcher import ServerProcess, launch_vllm
from harness.serving.runner import BenchConfig, run_bench
from harness.serving.workload import PromptTokenizer, Workload

MAX_MODEL_LEN = 1024
BASE_FLAGS = ["--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager", "--max-num-seqs", "64"]
KINDS = {
    "old": ("baseline_vllm_python", BASE_FLAGS),
    "new": ("vllm_python", BASE_FLAGS),
    "new-max-num-seqs-1": ("vllm_python", ["--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager", "--max-num-seqs", "1"]),
    "new-http-ttft": ("vllm_python", BASE_FLAGS),  # with the harness's HTTP-layer TTFT middleware
}
HTTP_TTFT_KINDS = {"new-http-ttft"}
# The gate's workload: small enough for CI, with enough requests for a per-request bootstrap.
GATE_WORKLOAD = Workload(input_len=64, output_len=16, num_prompts=24, seed=7)
GATE_CONCURRENCY = 4
GATE_REPEATS = 3


def pytest_configure(config):
    """--endpoint with a --model the server does not serve: one usage line before anything runs."""
    config.addinivalue_line("markers", "server_kinds(*kinds): the pool's servers (KINDS) a test uses: "
                            "the pool starts the kinds of the selected tests side by side")
    run = run_state(config)
    settings = run.settings if run is not None else None
    if settings is None or not settings.endpoint:
        return
    try:
        resolve_served_model(settings.endpoint, settings.served_model)
    except HarnessError as exc:
        raise pytest.UsageError(str(exc)) from None


@dataclass
class Served:
    """A server under test: where it is, what it serves, and (if we started it) its process."""

    kind: str
    base_url: str
    model: str
    tokenizer_dir: Path | None  # a local tokenizer; None: prompts are measured by the server
    process: ServerProcess | None = None
    max_model_len: int = MAX_MODEL_LEN
    _calibration: dict = field(default_factory=dict)  # api -> prompts.Calibration

    def target(self, timeout_s: float = 60.0, api: str = "completions") -> Target:
        return Target(self.base_url, self.model, api=api, timeout_s=timeout_s)

    def environment(self) -> dict:
        env = self.process.environment() if self.process else {}
        return env | {"model_id": self.model, "server_kind": self.kind}

    def specs(self, workload: Workload) -> list[RequestSpec]:
        """Prompts of exactly workload.input_len tokens as this server counts them."""
        tokenizer = PromptTokenizer(self.tokenizer_dir) if self.tokenizer_dir else None
        specs, cal = prompts.make_specs(self.target(api=workload.api), workload, tokenizer,
                                        self._calibration.get(workload.api),
                                        tokenizer_option="--model DIR (a local model directory with its tokenizer.json)")
        self._calibration[workload.api] = cal
        return specs

    def spec(self, n_in: int, n_out: int = 1, seed: int = 0) -> RequestSpec:
        return self.specs(Workload(input_len=n_in, output_len=n_out, num_prompts=1, seed=seed))[0]


# Beside its KV cache space and its weights, what one vLLM CPU server of a tiny model holds: its
# two processes peaked at 1.7 GB resident on the 2-core box (torch and vLLM imported in each).
SERVER_RUNTIME_BYTES = 2 * 2**30


class ServerPool:
    def __init__(self, settings, model_dir: Path, log_dir: Path, gpu=None, planned: tuple[str, ...] = ()):
        self.settings, self.model_dir, self.log_dir = settings, model_dir, log_dir
        self.gpu = gpu  # harness.memory.fit.gpus.Gpu of cuda:0, for the KV plan of a CUDA vLLM
        self.planned = planned  # the kinds the selected tests declare, each once, in their order
        self._up: dict[str, tuple[contextlib.ExitStack | None, Served]] = {}
        self.started: list[str] = []

    def use(self, kind: str) -> Served:
        if self.settings.endpoint:
            if kind != "new":
                pytest.skip(f"--endpoint given: cannot start the {kind!r} server")
            if "new" not in self._up:
                model = resolve_served_model(self.settings.endpoint, self.settings.served_model)
                # Only a --model that is itself a local directory gives a tokenizer; never guess one.
                local = Path(self.settings.model) if self.settings.model else None
                tokenizer = local if local and (local / "tokenizer.json").is_file() else None
                self._up["new"] = (None, Served("new", self.settings.endpoint, model.name, tokenizer,
                                                max_model_len=model.max_model_len or MAX_MODEL_LEN))
            return self._up["new"][1]
        if kind in self._up:
            if self._up[kind][1].process.alive():
                return self._up[kind][1]
            self.stop(kind)
        if self._python(kind) is None:
            python_attr = KINDS[kind][0]
            pytest.skip(f"no vLLM interpreter for the {kind!r} server ({python_attr.replace('_', '-')} not set, venv missing)")
        beside = [k for k in self.planned
                  if k != kind and k not in self._up and k not in self.started and self._python(k) is not None]
        if not self._side_by_side([kind, *beside]):
            self.stop()
            beside = []
        self._start([kind, *beside])
        return self._up[kind][1]

    def _python(self, kind: str):
        return getattr(self.settings, KINDS[kind][0])

    def _side_by_side(self, kinds: list[str]) -> bool:
        """Whether these start beside what is up: CPU builds only (a CUDA vLLM asks its share of the
        whole card), and the memory they need available."""
        from harness.serving import gate_servers

        if self.gpu is not None or not all(gate_servers.cpu_build(self._python(k)) for k in kinds):
            return False
        weights = sum(f.stat().st_size for f in self.model_dir.iterdir() if f.suffix in (".safetensors", ".bin"))
        kv = float(os.environ.get("VLLM_CPU_KVCACHE_SPACE") or 1) * 2**30  # the launcher's 1 GiB unless set
        return len(kinds) * (kv + weights + SERVER_RUNTIME_BYTES) <= gate_servers.meminfo("MemAvailable")

    def _start(self, kinds: list[str]) -> None:
        """Start every kind at once, then wait for each. The first kind's failed start is the
        caller's error (and stops the others); another's is its own test's, at its own start."""
        pending: list[tuple[str, contextlib.ExitStack, ServerProcess]] = []
        try:
            for kind in kinds:
                stack = contextlib.ExitStack()
                pending.append((kind, stack, stack.enter_context(launch_vllm(
                    self._python(kind), self.model_dir, KINDS[kind][1], log_dir=self.log_dir, wait=False,
                    served_model_name=self.model_dir.name, http_ttft=kind in HTTP_TTFT_KINDS))))
            for i, (kind, stack, process) in enumerate(pending):
                try:
                    process.wait_healthy()
                except HarnessError:
                    if i == 0:
                        raise
                    stack.close()
                    continue
                self.started.append(kind)
                self._up[kind] = (stack, Served(kind, process.base_url, self.model_dir.name, self.model_dir, process))
                record_kv_plan(self.log_dir.parent / "kv_plan.json", kind, process, self.model_dir, self.gpu)
        except BaseException:
            for kind, stack, _ in pending:
                self._up.pop(kind, None)
                stack.close()
            raise

    def stop(self, kind: str | None = None) -> None:
        """Stop that kind's server, or every one (None)."""
        if self.settings.endpoint:
            return  # never stop what we did not start
        for k in [kind] if kind is not None else list(self._up):
            stack, _ = self._up.pop(k, (None, None))
            if stack is not None:
                stack.close()


@pytest.fixture(scope="session")
def serving_model_dir(model_dir) -> Path:
    return Path(model_dir)


@pytest.fixture(scope="session")
def serving_dir(report_dir) -> Path:
    path = Path(report_dir) / "serving"
    path.mkdir(parents=True, exist_ok=True)
    return path


def cuda_card(environment):
    """cuda:0 as CUDA reports it (torch's total, as vLLM reads it; else NVML's), or None."""
    from harness.memory.fit.gpus import Gpu

    devices = getattr(environment.torch, "devices", None) or []
    if devices:
        d = devices[0]
        return Gpu(d.name, int(d.total_memory), tuple(d.capability), "torch")
    gpus = getattr(environment.nvml, "gpus", None) or []
    if gpus:
        g = gpus[0]
        return Gpu(g.name, int(g.memory_total), tuple(g.compute_capability or (8, 0)), "nvml")
    return None


@pytest.fixture(scope="session")
def server_pool(request, settings, serving_model_dir, serving_dir, show_progress, harness_env):
    planned = tuple(dict.fromkeys(kind for item in request.session.items
                                  if (mark := item.get_closest_marker("server_kinds")) for kind in mark.args))
    pool = ServerPool(settings, serving_model_dir, serving_dir / "logs", cuda_card(harness_env), planned)
    yield pool
    pool.stop()


@pytest.fixture(scope="session")
def gate_workload() -> tuple[Workload, int]:
    """(workload, concurrency) of the gate's runs, for the tests that call the gate commands."""
    return GATE_WORKLOAD, GATE_CONCURRENCY


@pytest.fixture(scope="session")
def gate_results(serving_dir):
    """kind -> path of the gate workload's results (3 repeats), filled by the tests that run them."""
    return {}


@pytest.fixture(scope="session")
def quiet(pytestconfig) -> bool:
    """-q: no per-run lines from the bench runs."""
    return pytestconfig.get_verbosity() < 0


@pytest.fixture(scope="session")
def gate_bench(show_progress, quiet):
    """run(served, out) -> results of the gate workload (3 repeats at concurrency 4)."""

    def run(served: Served, out: Path) -> dict:
        cfg = BenchConfig(target=served.target(), workload=GATE_WORKLOAD, concurrencies=[GATE_CONCURRENCY],
                          repeats=GATE_REPEATS, warmup=2, tokenizer_dir=served.tokenizer_dir, out=out,
                          environment=served.environment(), quiet=quiet)
        with show_progress():
            return run_bench(cfg)

    return run


@pytest.fixture(scope="session")
def bench(show_progress, quiet):
    """bench(served, workload, concurrencies, out=None, ...) -> results dict (the library's runner)."""

    def run(served: Served, workload: Workload, concurrencies, out: Path | None = None,
            timeout_s: float = 60.0, warmup: int = 1, repeats: int = 1) -> dict:
        cfg = BenchConfig(target=served.target(timeout_s, workload.api), workload=workload,
                          concurrencies=list(concurrencies), repeats=repeats, warmup=warmup,
                          tokenizer_dir=served.tokenizer_dir, out=out, environment=served.environment(), quiet=quiet)
        with show_progress():
            return run_bench(cfg)

    return run


def record_kv_plan(path: Path, kind: str, process: ServerProcess, model_dir: Path, gpu=None) -> None:
    """Issue 15: every server's predicted against logged KV cache tokens and max concurrency."""
    from harness.memory.vllm.vllm_servers import append_record, server_kv_record

    append_record(path, server_kv_record(kind, process, model_dir, gpu=gpu))
