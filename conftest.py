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

import fnmatch
import os
import re
import statistics
import time
from pathlib import Path

import pytest

pytest_plugins = ["harness.plugin"]

ROOT = Path(__file__).resolve().parent
ALONE_FILES, ALONE_UNSEEN = pytest.StashKey[set](), pytest.StashKey[set]()
ALONE_MARK = re.compile(r"\bmark\.alone\b")  # `pytest.mark.alone` in a decorator or a module's pytestmark


def alone_files(root: Path = ROOT) -> set[str]:
    """The test files (relative to root) that mark a test `alone`, found by reading their text: what
    scripts/test's serial run collects (--only-alone-files), instead of collecting the whole tree to
    select ~90 of 1,650 tests (~8 CPU-s). A test marked any other way is refused (pytest_deselected)."""
    found = set()
    for top in ("tests", "suites"):
        for path in (root / top).rglob("*.py"):
            if "__pycache__" not in path.parts and _is_test_file(path.name) and ALONE_MARK.search(path.read_text(errors="replace")):
                found.add(path.relative_to(root).as_posix())
    return found


def _is_test_file(name: str) -> bool:
    return fnmatch.fnmatch(name, "test_*.py") or fnmatch.fnmatch(name, "*_test.py")


def _alone_files(config) -> set[str]:
    if ALONE_FILES not in config.stash:
        config.stash[ALONE_FILES] = alone_files(config.rootpath)
    return config.stash[ALONE_FILES]


def pytest_addoption(parser):
    parser.addoption("--only-alone-files", action="store_true", default=False,
                     help="collect only the test files that mark a test `alone` (scripts/test's serial run)")


def pytest_ignore_collect(collection_path, config):
    """Under --only-alone-files: a test file without the marker, and a folder holding none, is not collected."""
    if not config.getoption("only_alone_files"):
        return None
    try:
        rel = collection_path.relative_to(config.rootpath).as_posix()
    except ValueError:
        return None
    files = _alone_files(config)
    if collection_path.is_dir():
        return True if rel != "." and not any(f.startswith(rel + "/") for f in files) else None
    return True if _is_test_file(collection_path.name) and rel not in files else None


def pytest_deselected(items):
    """Every test marked `alone` is in a file alone_files finds: else scripts/test's parallel run
    leaves it out (-m "not alone") and its serial run never collects it. Checked on the tests -m
    deselects (after every conftest has marked them); refused in pytest_collection_finish."""
    if not items:
        return
    config = items[0].config
    files, root = _alone_files(config), config.rootpath
    missed = {item.nodeid.split("::", 1)[0] for item in items if item.get_closest_marker("alone")
              and item.path.is_relative_to(root) and item.path.relative_to(root).as_posix() not in files}
    config.stash[ALONE_UNSEEN] = config.stash.get(ALONE_UNSEEN, set()) | missed


UNSEEN_KEY = "harness_alone_unseen"  # in xdist's workeroutput: a worker's collection found some


def _unseen_message(missed) -> str:
    return (f"marked alone where conftest.alone_files cannot see it (write `pytest.mark.alone` in the file, "
            f"or scripts/test runs it nowhere): {', '.join(sorted(missed))}")


def pytest_collection_finish(session):
    missed = session.config.stash.get(ALONE_UNSEEN, set())
    if missed and hasattr(session.config, "workeroutput"):  # an xdist worker: the controller says it
        session.config.workeroutput[UNSEEN_KEY] = sorted(missed)
    elif missed:
        raise pytest.UsageError(_unseen_message(missed))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    missed = getattr(node, "workeroutput", {}).get(UNSEEN_KEY)
    if missed:
        node.config.stash[ALONE_UNSEEN] = node.config.stash.get(ALONE_UNSEEN, set()) | set(missed)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    """The controller of an xdist run: a worker's refusal makes the run's exit a usage error (4)."""
    missed = session.config.stash.get(ALONE_UNSEEN, set())
    if missed and not hasattr(session.config, "workeroutput") and session.exitstatus != pytest.ExitCode.USAGE_ERROR:
        session.config.get_terminal_writer().line(f"ERROR: {_unseen_message(missed)}", red=True)
        session.exitstatus = pytest.ExitCode.USAGE_ERROR


def work_unit(nodeid: str) -> str:
    """The unit a test is scheduled with: its suite (suites/X) or its file."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    return "/".join(parts[:2]) if parts[0] == "suites" and len(parts) > 2 else path


# The units that take longest, in seconds: the fresh-clone scripts/test at the 2-core box's run of
# 2026-12-05 06:12 (2 workers, quiet box), the tests' call time plus the set-up its --durations list
# shows (suites/quant: the LoRA chain, llm-compressor and logits processes, ~75 s; a fixture's vLLM
# start, ~20 s: suites/serving's real-model file, test_serving_vocab). They are collected first, longest
# first, and xdist hands units out in collection order, so that no worker starts a long unit while the
# others have finished (that run's gate-servers file, 105 s and missing here, ran last on one worker).
# A unit missing here only loses its place in the queue.
LONGEST = {
    "suites/quant": 115, "tests/test_serving_gate_servers.py": 106, "tests/test_vllm_plan_cpu.py": 66,
    "suites/modeldir": 60, "suites/serving": 44, "tests/test_replay_limits.py": 39, "tests/test_memory_families.py": 37,
    "tests/test_serving_vocab.py": 31, "tests/test_gguf_dir.py": 28, "tests/test_drift.py": 27,
    "tests/test_step_trace.py": 25, "tests/test_serving_gate_cmd.py": 25, "tests/test_estimate_uncertainty.py": 25,
    "tests/test_fleet_ray.py": 24, "tests/test_explain_launcher.py": 23, "tests/test_docs.py": 21,
    "tests/test_report_browser.py": 20, "tests/test_hw_readiness.py": 20, "tests/test_serving_cli.py": 19,
    "tests/test_pickle_differentials.py": 18, "tests/test_step_trace_speed.py": 17, "suites/nan": 16,
    "tests/test_server_dies_with_session.py": 11, "tests/test_vllm_plan_layouts.py": 11, "tests/test_fleet_node_run.py": 10,
    "tests/test_estimate_cli.py": 9, "tests/test_serving_compare.py": 9, "tests/test_estimate_cache_layout.py": 9,
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


# The environment every process of the test run inherits (a caller's own setting wins):
# - VLLM_ENABLE_V1_MULTIPROCESSING=0: each vLLM CPU server a test starts (through the launcher, `harness
#   gate`, or as a plain outside process) runs its model worker inside the engine-core process, two
#   processes instead of three. vLLM's CPU platform only forces its multiprocess executor while this is 1
#   (vllm/platforms/cpu.py, 0.32.0); the API server keeps its engine core in a process of its own either
#   way, so a server is still a process group with a child for the teardown tests.
# - OMP_NUM_THREADS=1: that in-process worker keeps torch's two threads (vLLM's cut to one is refused once
#   the CPU worker has taken over torch.set_num_threads), and two spinning OpenMP threads beside other
#   work serve at a fraction of the speed. One thread a process is also what the quantize step and the
#   real-model tests already chose for the pytest processes and their children, three xdist workers
#   sharing two cores.
# benchmarks/serving/vllm_cpu_layout.py measures the layouts (measurements/serving/vllm-cpu-layout.json,
# the 2-core box): in-process with one thread starts in 20-25 s and 20-24 CPU-s against 30-40 s and 32-42
# for vLLM's default, holds 3.2 GiB against 3.8, and serves SmolLM2 beside two busy processes at 26-30
# tok/s against 18-24 (in-process with two threads: 7-9).
TEST_RUN_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}
for _name, _value in TEST_RUN_ENV.items():
    os.environ.setdefault(_name, _value)


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
    from harness.env import usable_cores

    others, cores = max(item.stash.get(BUSY_BEFORE, 0.0), others_runnable() or 0.0), usable_cores()
    if others < cores:
        return
    failed_with = (str(call.excinfo.value).strip().splitlines() or [call.excinfo.typename])[0][:300]
    report.outcome = "skipped"
    report.longrepr = (str(item.path), item.location[1] + 1,
                       f"Skipped: machine not quiet ({others:g} runnable tasks of others on {cores} cores) and this "
                       f"test measures time or contention: undecided, run it again on a quiet machine "
                       f"(it failed with: {failed_with})")
