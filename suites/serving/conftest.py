"""Server fixtures for the serving suite.

Starting vLLM on CPU costs about a minute, and two at once would compete for the same cores, so
one session-wide pool keeps at most one server alive and starts each kind once if the tests run
in file order: the old version (upgrade baseline), the new one, then the new one restarted with
--max-num-seqs 1 (the slowdown the gate must catch, and the server killed mid-run at the end).
With --endpoint the suite targets that server as "new": --model names the served model (checked
against /v1/models before anything runs), prompts are measured with the server's own tokenizer
unless --model is also a local directory, and what needs a restart, or would crash, kill or
overload the server (`destructive`), skips.
"""

from __future__ import annotations

import contextlib
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


class ServerPool:
    def __init__(self, settings, model_dir: Path, log_dir: Path, gpu=None):
        self.settings, self.model_dir, self.log_dir = settings, model_dir, log_dir
        self.gpu = gpu  # harness.memory.fit.gpus.Gpu of cuda:0, for the KV plan of a CUDA vLLM
        self._stack: contextlib.ExitStack | None = None
        self._current: Served | None = None
        self.started: list[str] = []

    def use(self, kind: str) -> Served:
        if self.settings.endpoint:
            if kind != "new":
                pytest.skip(f"--endpoint given: cannot start the {kind!r} server")
            if self._current is None:
                model = resolve_served_model(self.settings.endpoint, self.settings.served_model)
                # Only a --model that is itself a local directory gives a tokenizer; never guess one.
                local = Path(self.settings.model) if self.settings.model else None
                tokenizer = local if local and (local / "tokenizer.json").is_file() else None
                self._current = Served("new", self.settings.endpoint, model.name, tokenizer,
                                       max_model_len=model.max_model_len or MAX_MODEL_LEN)
            return self._current
        if self._current is not None and self._current.kind == kind:
            if self._current.process.alive():
                return self._current
        self.stop()
        python_attr, flags = KINDS[kind]
        python = getattr(self.settings, python_attr)
        if python is None:
            pytest.skip(f"no vLLM interpreter for the {kind!r} server ({python_attr.replace('_', '-')} not set, venv missing)")
        self._stack = contextlib.ExitStack()
        process = self._stack.enter_context(launch_vllm(python, self.model_dir, flags, log_dir=self.log_dir,
                                                        served_model_name=self.model_dir.name,
                                                        http_ttft=kind in HTTP_TTFT_KINDS))
        self.started.append(kind)
        self._current = Served(kind, process.base_url, self.model_dir.name, self.model_dir, process)
        record_kv_plan(self.log_dir.parent / "kv_plan.json", kind, process, self.model_dir, self.gpu)
        return self._current

    def stop(self) -> None:
        if self.settings.endpoint:
            return  # never stop what we did not start
        if self._stack is not None:
            self._stack.close()
        self._stack, self._current = None, None


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
def server_pool(settings, serving_model_dir, serving_dir, show_progress, harness_env):
    pool = ServerPool(settings, serving_model_dir, serving_dir / "logs", cuda_card(harness_env))
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
