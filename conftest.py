"""This repository's test run: the harness plugin, and how `pytest -n N --dist loadscope` (scripts/test)
shares the tests out over pytest-xdist workers.

Each unit of work goes to one worker whole: a suite (suites/X: its session fixtures, its model
builds and vLLM servers are made once) or a file of tests/. The tests that measure time or CPU
contention (ALONE: the serving benches and gates, the client's lag and contention readings, the
timings) form one last unit that starts only when every other worker has finished, so nothing else
runs beside them: what they measure is the same as in a serial run.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["harness.plugin"]

ALONE = "alone at the end"
ALONE_PATHS = (  # beginnings of test ids: a folder, a file, or one test of a file
    "suites/serving/", "suites/timings/",
    "tests/test_serving_cli.py", "tests/test_serving_client.py",
    # the whole serving suite (its gate included) against an outside server; the file's other tests
    # (a pytester run against a closed port, URL parsing) time nothing and run beside the rest
    "tests/test_serving_endpoint.py::test_an_outside_server_survives_the_whole_serving_suite",
    "tests/test_serving_gate_lag.py",
    "tests/test_serving_sweep.py", "tests/test_serving_workers.py",
)


def work_unit(nodeid: str) -> str:
    """The unit a test is scheduled with: ALONE, its suite (suites/X) or its file."""
    if nodeid.startswith(ALONE_PATHS):
        return ALONE
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    return "/".join(parts[:2]) if parts[0] == "suites" and len(parts) > 2 else path


# The units that take longest, in seconds (a run of scripts/test on the 2-core CI machine, fresh model
# cache, 2026-12-02): the scheduler hands these out first, longest first, then the rest in xdist's
# order (most tests first), so that no worker starts a half-minute unit while the other has finished
# and ALONE waits on it (that run: one worker idle 29 s before ALONE; the fleet and vLLM-plan files
# came last). A unit missing here only loses its place in the queue.
LONGEST = {
    "suites/quant": 132, "suites/modeldir": 92, "tests/test_gguf_dir.py": 56, "tests/test_serving_vocab.py": 55,
    "tests/test_drift.py": 41, "tests/test_report_browser.py": 38, "tests/test_fleet_ray.py": 31,
    "tests/test_fleet_node_run.py": 30, "tests/test_explain_launcher.py": 26, "suites/nan": 25,
    "tests/test_vllm_plan_cpu.py": 24, "tests/test_hw_bnb.py": 22, "tests/test_pickle_differentials.py": 20,
    "tests/test_foundation_plugin.py": 20, "tests/test_docs.py": 18, "tests/test_pickle_corpus.py": 17,
    "tests/test_serving_endpoint.py": 22,
}


def queue_order(units) -> list[str]:
    """The order units are handed out: the LONGEST, longest first, then the other suites, then the
    rest in the order given; ALONE last."""
    order = {unit: i for i, unit in enumerate(units)}
    return sorted(units, key=lambda u: (u == ALONE, not u.startswith("suites/") and u not in LONGEST,
                                        -LONGEST.get(u, 0), order[u]))


ALONE_KEY = "harness_alone_at_the_end"  # in xdist's workerinput: the run schedules with AloneAtTheEnd


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput[ALONE_KEY] = node.config.getvalue("dist") == "loadscope"


def pytest_sessionstart(session):
    """pytest-benchmark turns itself off in xdist's workers; the timings run ALONE, so the worker that
    runs them measures as a serial run does (--benchmark-disable still turns it off)."""
    config = session.config
    bench = getattr(config, "_benchmarksession", None)
    if bench is not None and getattr(bench, "xdist_warning", False) and getattr(config, "workerinput", {}).get(ALONE_KEY):
        bench.disabled = bench.xdist_warning = False


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None  # xdist's own schedulers (load, each, ...) as asked
    from xdist.scheduler import LoadScopeScheduling

    class AloneAtTheEnd(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def _assign_work_unit(self, node) -> None:
            if not getattr(self, "_ordered", False):  # the suites and the LONGEST first, ALONE last
                self._ordered = True
                for unit in queue_order(list(self.workqueue)):
                    self.workqueue.move_to_end(unit)
            others = [n for n in self.assigned_work if n is not node]  # a worker that exited is removed
            if list(self.workqueue) != [ALONE] or not others:
                super()._assign_work_unit(node)  # ALONE only once every other worker has exited
            elif not all(n.shutting_down for n in others):
                node.shutdown()  # a worker still busy takes ALONE once this one has exited
            # else: the others are told to stop but may still run their last tests (a worker asks for
            # more with up to 2 pending): this one waits, and remove_node hands it ALONE

        def remove_node(self, node):
            crashed = super().remove_node(node)
            for other in list(self.assigned_work):
                self._reschedule(other)
            return crashed

    return AloneAtTheEnd(config, log)
