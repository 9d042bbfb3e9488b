"""The state of one pytest run and the hooks that report it (pytest-aware, registered by the plugin).

`HarnessRun` holds the resolved settings, the probed environment and the results being written;
harness/plugin.py builds it in pytest_configure and registers it with the plugin manager, as
pytest-html and pytest-xdist register theirs, so its hooks see the run through `self` and no module
global. Suites and fixtures reach it with :func:`run_state`. It turns the GPU markers into skips
(no driver) or failures (a driver torch cannot use), and makes every run leave a self-contained
HTML report and a JSON results file under reports/.
"""

from __future__ import annotations

import platform
import time
from pathlib import Path

import pytest

from . import atomic
from . import env as env_mod
from . import models
from .fleet import merge as fleet_merge
from .report import html as report_html
from .report import machine as report_machine
from .report.results import RunResults, TestResult
from .settings import Settings

MARKERS = {
    "gpu": "needs a usable NVIDIA GPU (skips without a driver, fails when the driver is there but torch cannot use it)",
    "multi_gpu": "needs two or more GPUs",
    "bnb": "needs bitsandbytes with a working native library",
    "vllm": "needs a vLLM interpreter (--vllm-python) or a running server (--endpoint)",
    "slow": "takes more than a few seconds",
    "destructive": "crashes, kills, overloads past failure or restarts a server: only on servers the harness started",
    "alone": "measures time or CPU contention: the repository's scripts/test runs these after the rest, with nothing beside them",
}
RUN_PLUGIN = "harness-run"  # the name HarnessRun is registered under
RECORD = pytest.StashKey[dict]()  # a test item's record (the `record` fixture writes it)


def run_state(config) -> "HarnessRun | None":
    """This run's HarnessRun (None before pytest_configure, or when the plugin is not active)."""
    return config.pluginmanager.get_plugin(RUN_PLUGIN)


def suite_name(config) -> str:
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


def gpu_asked(settings: Settings) -> str | None:
    """The option by which the user asked for a GPU (--expect-gpu, --device cuda[:N]), or None:
    then a missing GPU is a failure, never a skip."""
    if settings.expect_gpu:
        return "--expect-gpu"
    return f"--device {settings.device}" if settings.device.startswith("cuda") else None


def marker_verdict(names: set[str], settings: Settings, environment) -> tuple[str, str] | None:
    """('skip' | 'fail', reason) for a test with these markers on this machine, or None to run."""
    if names & {"gpu", "multi_gpu"}:
        readiness = env_mod.gpu_readiness(environment)
        if settings.device == "cpu":
            return "skip", "--device cpu"
        if readiness.state == "absent":
            asked = gpu_asked(settings)
            return ("fail", f"{asked}: {readiness.reason}") if asked else ("skip", readiness.reason)
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


def benchmark_stats(item) -> dict | None:
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


def outcome_of(report) -> str:
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if report.when != "call" and report.failed:
        return "error"
    return report.outcome


def message_of(report) -> str | None:
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


def record_of(report) -> dict:
    """What the test recorded; for a failed or errored test also harness.explain's diagnosis of
    its error text (kind, what happened, fix), when it recognises one."""
    record = dict(getattr(report, "harness_record", {}) or {})
    if report.failed:
        from .explain import explain_short

        note = explain_short((getattr(report, "longreprtext", "") or "")[-200000:])
        if note:
            record["explanation"] = note
    return record


# Options under which pytest runs no test: such a run writes no report, no latest.* and no index
# entry (an empty page would replace the last real run's).
NO_RUN_OPTIONS = {"collectonly": "--collect-only", "setupplan": "--setup-plan", "help": "--help", "version": "--version",
                  "showfixtures": "--fixtures", "show_fixtures_per_test": "--fixtures-per-test", "markers": "--markers"}


def runs_no_test(config) -> str | None:
    """Why this pytest runs no test ('--collect-only: no test ran'), or None."""
    flag = next((flag for name, flag in NO_RUN_OPTIONS.items() if getattr(config.option, name, False)), None)
    return f"{flag}: no test ran" if flag else None


def _free_stamp(report_dir: Path, suite: str) -> str:
    """The run's time stamp, a second later while a report of that name exists: two runs started
    in one second (scripts/test's second run after a one-second first) must not share a file."""
    now = time.time()
    for _ in range(120):
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
        if not any((report_dir / f"{suite}-{stamp}{ext}").exists() for ext in (".json", ".html")):
            return stamp
        now += 1
    return stamp


class HarnessRun:
    """One run: settings, environment, results (written after each test) and the report hooks."""

    def __init__(self, config, settings: Settings, environment, started: float) -> None:
        self.config = config
        self.settings = settings
        self.environment = environment
        self.html_fragments: list[tuple[str, str]] = []
        self.no_report = runs_no_test(config)  # why this run writes nothing (it runs no test), or None
        suite, stamp = suite_name(config), _free_stamp(settings.report_dir, suite_name(config))
        if not self.no_report:
            settings.report_dir.mkdir(parents=True, exist_ok=True)
        # The harness writes its own report (harness.report.run_html) next to the JSON; pytest-html
        # still writes one where --html asks for it. An xdist worker's results go to the controller.
        env_dict = environment.to_dict()
        results_class = fleet_merge.WorkerResults if hasattr(config, "workerinput") else RunResults
        self.results = results_class(
            path=settings.report_dir / f"{suite}-{stamp}.json",
            suite=suite,
            environment=env_dict,
            settings={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(settings).items()},
            machine=report_machine.summary(env_dict, host=platform.node()),
            html_path=f"{suite}-{stamp}.html",
            started=started,
        )
        if settings.endpoint and not self.no_report:  # the machine line describes the server tested
            from .report.server import line_with_server
            from .serving.endpoint import server_identity

            server = self.results.machine["server"] = server_identity(settings.endpoint)
            self.results.machine["line"] = line_with_server(self.results.machine.get("line") or "", server)
        if not self.no_report:
            self.results.write()

    def pytest_report_header(self, config):
        readiness = env_mod.gpu_readiness(self.environment)
        lines = [f"harness: {env_mod.header_line(self.environment)}",
                 f"harness: GPU {readiness.state}: {readiness.reason}"]
        server = self.results.machine.get("server")
        if server:  # --endpoint: the server under test is not the local vLLM of the line above
            from .report.server import describe

            lines.append(f"harness: server tested: {describe(server)}")
        return lines

    @pytest.hookimpl(optionalhook=True)
    def pytest_metadata(self, metadata, config):
        metadata["Machine"] = env_mod.header_line(self.environment)

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_report_title(self, report):
        report.title = "LLM harness report"

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_summary(self, prefix, summary, postfix, session):
        """Only with --html (pytest-html's own page): the verdicts and the harness's report link."""
        from .report import verdicts

        prefix.append(report_html.TABLE_STYLE + report_html.verdict_strip(verdicts.for_run(self.results.to_dict())))
        prefix.append(f"<p><b>Machine</b>: {report_html.esc(env_mod.header_line(self.environment))}</p>")
        prefix.append(f"<p>The harness's report: {report_html.esc(self.results.path.with_suffix('.html'))}</p>")

    # Markers: skip when there is no driver, fail when a driver is there but unusable

    def pytest_collection_modifyitems(self, config, items):
        """Skips become markers at collection, so reports name the test's own line, not the plugin."""
        for item in items:
            verdict = marker_verdict({m.name for m in item.iter_markers()}, self.settings, self.environment)
            if verdict and verdict[0] == "skip":
                item.add_marker(pytest.mark.skip(reason=verdict[1]))

    def pytest_runtest_setup(self, item):
        verdict = marker_verdict({m.name for m in item.iter_markers()}, self.settings, self.environment)
        if verdict and verdict[0] == "fail":
            pytest.fail(verdict[1], pytrace=False)

    # Results: every test's outcome and record, written after each test

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        report.harness_record = item.stash.get(RECORD, {})
        if call.when == "call":
            report.harness_benchmark = benchmark_stats(item)

    def pytest_runtest_logreport(self, report):
        if self.no_report:  # --setup-plan reports tests it did not run
            return
        # One entry per test: the call phase, or the setup phase when it did not pass (skip/error),
        # or a teardown error.
        if (report.when == "call") or (report.when == "setup" and not report.passed) or \
                (report.when == "teardown" and report.failed):
            self.results.add_test(TestResult(
                nodeid=report.nodeid,
                outcome=outcome_of(report),
                duration_s=round(report.duration, 4),
                message=message_of(report),
                markers=[k for k in report.keywords if k in MARKERS],
                record=record_of(report),
                detail=(getattr(report, "longreprtext", "") or "")[-20000:] if report.failed else None,
            ))
            if report.when == "call" and getattr(report, "harness_benchmark", None):
                self.results.benchmarks.append(report.harness_benchmark)

    def pytest_sessionfinish(self, session, exitstatus):
        """The JSON, then the HTML report rendered from it, latest.*, links both ways between the
        report and the pages the run produced (serving gate, upgrade rehearsal), and index.html."""
        results = self.results
        if self.no_report:
            return
        if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and not results.tests:
            # nothing selected (scripts/test's `-m alone` run beside a -k): its empty page would
            # replace the last real run's latest.html; the results JSON written at the start goes too
            self.no_report = "no test selected"
            results.path.unlink(missing_ok=True)
            return
        if hasattr(self.config, "workerinput"):  # an xdist worker: the controller writes the report
            results.finish(interrupted=exitstatus == pytest.ExitCode.INTERRUPTED)
            return
        from .report import index, pages, run_html

        report_dir = self.settings.report_dir
        produced = pages.produced_since(report_dir, results.started, exclude={results.html_path})
        results.links = [{"title": title, "path": rel} for rel, title in produced]
        results.finish(interrupted=exitstatus == pytest.ExitCode.INTERRUPTED)
        page = run_html.render(results.to_dict())
        atomic.write_text(report_dir / results.html_path, page)
        atomic.write_text(report_dir / "latest.html", page)
        atomic.write_text(report_dir / "latest.json", results.path.read_text(encoding="utf-8"))
        for rel, _title in produced:
            pages.add_backlink(report_dir / rel, report_dir / results.html_path, f"{results.suite} run report")
        index.write(report_dir)

    def pytest_terminal_summary(self, terminalreporter, config):
        if self.no_report:
            terminalreporter.write_line(f"harness: no report written ({self.no_report})")
        elif not hasattr(config, "workerinput"):
            path = self.results.path
            terminalreporter.write_line(f"harness: report: {path.with_suffix('.html')} "
                                        f"(all runs: {path.parent / 'index.html'})")
            terminalreporter.write_line(f"harness: results JSON: {path}")
