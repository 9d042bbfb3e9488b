"""Server fixtures for the serving suite.

Starting vLLM on CPU costs about a minute, and two at once would compete for the same cores, so
one session-wide pool keeps at most one server alive and starts each kind once if the tests run
in file order: the old version (upgrade baseline), the new one, then the new one restarted with
--max-num-seqs 1 (the slowdown the gate must catch, and the server killed mid-run at the end).
With --endpoint the suite targets that server as "new" and skips what needs a restart.
"""

from __future__ import annotations

import contextlib
import json
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.serving.client import Target
from harness.serving.launcher import ServerProcess, launch_vllm
from harness.serving.runner import BenchConfig, run_bench
from harness.serving.workload import Workload

MAX_MODEL_LEN = 1024
BASE_FLAGS = ["--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager", "--max-num-seqs", "64"]
KINDS = {
    "old": ("baseline_vllm_python", BASE_FLAGS),
    "new": ("vllm_python", BASE_FLAGS),
    "new-max-num-seqs-1": ("vllm_python", ["--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager", "--max-num-seqs", "1"]),
}
# The gate's workload: small enough for CI, with enough requests for a per-request bootstrap.
GATE_WORKLOAD = Workload(input_len=64, output_len=16, num_prompts=24, seed=7)
GATE_CONCURRENCY = 4
GATE_REPEATS = 3


@dataclass
class Served:
    """A server under test: where it is, what it serves, and (if we started it) its process."""

    kind: str
    base_url: str
    model: str
    tokenizer_dir: Path | None
    process: ServerProcess | None = None
    max_model_len: int = MAX_MODEL_LEN

    def target(self, timeout_s: float = 60.0) -> Target:
        return Target(self.base_url, self.model, timeout_s=timeout_s)

    def environment(self) -> dict:
        env = self.process.environment() if self.process else {}
        return env | {"model_id": self.model, "server_kind": self.kind}


def _served_model(endpoint: str) -> tuple[str, int]:
    """The first model a server lists on /v1/models, and its max_model_len (vLLM lists it)."""
    try:
        with urllib.request.urlopen(endpoint + "/v1/models", timeout=10) as resp:
            entry = json.load(resp)["data"][0]
            return entry["id"], int(entry.get("max_model_len") or MAX_MODEL_LEN)
    except (OSError, ValueError, KeyError, IndexError) as exc:
        pytest.fail(f"{endpoint}: cannot list its models ({exc})", pytrace=False)


class ServerPool:
    def __init__(self, settings, model_dir: Path, log_dir: Path):
        self.settings, self.model_dir, self.log_dir = settings, model_dir, log_dir
        self._stack: contextlib.ExitStack | None = None
        self._current: Served | None = None
        self.started: list[str] = []

    def use(self, kind: str) -> Served:
        if self.settings.endpoint:
            if kind != "new":
                pytest.skip(f"--endpoint given: cannot start the {kind!r} server")
            name, max_len = _served_model(self.settings.endpoint)
            return Served("new", self.settings.endpoint, name,
                          self.model_dir if (self.model_dir / "tokenizer.json").is_file() else None,
                          max_model_len=max_len)
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
                                                        served_model_name=self.model_dir.name))
        self.started.append(kind)
        self._current = Served(kind, process.base_url, self.model_dir.name, self.model_dir, process)
        record_kv_plan(self.log_dir.parent / "kv_plan.json", kind, process, self.model_dir)
        return self._current

    def stop(self) -> None:
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


@pytest.fixture(scope="session")
def server_pool(settings, serving_model_dir, serving_dir, show_progress):
    pool = ServerPool(settings, serving_model_dir, serving_dir / "logs")
    yield pool
    pool.stop()


@pytest.fixture(scope="session")
def gate_results(serving_dir):
    """kind -> path of the gate workload's results (3 repeats), filled by the tests that run them."""
    return {}


@pytest.fixture(scope="session")
def gate_bench(show_progress):
    """run(served, out) -> results of the gate workload (3 repeats at concurrency 4)."""

    def run(served: Served, out: Path) -> dict:
        cfg = BenchConfig(target=served.target(), workload=GATE_WORKLOAD, concurrencies=[GATE_CONCURRENCY],
                          repeats=GATE_REPEATS, warmup=2, tokenizer_dir=served.tokenizer_dir, out=out,
                          environment=served.environment())
        with show_progress():
            return run_bench(cfg)

    return run


@pytest.fixture(scope="session")
def bench(show_progress):
    """bench(served, workload, concurrencies, out=None, ...) -> results dict (the library's runner)."""

    def run(served: Served, workload: Workload, concurrencies, out: Path | None = None,
            timeout_s: float = 60.0, warmup: int = 1, repeats: int = 1) -> dict:
        cfg = BenchConfig(target=served.target(timeout_s), workload=workload, concurrencies=list(concurrencies),
                          repeats=repeats, warmup=warmup, tokenizer_dir=served.tokenizer_dir, out=out,
                          environment=served.environment())
        with show_progress():
            return run_bench(cfg)

    return run


def record_kv_plan(path: Path, kind: str, process: ServerProcess, model_dir: Path) -> None:
    """Issue 15: every server's predicted against logged KV cache tokens and max concurrency."""
    from harness.memory.vllm_plan import append_record, server_kv_record

    append_record(path, server_kv_record(kind, process, model_dir))
