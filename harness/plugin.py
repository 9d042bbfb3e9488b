"""The harness's pytest plugin: options, markers, and the run it registers.

The plugin modules are the only pytest-aware ones; everything they do is a call into the library:
- here: the options, built from the one option table (harness.settings: flag, environment
  variable, default, parser, help), and pytest_configure, which resolves them into Settings,
  probes the environment and registers the run's plugins;
- harness/plugin_run.py: `HarnessRun`, the run state and its report hooks (markers to skips or
  failures, results JSON written after each test, the HTML report at the end);
- harness/plugin_xdist.py: one GPU per pytest-xdist worker, one report;
- harness/plugin_fixtures.py: the fixtures suites ask for (settings, harness_env, device, models,
  record, ...).
Suites and hooks of conftest files reach the run with `harness.plugin_run.run_state(config)` (or
the `harness_run` fixture), never through stash keys.
"""

from __future__ import annotations

import signal
import time

import pytest

from . import env as env_mod
from . import models, plugin_fixtures
from . import settings as settings_mod
from .errors import UsageError
from .plugin_run import MARKERS, RUN_PLUGIN, HarnessRun, run_state  # noqa: F401 (run_state: for conftests)
from .plugin_xdist import XdistRelay, pytest_cmdline_main, pytest_xdist_auto_num_workers  # noqa: F401 (hooks)
from .serving.process_group import sigterm_as_interrupt

XDIST_PLUGIN = "harness-xdist"
FIXTURES_PLUGIN = "harness-fixtures"


def pytest_addoption(parser):
    group = parser.getgroup("harness", "LLM harness")
    for name, opt in settings_mod.options():
        if opt.switch:
            group.addoption(opt.flag, dest=name, action="store_true", default=False, help=opt.help_text())
        else:
            group.addoption(opt.flag, dest=name, default=None, help=opt.help_text())


def _fail_unless_asked_model_is_there(config, settings) -> None:
    """A model the user asked for with --model that cannot be had (smollm2-135m without its wheel)
    ends the run at once as a failure (exit 1) with the reason and the install line: the suites
    would otherwise skip every test that needs it and pass the rest. Only a model the suites pick
    themselves (the `smollm2` fixture without --model) is a skip."""
    if settings.endpoint or config.option.collectonly or getattr(config.option, "help", False):
        return
    problem = models.asked_model_problem(settings.model)
    if problem:
        pytest.exit(f"--model {settings.model} cannot be had: {problem}", returncode=pytest.ExitCode.TESTS_FAILED)


def _stop_in_order_on_sigterm(config) -> None:
    """`timeout` and CI runners stop a run with SIGTERM, which by default ends Python at once: no
    teardown, no atexit, servers left to their death signal. As KeyboardInterrupt it unwinds the
    tests and fixtures that started them (a second SIGTERM still kills at once)."""
    previous = sigterm_as_interrupt()
    if previous is not None:
        config.add_cleanup(lambda: signal.signal(signal.SIGTERM, previous))


@pytest.hookimpl(tryfirst=True)  # before pytest-html reads --html
def pytest_configure(config):
    started = time.time()
    _stop_in_order_on_sigterm(config)
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    try:
        settings = settings_mod.resolve({name: config.getoption(name) for name, _ in settings_mod.options()},
                                        root=config.rootpath)
    except UsageError as exc:
        raise pytest.UsageError(str(exc)) from None
    _fail_unless_asked_model_is_there(config, settings)
    environment = env_mod.probe_environment(settings.vllm_python)
    try:  # an explicit --device cuda:N that is not there is bad usage, not a CPU run
        settings_mod.check_device(settings.device, [(d.index, d.name) for d in environment.torch.devices],
                                  [g.index for g in environment.nvml.gpus])
    except UsageError as exc:
        raise pytest.UsageError(str(exc)) from None
    run = HarnessRun(config, settings, environment, started)
    config.pluginmanager.register(run, RUN_PLUGIN)
    config.pluginmanager.register(XdistRelay(run), XDIST_PLUGIN)
    if not config.pluginmanager.is_registered(plugin_fixtures):
        config.pluginmanager.register(plugin_fixtures, FIXTURES_PLUGIN)
