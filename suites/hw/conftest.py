"""Fixtures of the hardware suite: one CheckResult per test, turned into a verdict, a record and a
row of the report's Readiness table; and the machine's verdict as the run's last line
(harness.hw.verdict: READY, CPU-only, NOT READY, NO VERDICT), with the exit code that agrees.

When no GPU can be used and a check says why (the driver check, or torch's CUDA build), the checks
that need the GPU are not run: the cause is named once, by that check, not once per GPU check."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from harness import env as env_mod
from harness.hw import CheckResult
from harness.hw import verdict as machine

READINESS = "Readiness"
HERE = Path(__file__).resolve().parent


def _in_suite(item_or_report) -> bool:
    path = getattr(item_or_report, "path", None)
    if path is None:  # a report: its nodeid is relative to the rootdir
        return item_or_report.nodeid.replace("\\", "/").split("::")[0].startswith("suites/hw/")
    return HERE in Path(path).resolve().parents


def _run(config):
    from harness.plugin_run import run_state

    return run_state(config)


def _root_cause_named(run) -> bool:
    """No usable GPU, and a check of this suite will fail saying why: a driverless card on the PCI
    bus or driver files NVML cannot use (driver), a driver torch cannot use (torch_cuda_build), or
    a GPU asked for (--expect-gpu, --device cuda) on a box without one (driver)."""
    from harness.plugin_run import gpu_asked

    readiness = env_mod.gpu_readiness(run.environment)
    return readiness.state == "broken" or (readiness.state == "absent" and gpu_asked(run.settings) is not None)


def _not_run(run) -> str:
    """The skip reason of a check that needs the GPU, naming the check that fails with the cause."""
    cause = "driver" if not run.environment.nvml.available else "torch_cuda_build"
    return f"not run: no usable GPU (the {cause} check fails with the cause)"


def pytest_collection_modifyitems(config, items):
    run = _run(config)
    if run is None or not _root_cause_named(run) or run.settings.device == "cpu":
        return
    for item in items:
        if _in_suite(item) and {m.name for m in item.iter_markers()} & {"gpu", "multi_gpu"}:
            item.add_marker(pytest.mark.skip(reason=_not_run(run)))


class MachineVerdictPlugin:
    """Collects each hw check's outcome; at the end sets the exit code and prints the verdict last."""

    def __init__(self, config):
        self.config = config
        self.outcomes: list[machine.CheckOutcome] = []
        self.verdict: machine.MachineVerdict | None = None

    def active(self) -> bool:
        """The controller of a `pytest suites/hw` run (not an xdist worker, not a mixed or collect-only run)."""
        from harness.plugin_run import runs_no_test, suite_name

        config = self.config
        return (not hasattr(config, "workerinput") and runs_no_test(config) is None
                and _run(config) is not None and suite_name(config) == "hw")

    def pytest_runtest_logreport(self, report):
        if not _in_suite(report) or not (report.when == "call" or (report.when == "setup" and not report.passed)
                                          or (report.when == "teardown" and report.failed)):
            return
        from harness.plugin_run import message_of, outcome_of

        check = report.nodeid.split("::")[-1].removeprefix("test_")
        record = dict(tuple(p) for p in report.user_properties)
        warned = record.get("verdict") == "warn"
        message = message_of(report) or ""
        if record.get("verdict") == "fail" and record.get("value"):  # the cause and its fix, without the expectation
            message = f"{check}: {record['value']}" + (f". Fix: {record['fix']}" if record.get("fix") else "")
        if report.when == "teardown" and self.outcomes and self.outcomes[-1].check == check:
            self.outcomes.pop()  # a teardown error replaces the call's outcome
        self.outcomes.append(machine.CheckOutcome(check, outcome_of(report), message, warned))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        if not self.active():
            return
        run = _run(self.config)
        readiness = env_mod.gpu_readiness(run.environment)
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        deselected = len(reporter.stats.get("deselected", [])) if reporter else 0
        self.verdict = machine.decide(self.outcomes, readiness.state, readiness.reason,
                                      run.environment.pci_gpus is not None,
                                      interrupted=exitstatus == pytest.ExitCode.INTERRUPTED, deselected=deselected)
        if self.verdict.exit_code and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = self.verdict.exit_code

    def pytest_unconfigure(self, config):
        """After pytest's own summary line: the verdict is the run's last line."""
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if self.verdict is None or reporter is None:
            return
        good = self.verdict.exit_code == 0
        reporter.write_line(self.verdict.line, green=good, red=not good, bold=True)


def pytest_configure(config):
    if not config.pluginmanager.has_plugin("harness-hw-verdict"):
        config.pluginmanager.register(MachineVerdictPlugin(config), "harness-hw-verdict")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A check skipped before it ran (no GPU, not the full level) still gets its Readiness row,
    with the probe's reason as the value."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "setup" and report.skipped and isinstance(report.longrepr, tuple):
        from harness.plugin_run import run_state

        run = run_state(item.config)
        if run is not None:
            reason = str(report.longrepr[2]).removeprefix("Skipped: ")
            run.results.add_row(READINESS, {"check": item.name.removeprefix("test_"), "value": reason,
                                        "expectation": "", "verdict": "skip", "fix": ""})


@pytest.fixture
def verdict(record):
    """`verdict(result)`: record it, add it to the Readiness table, then pass, warn, skip or fail."""

    def apply(result: CheckResult) -> CheckResult:
        record(check=result.check, verdict=result.verdict, value=result.value,
               expectation=result.expectation, fix=result.fix, details=result.details)
        record.row(READINESS, {"check": result.check, "value": result.value, "expectation": result.expectation,
                               "verdict": result.verdict, "fix": result.fix})
        if result.verdict == "fail":  # the failure's message is the line (printed too, it would show twice)
            pytest.fail(result.line(), pytrace=False)
        print(result.line())
        if result.verdict == "skip":
            pytest.skip(f"{result.check}: {result.value}")
        if result.verdict == "warn":
            warnings.warn(HardwareWarning(result.line()), stacklevel=2)
        return result

    return apply


@pytest.fixture(scope="session")
def driver(harness_run, harness_env):
    """The NVML probe. Without a driver: a skip, with the probe's reason on a CPU-only box, or
    pointing at the driver check where that check fails with the cause (a GPU on the PCI bus, or
    --expect-gpu)."""
    if not harness_env.driver_present:
        if _root_cause_named(harness_run):
            pytest.skip(_not_run(harness_run))
        pytest.skip(env_mod.gpu_readiness(harness_env).reason)
    return harness_env.nvml


@pytest.fixture(scope="session")
def cuda_devices(harness_env) -> list[str]:
    """Every GPU torch can use (tests asking for it are marked gpu, so there is at least one)."""
    return [f"cuda:{d.index}" for d in harness_env.torch.devices]


@pytest.fixture(scope="session")
def gpu_health(driver):
    from harness.hw.health import read_health

    health = read_health()
    if not health:
        pytest.skip("NVML returned no GPU to read health from")
    return health


@pytest.fixture(scope="session")
def bnb_probe(harness_env, cuda_devices):
    """bitsandbytes run for real on every GPU, in a subprocess (a native crash stays there)."""
    from harness.hw.bnb_probe import run_probe

    if harness_env.packages.get("bitsandbytes") is None:
        pytest.skip("bitsandbytes is not installed (pip install -e '.[gpu]'): QLoRA and 8-bit loading unavailable")
    return run_probe(cuda_devices)


@pytest.fixture(scope="session")
def full_level(settings):
    if settings.hw_level != "full":
        pytest.skip("full level only (--hw-level full)")
    return True
