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
ALONE_PATHS = (
    "suites/serving/", "suites/timings/",
    "tests/test_serving_cli.py", "tests/test_serving_client.py", "tests/test_serving_endpoint.py",
    "tests/test_serving_gate_lag.py",
    "tests/test_serving_sweep.py", "tests/test_serving_workers.py",
)


def work_unit(nodeid: str) -> str:
    """The unit a test is scheduled with: ALONE, its suite (suites/X) or its file."""
    path = nodeid.split("::", 1)[0]
    if path.startswith(ALONE_PATHS):
        return ALONE
    parts = path.split("/")
    return "/".join(parts[:2]) if parts[0] == "suites" and len(parts) > 2 else path


ALONE_KEY = "harness_alone_at_the_end"  # in xdist's workerinput: the run schedules with AloneAtTheEnd


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput[ALONE_KEY] = node.config.getvalue("dist") == "loadscope"


def pytest_sessionstart(session):
    """pytest-benchmark turns itself off in xdist's workers; the timings run ALONE, so the worker that
    runs them measures as a serial run does (--benchmark-disable still turns it off)."""
    config = session.config
    bench = getattr(config, "_benchmarksession", None)
    if bench is not None and bench.xdist_warning and getattr(config, "workerinput", {}).get(ALONE_KEY):
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
            if not getattr(self, "_ordered", False):  # the suites (model builds, vLLM starts) first, ALONE last
                self._ordered = True
                for unit in sorted(self.workqueue, key=lambda u: (u == ALONE, not u.startswith("suites/"))):
                    self.workqueue.move_to_end(unit)
            others = [n for n in self.assigned_work if n is not node]
            if list(self.workqueue) != [ALONE] or not others:
                super()._assign_work_unit(node)  # ALONE only once every other worker is done
            elif not all(n.shutting_down for n in others):
                node.shutdown()  # a worker still busy takes ALONE once this one has finished

        def remove_node(self, node):
            crashed = super().remove_node(node)
            for other in list(self.assigned_work):
                self._reschedule(other)
            return crashed

    return AloneAtTheEnd(config, log)
