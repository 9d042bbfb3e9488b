"""pytest-xdist: one GPU per worker, one report (pytest-aware, registered by the plugin).

The controller gives each worker a GPU of its own (CUDA_VISIBLE_DEVICES, set in the worker before
anything initialises CUDA); workers never write reports/, they send their tests' records, table
rows, figures and HTML blocks to the controller, which alone writes the JSON and HTML. The two
hooks that run before pytest_configure (the worker count, the worker's GPU) are module functions
the plugin exposes; the rest live on `XdistRelay`, registered next to the run. Logic lives in
harness/fleet.
"""

from __future__ import annotations

import os

import pytest

from . import env as env_mod
from .fleet import merge as fleet_merge
from .fleet.gpus import visible_gpus
from .plugin_run import HarnessRun
from .report.results import TestResult

WORKER_GPU_KEY = "harness_cuda_visible_devices"  # in xdist's workerinput


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto` where the driver shows GPUs: one worker per visible GPU (else xdist's CPU count)."""
    nvml = env_mod.probe_nvml()
    if not nvml.gpus:
        return None
    return len(visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), len(nvml.gpus))) or None


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """Worker: take the controller's GPU before the environment probe initialises CUDA."""
    gpu = getattr(config, "workerinput", {}).get(WORKER_GPU_KEY)
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu


class XdistRelay:
    """Controller: the GPU ledger and what workers send. Worker: the outbox of what it has not sent."""

    def __init__(self, run: HarnessRun) -> None:
        self.run = run
        self.worker = hasattr(run.config, "workerinput")
        self.ledger: fleet_merge.WorkerLedger | None = None
        self.outbox = fleet_merge.Outbox()

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node):
        """Controller, before a worker starts: the GPU fewest live workers hold."""
        if self.ledger is None:
            environment = self.run.environment
            gpus = visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), len(environment.nvml.gpus))
            names = fleet_merge.gpu_names(gpus, [vars(g) for g in environment.nvml.gpus])
            self.ledger = fleet_merge.WorkerLedger(gpus, names)
        node.workerinput[WORKER_GPU_KEY] = self.ledger.assign(node.gateway.id)

    def _drain(self) -> tuple[list, list, list]:
        results = self.run.results
        return self.outbox.drain(results.tables, self.run.html_fragments, results.figures)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report):
        """Worker: tag the report with worker and GPU and attach what its tests added since the last
        one (before xdist serialises it). Controller: take those in; record a crashed worker's test."""
        if self.worker:
            record = dict(getattr(report, "harness_record", {}) or {})
            record[fleet_merge.RECORD_WORKER] = self.run.config.workerinput.get("workerid")
            record[fleet_merge.RECORD_GPU] = os.environ.get("CUDA_VISIBLE_DEVICES")
            report.harness_record = fleet_merge.plain(record)
            report.user_properties = fleet_merge.plain(list(report.user_properties))
            report.harness_rows, report.harness_html, report.harness_figures = self._drain()
            return
        self._take_in(getattr(report, "harness_rows", None), getattr(report, "harness_html", None),
                      getattr(report, "harness_figures", None))
        if report.when not in ("setup", "call", "teardown") and report.failed:  # xdist's report of a crashed worker
            worker = getattr(getattr(report, "node", None), "gateway", None)
            worker_id = getattr(worker, "id", None)
            state = self.ledger.workers.get(worker_id) if self.ledger else None
            self.run.results.add_test(TestResult(
                nodeid=report.nodeid, outcome="error", duration_s=0.0,
                message=str(report.longrepr).strip().splitlines()[0] if report.longrepr else "worker crashed",
                record={fleet_merge.RECORD_WORKER: worker_id, fleet_merge.RECORD_GPU: state.gpu if state else None}))

    def _take_in(self, rows, fragments, figures) -> None:
        results = self.run.results
        for table, row in rows or ():
            results.add_row(table, row)
        for figure in figures or ():
            results.add_figure(figure["kind"], figure["title"], figure["data"])
        for title, fragment in fragments or ():
            self.run.html_fragments.append((title, fragment))

    def pytest_sessionfinish(self, session, exitstatus):
        """Worker: rows and blocks added after its last test go with its final output."""
        if self.worker:
            rows, fragments, figures = self._drain()
            session.config.workeroutput.update(harness_rows=rows, harness_html=fragments, harness_figures=figures)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        """Controller: a worker finished or crashed; its leftovers and the Workers table go in."""
        if self.ledger is None:
            return
        output = getattr(node, "workeroutput", None) or {}
        self._take_in(output.get("harness_rows"), output.get("harness_html"), output.get("harness_figures"))
        self.ledger.down(node.gateway.id, error)
        results = self.run.results
        results.tables[fleet_merge.WORKERS_TABLE] = self.ledger.rows(results.tests)
        results.write()

    def pytest_terminal_summary(self, terminalreporter, config):
        if self.worker or self.ledger is None:
            return
        terminalreporter.write_line(f"harness: xdist workers: {self.ledger.summary_line()}")
        tests = self.run.results.tests
        if config.getoption("dist", None) == "load" and len({s.gpu for s in self.ledger.workers.values()}) > 1 \
                and any(t.nodeid.startswith("suites/hw/") for t in tests):
            terminalreporter.write_line("harness: --dist load spread suites/hw over the workers: each check ran on "
                                        "one worker's GPU; --dist each runs every check on every GPU")
