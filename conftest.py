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
    "tests/test_serving_client.py", "tests/test_serving_gate_lag.py", "tests/test_serving_workers.py",
    # the bench and launcher tests that hold a deadline, an SLO or a sleep, or race a signal; the file's
    # others (usage errors, URL forms, failures and prompt lengths as written) time nothing
    "tests/test_serving_cli.py::test_bench_writes_schema_1_results",
    "tests/test_serving_cli.py::test_bench_stalled_server_ends_within_the_timeout",
    "tests/test_serving_cli.py::test_bench_unreachable_and_wrong_model_are_one_line_verdicts",
    "tests/test_serving_cli.py::test_crash_at_start_names_the_cause",
    "tests/test_serving_cli.py::test_never_healthy_times_out_and_teardown_kills_the_whole_group",
    "tests/test_serving_cli.py::test_a_failing_test_body_still_stops_the_server",
    "tests/test_serving_cli.py::test_bench_poisson_rate_mode",
    "tests/test_serving_cli.py::test_ctrl_c_leaves_the_finished_requests_on_disk",
    "tests/test_serving_cli.py::test_a_harness_killed_outright_takes_its_server_with_it",
    # the whole serving suite (its gate included) against an outside server; the file's other tests
    # (a pytester run against a closed port, URL parsing) time nothing and run beside the rest
    "tests/test_serving_endpoint.py::test_an_outside_server_survives_the_whole_serving_suite",
    # the throughput plateau; the rate parsing, goodput arithmetic and length distributions time nothing
    "tests/test_serving_sweep.py::test_bench_sweep_finds_the_capped_plateau_and_the_page_draws_it",
)


def work_unit(nodeid: str) -> str:
    """The unit a test is scheduled with: ALONE, its suite (suites/X) or its file."""
    if nodeid.startswith(ALONE_PATHS):
        return ALONE
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    return "/".join(parts[:2]) if parts[0] == "suites" and len(parts) > 2 else path


# The units that take longest, in seconds (a run of scripts/test on the 2-core CI machine, 3 workers, fresh
# model cache, 2026-12-03, setup included): the scheduler hands these out first, longest first, then the rest
# in xdist's order (most tests first), so that no worker starts a long unit while the others have finished
# and ALONE waits on it (that run: the last worker finished 14 s after the first). A unit missing here only
# loses its place in the queue.
LONGEST = {
    "suites/quant": 215, "suites/modeldir": 148, "tests/test_serving_vocab.py": 93, "tests/test_gguf_dir.py": 64,
    "tests/test_fleet_ray.py": 54, "tests/test_vllm_plan_cpu.py": 47, "tests/test_drift.py": 43,
    "tests/test_explain_launcher.py": 38, "tests/test_foundation_plugin.py": 37, "tests/test_report_browser.py": 32,
    "tests/test_pickle_differentials.py": 31, "suites/nan": 30, "tests/test_fleet_node_run.py": 30,
    "tests/test_docs.py": 26, "tests/test_hw_bnb.py": 23, "tests/test_serving_cli.py": 21,
    "tests/test_fleet_xdist.py": 19, "tests/test_estimate_cli.py": 17, "tests/test_modeldir_paths.py": 17,
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
