"""Fixtures of the hardware suite: one CheckResult per test, turned into a verdict, a record and a
row of the report's Readiness table."""

from __future__ import annotations

import warnings

import pytest

from harness.hw import CheckResult

READINESS = "Readiness"


class HardwareWarning(UserWarning):
    """A check that passed with a caveat the owner should read (shown in pytest's warnings summary)."""


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
        print(result.line())
        if result.verdict == "fail":
            pytest.fail(result.line(), pytrace=False)
        if result.verdict == "skip":
            pytest.skip(f"{result.check}: {result.value}")
        if result.verdict == "warn":
            warnings.warn(HardwareWarning(result.line()), stacklevel=2)
        return result

    return apply


@pytest.fixture(scope="session")
def driver(harness_env):
    """The NVML probe; skips with the probe's reason when no NVIDIA driver is installed."""
    if not harness_env.driver_present:
        pytest.skip(harness_env.nvml.reason or "no NVIDIA driver found")
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
