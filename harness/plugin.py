"""The harness's pytest plugin: options, markers, fixtures and report hooks.

This is the only pytest-aware module; everything it does is a call into the library. Suites ask
it for settings, the probed environment, a device, models and a `record` of their figures; it
turns the GPU markers into skips (no driver) or failures (a driver torch cannot use), and makes
every run leave a self-contained HTML report and a JSON results file under reports/.
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from pathlib import Path
from typing import Any

import pytest

from . import atomic
from . import env as env_mod
from . import models
from . import settings as settings_mod
from .errors import UsageError
from .fleet import merge as fleet_merge
from .fleet.gpus import visible_gpus
from .report import html as report_html
from .report import machine as report_machine
from .report.results import RunResults, TestResult

MARKERS = {
    "gpu": "needs a usable NVIDIA GPU (skips without a driver, fails when the driver is there but torch cannot use it)",
    "multi_gpu": "needs two or more GPUs",
    "bnb": "needs bitsandbytes with a working native library",
    "vllm": "needs a vLLM interpreter (--vllm-python) or a running server (--endpoint)",
    "slow": "takes more than a few seconds",
    "destructive": "crashes, kills, overloads past failure or restarts a server: only on servers the harness started",
}
OPTION_NAMES = ("model", "device", "vram_budget", "precisions", "expect_gpu", "report_dir",
                "vllm_python", "baseline_vllm_python", "endpoint", "baseline", "hw_level",
                "llmcompressor_python")

settings_key = pytest.StashKey[settings_mod.Settings]()
env_key = pytest.StashKey[env_mod.Environment]()
results_key = pytest.StashKey[RunResults]()
html_fragments_key = pytest.StashKey[list]()
record_key = pytest.StashKey[dict]()


def pytest_addoption(parser):
    group = parser.getgroup("harness", "LLM harness")
    group.addoption("--model", default=None,
                    help="model directory, or a reference name (qwen2.5-0.5b, ...; tiny-qwen2, tiny-llama); "
                         "default: the embedded tiny model")
    group.addoption("--device", default=None, help="auto (default), cpu, cuda or cuda:N")
    group.addoption("--vram-budget", default=None,
                    help="run GPU fixtures inside this budget, e.g. 6GiB (emulates a small card on a large one)")
    group.addoption("--precisions", default=None,
                    help=f"comma list of precisions to run (default all: {','.join(settings_mod.PRECISIONS)})")
    group.addoption("--expect-gpu", action="store_true", default=False,
                    help="fail, rather than skip, GPU checks when no usable GPU is found")
    group.addoption("--report-dir", default=None, help="where HTML and JSON reports go (default: reports/)")
    group.addoption("--vllm-python", default=None,
                    help="python of the venv holding vLLM (default: .venvs/vllm-0.32.0/bin/python)")
    group.addoption("--baseline-vllm-python", default=None,
                    help="python of an older vLLM venv for the upgrade rehearsal (default: .venvs/vllm-0.31.0/bin/python)")
    group.addoption("--endpoint", default=None,
                    help="an already running OpenAI-compatible server to test instead of starting vLLM")
    group.addoption("--baseline", default=None, help="bench results JSON to compare this run's serving figures against")
    group.addoption("--hw-level", default=None, help="hardware check depth: quick (default) or full")
    group.addoption("--llmcompressor-python", default=None,
                    help="python of the venv holding llm-compressor, for the quantize step "
                         "(default: .venvs/llmcompressor/bin/python)")


# ---------------------------------------------------------------------------------------------
# Configuration: settings, environment probe, report paths


def _suite_name(config) -> str:
    """'hw' for `pytest suites/hw`, 'tests' for `pytest tests`, 'all' for several."""
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS:  # plain `pytest`: everything
        return "all"
    root = config.rootpath
    names = set()
    for arg in config.args or ["."]:
        path = Path(arg.split("::")[0]).resolve()
        try:
            parts = path.relative_to(root).parts
        except ValueError:
            parts = ()
        if len(parts) >= 2 and parts[0] == "suites":
            names.add(parts[1])
        elif parts and parts[0] in ("suites", "tests"):
            names.add(parts[0])
        else:
            names.add("all")
    if len(names) == 1:
        return names.pop()
    return "all" if len(names) > 2 or "all" in names else "+".join(sorted(names))


@pytest.hookimpl(tryfirst=True)  # before pytest-html reads --html
def pytest_configure(config):
    started = time.time()
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    options = {name: config.getoption(name) for name in OPTION_NAMES}
    try:
        settings = settings_mod.resolve(options, root=config.rootpath)
    except UsageError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[settings_key] = settings
    config.stash[env_key] = env_mod.probe_environment(settings.vllm_python)
    environment = config.stash[env_key]
    try:  # an explicit --device cuda:N that is not there is bad usage, not a CPU run
        settings_mod.check_device(settings.device, [(d.index, d.name) for d in environment.torch.devices],
                                  [g.index for g in environment.nvml.gpus])
    except UsageError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[html_fragments_key] = []

    suite = _suite_name(config)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    settings.report_dir.mkdir(parents=True, exist_ok=True)
    # The harness writes its own report (harness.report.run_html) next to the JSON; pytest-html
    # still writes one where --html asks for it.
    environment = config.stash[env_key].to_dict()
    results_class = fleet_merge.WorkerResults if _xdist_worker(config) else RunResults  # xdist: controller writes
    config.stash[results_key] = results_class(
        path=settings.report_dir / f"{suite}-{stamp}.json",
        suite=suite,
        environment=environment,
        settings={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(settings).items()},
        machine=report_machine.summary(environment, host=platform.node()),
        html_path=f"{suite}-{stamp}.html",
        started=started,
    )
    config.stash[results_key].write()


def pytest_report_header(config):
    environment = config.stash[env_key]
    readiness = env_mod.gpu_readiness(environment)
    return [f"harness: {env_mod.header_line(environment)}",
            f"harness: GPU {readiness.state}: {readiness.reason}"]


@pytest.hookimpl(optionalhook=True)
def pytest_metadata(metadata, config):
    environment = config.stash.get(env_key, None)
    if environment is not None:
        metadata["Machine"] = env_mod.header_line(environment)


@pytest.hookimpl(optionalhook=True)
def pytest_html_report_title(report):
    report.title = "LLM harness report"


@pytest.hookimpl(optionalhook=True)
def pytest_html_results_summary(prefix, summary, postfix, session):
    """Only with --html (pytest-html's own page): the verdicts and the harness's report link."""
    config = session.config
    results = config.stash[results_key]
    from .report import verdicts

    prefix.append(report_html.TABLE_STYLE + report_html.verdict_strip(verdicts.for_run(results.to_dict())))
    prefix.append(f"<p><b>Machine</b>: {report_html.esc(env_mod.header_line(config.stash[env_key]))}</p>")
    prefix.append(f"<p>The harness's report: {report_html.esc(results.path.with_suffix('.html'))}</p>")


# ---------------------------------------------------------------------------------------------
# Markers: skip when there is no driver, fail when a driver is there but unusable


def _marker_verdict(names: set[str], settings, environment) -> tuple[str, str] | None:
    """('skip' | 'fail', reason) for a test with these markers on this machine, or None to run."""
    if names & {"gpu", "multi_gpu"}:
        readiness = env_mod.gpu_readiness(environment)
        if settings.device == "cpu":
            return "skip", "--device cpu"
        if readiness.state == "absent":
            return ("fail", f"--expect-gpu: {readiness.reason}") if settings.expect_gpu else ("skip", readiness.reason)
        if readiness.state == "broken":
            return "fail", f"GPU present but unusable: {readiness.reason}"
        if "multi_gpu" in names and environment.torch.device_count < 2:
            return "skip", f"needs 2 GPUs, torch sees {environment.torch.device_count}"
    if "bnb" in names:
        problem = models.bitsandbytes_problem()
        if problem:
            return "skip", problem
    if "destructive" in names and settings.endpoint:
        return "skip", "destructive: never run against --endpoint, a server the harness did not start"
    if "vllm" in names and not settings.endpoint and environment.vllm.error:
        if settings.vllm_python_explicit:
            return "fail", f"--vllm-python: {environment.vllm.error}"
        return "skip", environment.vllm.error
    return None


def pytest_collection_modifyitems(config, items):
    """Skips become markers at collection, so reports name the test's own line, not this file."""
    settings, environment = config.stash[settings_key], config.stash[env_key]
    for item in items:
        verdict = _marker_verdict({m.name for m in item.iter_markers()}, settings, environment)
        if verdict and verdict[0] == "skip":
            item.add_marker(pytest.mark.skip(reason=verdict[1]))


def pytest_runtest_setup(item):
    config = item.config
    verdict = _marker_verdict({m.name for m in item.iter_markers()}, config.stash[settings_key], config.stash[env_key])
    if verdict and verdict[0] == "fail":
        pytest.fail(verdict[1], pytrace=False)


# ---------------------------------------------------------------------------------------------
# Results: every test's outcome and record, written after each test


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.harness_record = item.stash.get(record_key, {})
    if call.when == "call":
        report.harness_benchmark = _benchmark_stats(item)


def _benchmark_stats(item) -> dict | None:
    """pytest-benchmark's figures for this test (its `benchmark` fixture), in seconds."""
    fixture = getattr(item, "funcargs", {}).get("benchmark")
    meta = getattr(fixture, "stats", None)
    stats = getattr(meta, "stats", None)
    if stats is None or not getattr(stats, "data", None):
        return None
    return {"name": item.nodeid.split("::", 1)[-1].removeprefix("test_"), "group": getattr(meta, "group", None),
            "median_s": stats.median, "min_s": stats.min, "mean_s": stats.mean, "max_s": stats.max,
            "stddev_s": stats.stddev if stats.rounds > 1 else 0.0, "rounds": stats.rounds,
            "extra": dict(getattr(meta, "extra_info", {}) or {})}


def _outcome(report) -> str:
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if report.when != "call" and report.failed:
        return "error"
    return report.outcome


def _message(report) -> str | None:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    if report.skipped:
        return str(getattr(report.longrepr, "reprcrash", None) and report.longrepr.reprcrash.message
                   or "skipped").removeprefix("Skipped: ")
    if report.failed:
        text = getattr(report, "longreprtext", "") or ""
        lines = [ln for ln in text.splitlines() if ln.startswith("E ")] or text.splitlines()[-1:]
        return lines[0][1:].strip() if lines and lines[0].startswith("E ") else (lines[0] if lines else None)
    return None


def pytest_runtest_logreport(report):
    config = _current_config
    if config is None or results_key not in config.stash:
        return
    # One entry per test: the call phase, or the setup phase when it did not pass (skip/error),
    # or a teardown error.
    if (report.when == "call") or (report.when == "setup" and not report.passed) or \
            (report.when == "teardown" and report.failed):
        config.stash[results_key].add_test(TestResult(
            nodeid=report.nodeid,
            outcome=_outcome(report),
            duration_s=round(report.duration, 4),
            message=_message(report),
            markers=[k for k in report.keywords if k in MARKERS],
            record=dict(getattr(report, "harness_record", {}) or {}),
            detail=(getattr(report, "longreprtext", "") or "")[-20000:] if report.failed else None,
        ))
        if report.when == "call" and getattr(report, "harness_benchmark", None):
            config.stash[results_key].benchmarks.append(report.harness_benchmark)


_current_config = None


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    global _current_config
    _current_config = session.config


def pytest_sessionfinish(session, exitstatus):
    """The JSON, then the HTML report rendered from it, latest.*, links both ways between the
    report and the pages the run produced (serving gate, upgrade rehearsal), and index.html."""
    config = session.config
    if results_key not in config.stash:
        return
    results = config.stash[results_key]
    if hasattr(config, "workerinput"):  # an xdist worker: the controller writes the report
        results.finish(interrupted=exitstatus == pytest.ExitCode.INTERRUPTED)
        return
    from .report import index, pages, run_html

    report_dir = config.stash[settings_key].report_dir
    produced = pages.produced_since(report_dir, results.started, exclude={results.html_path})
    results.links = [{"title": title, "path": rel} for rel, title in produced]
    results.finish(interrupted=exitstatus == pytest.ExitCode.INTERRUPTED)
    data = results.to_dict()
    page = run_html.render(data)
    atomic.write_text(report_dir / results.html_path, page)
    atomic.write_text(report_dir / "latest.html", page)
    atomic.write_text(report_dir / "latest.json", results.path.read_text(encoding="utf-8"))
    for rel, _title in produced:
        pages.add_backlink(report_dir / rel, report_dir / results.html_path, f"{results.suite} run report")
    index.write(report_dir)


def pytest_terminal_summary(terminalreporter, config):
    if results_key in config.stash and not hasattr(config, "workerinput"):
        results = config.stash[results_key]
        terminalreporter.write_line(f"harness: report: {results.path.with_suffix('.html')} "
                                    f"(all runs: {results.path.parent / 'index.html'})")
        terminalreporter.write_line(f"harness: results JSON: {results.path}")


def pytest_unconfigure(config):
    global _current_config
    _current_config = None


# ---------------------------------------------------------------------------------------------
# Fixtures


class Recorder:
    """What a test measured: `record(key=value)` per test, `record.row(table, {...})` for a
    session table in the HTML report, `record.html(title, fragment)` for a plot or block."""

    def __init__(self, item):
        self._item = item
        self._data = item.stash.setdefault(record_key, {})

    def __call__(self, **values: Any) -> None:
        self._data.update(values)
        for key, value in values.items():
            self._item.user_properties.append((key, value))

    def row(self, table: str, row: dict[str, Any]) -> None:
        self._item.config.stash[results_key].add_row(table, dict(row))

    def html(self, title: str, fragment: str) -> None:
        self._item.config.stash[html_fragments_key].append((title, fragment))
        self._item.config.stash[results_key].fragments.append({"title": title, "html": fragment})

    def figure(self, kind: str, title: str, data: dict[str, Any]) -> None:
        """A figure kept as data (harness.report.figures: estimate_error, fit_map, lines), drawn
        when the report is rendered."""
        self._item.config.stash[results_key].add_figure(kind, title, data)

    @property
    def data(self) -> dict[str, Any]:
        return dict(self._data)


@pytest.fixture
def record(request) -> Recorder:
    return Recorder(request.node)


@pytest.fixture(scope="session")
def settings(pytestconfig) -> settings_mod.Settings:
    return pytestconfig.stash[settings_key]


@pytest.fixture(scope="session")
def harness_env(pytestconfig) -> env_mod.Environment:
    return pytestconfig.stash[env_key]


@pytest.fixture(scope="session")
def report_dir(settings) -> Path:
    return settings.report_dir


@pytest.fixture(scope="session")
def show_progress(pytestconfig):
    """A context manager that lets a slow step's progress lines reach the terminal."""
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")

    @contextlib.contextmanager
    def visible():
        if capture is None:
            yield
        else:
            with capture.global_and_fixture_disabled():
                yield

    return visible


@pytest.fixture(scope="session")
def device(settings, harness_env) -> str:
    """'cuda:N' when a usable GPU is there (or asked for), else 'cpu'."""
    readiness = env_mod.gpu_readiness(harness_env)
    if settings.device == "cpu":
        return "cpu"
    if settings.device.startswith("cuda") or settings.expect_gpu:
        if readiness.state != "ready":
            pytest.fail(f"{settings.device}: {readiness.reason}", pytrace=False)
        return "cuda:0" if settings.device in ("cuda", "auto") else settings.device
    return "cuda:0" if readiness.state == "ready" else "cpu"


def _build(show_progress, settings, family):
    with show_progress():
        return models.tiny_model_dir(family, settings.cache_dir / "models")


@pytest.fixture(scope="session")
def tiny_model_dir(settings, show_progress) -> Path:
    return _build(show_progress, settings, "qwen2")


@pytest.fixture(scope="session")
def tiny_llama_dir(settings, show_progress) -> Path:
    return _build(show_progress, settings, "llama")


@pytest.fixture(scope="session")
def model_dir(settings, show_progress, tmp_path_factory) -> Path:
    """--model as a directory; a reference name is materialised with random weights (bf16)."""
    with show_progress():
        resolved = models.resolve_model(settings.model, settings.cache_dir / "models")
        if isinstance(resolved, str):  # a reference architecture
            out = tmp_path_factory.mktemp(f"random-{resolved}")
            print(f"[harness] writing random {resolved} weights to {out} ...", flush=True)
            return models.save_random_model(resolved, out, dtype="bf16")
        return resolved


@pytest.fixture
def vram_budget(settings, device):
    """With --vram-budget on a CUDA device: torch's allocator is capped at budget - CUDA context
    for the test (a real N-GiB card loses the context before torch gets anything), lifted after.
    Yields the BudgetState, or None when no budget was asked for or the device is the CPU."""
    from .memory.budget import apply_budget, release_budget

    if not settings.vram_budget or not str(device).startswith("cuda"):
        yield None
        return
    state = apply_budget(settings.vram_budget, device)
    try:
        yield state
    finally:
        release_budget(state)


# ---------------------------------------------------------------------------------------------
# pytest-xdist: one GPU per worker, one report. The controller gives each worker a GPU of its own
# (CUDA_VISIBLE_DEVICES, set in the worker before anything initialises CUDA); workers never write
# reports/, they send their tests' records, table rows and HTML blocks to the controller, which
# alone writes the JSON and HTML. Hooks that the report hooks above also implement are named
# pytest_<hook>_xdist (specname), so this section stays separate. Logic lives in harness/fleet.

WORKER_GPU_KEY = "harness_cuda_visible_devices"  # in xdist's workerinput
ledger_key = pytest.StashKey[fleet_merge.WorkerLedger]()
outbox_key = pytest.StashKey[fleet_merge.Outbox]()


def _xdist_worker(config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto` where the driver shows GPUs: one worker per visible GPU (else xdist's CPU count)."""
    nvml = env_mod.probe_nvml()
    if not nvml.gpus:
        return None
    return len(visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), len(nvml.gpus))) or None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """Controller, before a worker starts: the GPU fewest live workers hold."""
    config = node.config
    if ledger_key not in config.stash:
        environment = config.stash[env_key]
        gpus = visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), len(environment.nvml.gpus))
        names = fleet_merge.gpu_names(gpus, [vars(g) for g in environment.nvml.gpus])
        config.stash[ledger_key] = fleet_merge.WorkerLedger(gpus, names)
    node.workerinput[WORKER_GPU_KEY] = config.stash[ledger_key].assign(node.gateway.id)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """Worker: take the controller's GPU before the environment probe initialises CUDA."""
    gpu = getattr(config, "workerinput", {}).get(WORKER_GPU_KEY)
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu


@pytest.hookimpl(tryfirst=True, specname="pytest_runtest_logreport")
def pytest_runtest_logreport_xdist(report):
    """Worker: tag the report with worker and GPU and attach what its tests added since the last
    one (before xdist serialises it). Controller: take those in; record a crashed worker's test."""
    config = _current_config
    if config is None or results_key not in config.stash:
        return
    if _xdist_worker(config):
        record = dict(getattr(report, "harness_record", {}) or {})
        record[fleet_merge.RECORD_WORKER] = config.workerinput.get("workerid")
        record[fleet_merge.RECORD_GPU] = os.environ.get("CUDA_VISIBLE_DEVICES")
        report.harness_record = fleet_merge.plain(record)
        report.user_properties = fleet_merge.plain(list(report.user_properties))
        outbox = config.stash.setdefault(outbox_key, fleet_merge.Outbox())
        results = config.stash[results_key]
        report.harness_rows, report.harness_html, report.harness_figures = outbox.drain(
            results.tables, config.stash[html_fragments_key], results.figures)
        return
    _take_in(config, getattr(report, "harness_rows", None), getattr(report, "harness_html", None),
             getattr(report, "harness_figures", None))
    if report.when not in ("setup", "call", "teardown") and report.failed:  # xdist's report of a crashed worker
        worker = getattr(getattr(report, "node", None), "gateway", None)
        worker_id = getattr(worker, "id", None)
        ledger = config.stash.get(ledger_key, None)
        state = ledger.workers.get(worker_id) if ledger else None
        config.stash[results_key].add_test(TestResult(
            nodeid=report.nodeid, outcome="error", duration_s=0.0,
            message=str(report.longrepr).strip().splitlines()[0] if report.longrepr else "worker crashed",
            record={fleet_merge.RECORD_WORKER: worker_id, fleet_merge.RECORD_GPU: state.gpu if state else None}))


def _take_in(config, rows, fragments, figures) -> None:
    results = config.stash[results_key]
    for table, row in rows or ():
        results.add_row(table, row)
    for figure in figures or ():
        results.add_figure(figure["kind"], figure["title"], figure["data"])
    for title, fragment in fragments or ():
        config.stash[html_fragments_key].append((title, fragment))


@pytest.hookimpl(specname="pytest_sessionfinish")
def pytest_sessionfinish_xdist(session, exitstatus):
    """Worker: rows and blocks added after its last test go with its final output."""
    config = session.config
    if _xdist_worker(config) and results_key in config.stash:
        outbox = config.stash.setdefault(outbox_key, fleet_merge.Outbox())
        results = config.stash[results_key]
        rows, fragments, figures = outbox.drain(results.tables, config.stash[html_fragments_key], results.figures)
        config.workeroutput.update(harness_rows=rows, harness_html=fragments, harness_figures=figures)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """Controller: a worker finished or crashed; its leftovers and the Workers table go in."""
    config = node.config
    if results_key not in config.stash or ledger_key not in config.stash:
        return
    output = getattr(node, "workeroutput", None) or {}
    _take_in(config, output.get("harness_rows"), output.get("harness_html"), output.get("harness_figures"))
    ledger = config.stash[ledger_key]
    ledger.down(node.gateway.id, error)
    results = config.stash[results_key]
    results.tables[fleet_merge.WORKERS_TABLE] = ledger.rows(results.tests)
    results.write()


@pytest.hookimpl(specname="pytest_terminal_summary")
def pytest_terminal_summary_xdist(terminalreporter, config):
    if _xdist_worker(config) or ledger_key not in config.stash:
        return
    ledger = config.stash[ledger_key]
    terminalreporter.write_line(f"harness: xdist workers: {ledger.summary_line()}")
    tests = config.stash[results_key].tests if results_key in config.stash else []
    if config.getoption("dist", None) == "load" and len({s.gpu for s in ledger.workers.values()}) > 1 \
            and any(t.nodeid.startswith("suites/hw/") for t in tests):
        terminalreporter.write_line("harness: --dist load spread suites/hw over the workers: each check ran on one "
                                    "worker's GPU; --dist each runs every check on every GPU")
