"""This repository's test run: the harness plugin, and how `pytest -n N --dist loadscope` (scripts/test)
shares the tests out over pytest-xdist workers.

Each unit of work goes to one worker whole: a suite (suites/X: its session fixtures, its model
builds and vLLM servers are made once) or a file of tests/. The tests that measure time or CPU
contention carry the `alone` marker (harness.plugin registers it); scripts/test leaves them out of
the parallel run (`-m "not alone"`) and runs them afterwards in a second, serial pytest, so nothing
else runs beside them and what they measure is what a serial run measures. The harness's own `alone`
tests also need a quiet machine: the runnable tasks of others are counted before and after each
(harness.serving.hostload), and one that fails while others took every core is a skip that says so
(undecided), not a failure.
"""

from __future__ import annotations

import statistics
import time

import pytest

pytest_plugins = ["harness.plugin"]


def work_unit(nodeid: str) -> str:
    """The unit a test is scheduled with: its suite (suites/X) or its file."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    return "/".join(parts[:2]) if parts[0] == "suites" and len(parts) > 2 else path


# The units that take longest, in seconds: the fresh-clone scripts/test at 5bb48b0 on the 2-core box (2
# workers, 2026-12-05), the tests' call time plus the set-up its logs show (suites/quant: the LoRA chain,
# llm-compressor and logits processes, ~75 s; a fixture's vLLM start, ~20 s: suites/serving's real-model
# file, test_serving_vocab). They are collected first, longest first, and xdist hands units out in
# collection order, so that no worker starts a long unit while the others have finished. A unit missing
# here only loses its place in the queue.
LONGEST = {
    "suites/quant": 115, "tests/test_vllm_plan_cpu.py": 78, "tests/test_replay_limits.py": 72, "suites/modeldir": 60,
    "suites/serving": 40, "tests/test_step_trace.py": 38, "tests/test_gguf_dir.py": 32, "tests/test_serving_vocab.py": 30,
    "tests/test_hw_readiness.py": 29, "tests/test_fleet_ray.py": 29, "tests/test_report_paths.py": 27,
    "tests/test_serving_gate_cmd.py": 26, "tests/test_estimate_uncertainty.py": 26, "tests/test_drift.py": 25,
    "tests/test_docs.py": 24, "tests/test_explain_launcher.py": 22, "tests/test_report_browser.py": 22,
    "tests/test_serving_cli.py": 21, "tests/test_foundation_plugin.py": 18, "suites/nan": 15,
    "tests/test_vllm_plan_layouts.py": 14, "tests/test_estimate_cache_layout.py": 13, "tests/test_estimate_cli.py": 12,
    "tests/test_pickle_differentials.py": 12, "tests/test_fleet_node_run.py": 11,
}


def queue_order(units) -> list[str]:
    """The order units are handed out: the LONGEST, longest first, then the other suites, then the
    rest in the order given."""
    order = {unit: i for i, unit in enumerate(units)}
    return sorted(units, key=lambda u: (not u.startswith("suites/") and u not in LONGEST, -LONGEST.get(u, 0), order[u]))


UNITS_FIRST = "harness_longest_units_first"  # in xdist's workerinput: the controller runs loadscope


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist sets a worker's own --dist to "no" before it collects: the controller tells it instead."""
    node.workerinput[UNITS_FIRST] = node.config.getvalue("dist") == "loadscope"


def pytest_collection_modifyitems(config, items):
    """Under xdist's loadscope, the items in queue_order of their units (every worker collects the
    same order; the scheduler queues units as it first meets them). It is the workers' collection
    that the scheduler reads."""
    worker = getattr(config, "workerinput", None)
    if not (worker.get(UNITS_FIRST) if worker is not None else config.getvalue("dist") == "loadscope"):
        return
    units = list(dict.fromkeys(work_unit(item.nodeid) for item in items))
    rank = {unit: i for i, unit in enumerate(queue_order(units))}
    items.sort(key=lambda item: rank[work_unit(item.nodeid)])  # stable: a unit's own order is kept


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None  # xdist's own schedulers (load, each, ...) as asked
    from xdist.scheduler import LoadScopeScheduling

    class BySuiteOrFile(LoadScopeScheduling):
        """loadscope with a suite folder as one scope. _split_scope is the one scheduler method this
        overrides (xdist's own docstring describes it as the grouping to change); the order and the
        `alone` tests need nothing of the scheduler."""

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return BySuiteOrFile(config, log)


def others_runnable(samples: int = 5, interval_s: float = 0.02) -> float | None:
    """The median count of runnable tasks besides the one reading (/proc/loadavg; None off Linux)."""
    from harness.serving import hostload

    counts = []
    for _ in range(samples):
        count = hostload.runnable()
        if count is None:
            return None
        counts.append(count - 1)
        time.sleep(interval_s)
    return statistics.median(counts)


BUSY_BEFORE = pytest.StashKey[float]()


def _needs_quiet(item) -> bool:
    """The harness's own `alone` tests (tests/): the suites' serving checks judge contention themselves
    (the gate's UNDECIDED) and are what users run."""
    return item.get_closest_marker("alone") is not None and item.nodeid.startswith("tests/")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    if _needs_quiet(item):
        item.stash[BUSY_BEFORE] = others_runnable() or 0.0
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A quiet-machine test that failed while others kept every core busy (before or right after it
    ran) is undecided, not failed: a skip that says so and what it failed with. On a quiet machine a
    failure stays a failure."""
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or not report.failed or not _needs_quiet(item) or call.excinfo is None:
        return
    from harness.serving import hostload

    others, cores = max(item.stash.get(BUSY_BEFORE, 0.0), others_runnable() or 0.0), hostload.cores()
    if others < cores:
        return
    failed_with = (str(call.excinfo.value).strip().splitlines() or [call.excinfo.typename])[0][:300]
    report.outcome = "skipped"
    report.longrepr = (str(item.path), item.location[1] + 1,
                       f"Skipped: machine not quiet ({others:g} runnable tasks of others on {cores} cores) and this "
                       f"test measures time or contention: undecided, run it again on a quiet machine "
                       f"(it failed with: {failed_with})")
