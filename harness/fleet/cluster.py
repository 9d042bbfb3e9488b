"""The suites on every node of a Ray cluster: one task per node, pinned to it with the node's GPUs
as its resources, gathered with timeouts so that nothing hangs.

Each node's task (node_run.node_task) publishes its growing results JSON to a small actor on the
driver's node; a node that dies mid-run is seen through Ray's node table (or its task's error)
and reported with the last results it published. Ray is imported here only, inside functions:
without the `fleet` extra the rest of the harness works and `fleet` says what to install.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import UsageError
from . import node_run

INSTALL_HINT = "pip install -e '.[fleet]'"
POLL_S = 1.0  # how often the driver reads the board and Ray's node table
GRACE_S = 60.0  # past a node's own timeout, how long the driver waits before it gives up on it


@dataclass
class NodeInfo:
    node_id: str
    ip: str
    host: str
    name: str  # Ray's node name (`ray start --node-name`; its IP by default)
    gpus: float  # Ray's GPU resource on the node (what the task asks for)
    resources: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    is_driver_node: bool = False


@dataclass
class NodeOutcome:
    """How one node's run went. state: pending | running, then finished | died | timed out |
    error | interrupted."""

    node: NodeInfo
    state: str = "pending"
    exit_code: int | None = None
    results: dict[str, Any] | None = None  # the pytest run's JSON (partial unless finished)
    html: str | None = None
    error: str | None = None
    log_tail: str = ""
    seconds: float | None = None
    started: bool = False


def _import_ray():
    try:
        import ray
    except ImportError:
        raise UsageError(f"Ray is not installed: {INSTALL_HINT}") from None
    return ray


def _reachable(address: str, timeout_s: float = 5.0) -> None:
    """A quick TCP check of host:port addresses, so a wrong one is one line, not a minute of retries."""
    if address in ("auto", "local") or "://" in address and not address.startswith("ray://"):
        return
    host_port = address.removeprefix("ray://")
    host, sep, port = host_port.rpartition(":")
    if not sep or not port.isdigit():
        raise UsageError(f"--address: {address!r} is not host:port, ray://host:port or auto")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise UsageError(f"cannot reach a Ray cluster at {address}: {exc.strerror or exc}") from None


def connect(address: str, timeout_s: float = 30.0):
    """ray.init against an existing cluster; one-line errors for a missing Ray or a bad address.

    ray.init retries for minutes against a port that answers but is no Ray head: past `timeout_s`
    the process says so in one line and exits 2 (the init cannot be cancelled from Python).
    """
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")  # the core's retry warnings, one per second
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # quiet a FutureWarning
    ray = _import_ray()
    _reachable(address)

    def give_up() -> None:
        sys.stderr.write(f"harness fleet: error: cannot connect to the Ray cluster at {address}: no answer within "
                         f"{timeout_s:.0f} s (is it the head's GCS port, 6379 by default?)\n")
        sys.stderr.flush()
        os._exit(2)

    watchdog = threading.Timer(timeout_s, give_up)
    watchdog.daemon = True
    watchdog.start()
    try:
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False, ignore_reinit_error=True)
    except Exception as exc:  # ConnectionError, RuntimeError, grpc errors: all one line
        text = str(exc).strip().splitlines()
        raise UsageError(f"cannot connect to the Ray cluster at {address}: {text[0] if text else type(exc).__name__}") \
            from None
    finally:
        watchdog.cancel()
    return ray


def alive_nodes(ray) -> list[NodeInfo]:
    driver_node = ray.get_runtime_context().get_node_id()
    out = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        resources = {k: float(v) for k, v in (n.get("Resources") or {}).items() if not k.startswith("node:")}
        out.append(NodeInfo(node_id=n["NodeID"], ip=n.get("NodeManagerAddress", "?"),
                            host=n.get("NodeManagerHostname", "?"),
                            name=n.get("NodeName") or n.get("NodeManagerAddress", "?"), gpus=resources.get("GPU", 0.0),
                            resources=resources, labels=dict(n.get("Labels") or {}),
                            is_driver_node=n["NodeID"] == driver_node))
    return sorted(out, key=lambda i: (i.name, i.node_id))


def _first_line(exc: BaseException) -> str:
    """The exception's name and first sentence (Ray's messages go on for a paragraph)."""
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    first = lines[0].split(". ")[0].rstrip(".") if lines else ""
    return f"{type(exc).__name__}: {first}".rstrip(": ")


def _died_reason(exc: BaseException) -> str | None:
    """A node or worker that went away (not the suite failing) reads as died."""
    names = {type(exc).__name__} | {c.__name__ for c in type(exc).__mro__}
    if names & {"NodeDiedError", "WorkerCrashedError", "OwnerDiedError", "ActorDiedError",
                "ObjectLostError", "LocalRayletDiedError"}:
        return _first_line(exc)
    return None


def run_on_fleet(ray, nodes: list[NodeInfo], root: str, pytest_args: list[str], python: str | None,
                 timeout_s: float, run_id: str,
                 on_progress: Callable[[list[NodeOutcome]], None] = lambda outcomes: None) -> list[NodeOutcome]:
    """One pinned task per node; returns when every node finished, died or ran out of time.

    `on_progress` is called after every change (a test finished somewhere, a node ended) so the
    caller can rewrite its partial report and print progress.
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.cloudpickle.register_pickle_by_value(node_run)  # nodes need Ray and a checkout, not this code
    driver_node = next((n.node_id for n in nodes if n.is_driver_node), ray.get_runtime_context().get_node_id())
    board = ray.remote(num_cpus=0)(node_run.Board).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(driver_node, soft=False)).remote()
    task = ray.remote(node_run.node_task)
    outcomes = {n.node_id: NodeOutcome(n) for n in nodes}
    refs = {}
    for n in nodes:
        refs[task.options(num_cpus=0, num_gpus=n.gpus, max_retries=0,
                          scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False)).remote(
            board, n.node_id, root, pytest_args, python, timeout_s, run_id)] = n.node_id
    deadline = time.monotonic() + timeout_s + GRACE_S
    snapshots: dict[str, dict] = {}
    seen = None

    def lost() -> None:  # last resort: a Ray call that never returns (the head gone) must not hang the run
        for node_id in list(refs.values()):
            o = outcomes[node_id]
            o.state, o.error = "timed out", "the driver lost the cluster (Ray stopped answering)"
            o.results = snapshots.get(node_id, {}).get("results", o.results)
        on_progress(list(outcomes.values()))
        sys.stderr.write("harness fleet: error: Ray stopped answering; the partial report is written\n")
        sys.stderr.flush()
        os._exit(1)

    watchdog = threading.Timer(timeout_s + GRACE_S + 120, lost)
    watchdog.daemon = True
    watchdog.start()
    try:
        while refs and time.monotonic() < deadline:
            ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=POLL_S)
            snapshots = _read_board(ray, board, snapshots)
            for ref in ready:
                _finish(ray, outcomes[refs.pop(ref)], ref, snapshots)
            _mark_dead(ray, refs, outcomes, snapshots)
            for node_id, snap in snapshots.items():
                o = outcomes.get(node_id)
                if o is not None and o.state in ("pending", "running"):
                    o.started, o.state = True, "running"
                    o.results = snap.get("results", o.results)
            state = [(o.state, len((o.results or {}).get("tests", []))) for o in outcomes.values()]
            if state != seen:
                seen = state
                on_progress(list(outcomes.values()))
        for ref, node_id in list(refs.items()):  # past the deadline: give up on these, keep what they sent
            o = outcomes[node_id]
            o.state = "timed out"
            o.error = (f"no answer within {timeout_s + GRACE_S:.0f} s" if o.started else
                       f"never started within {timeout_s + GRACE_S:.0f} s (waiting for the node's "
                       f"{n_gpus(o.node)} GPU(s) to be free?)")
            o.results = snapshots.get(node_id, {}).get("results", o.results)
            _cancel(ray, ref)
            refs.pop(ref)
    except KeyboardInterrupt:
        for ref, node_id in refs.items():
            outcomes[node_id].state = "interrupted"
            outcomes[node_id].results = snapshots.get(node_id, {}).get("results", outcomes[node_id].results)
            _cancel(ray, ref)
        raise
    finally:
        watchdog.cancel()
        on_progress(list(outcomes.values()))
    return list(outcomes.values())


def n_gpus(node: NodeInfo) -> str:
    return f"{node.gpus:g}"


def _read_board(ray, board, previous: dict) -> dict:
    try:
        return ray.get(board.read.remote(), timeout=10)
    except Exception:
        return previous


def _finish(ray, outcome: NodeOutcome, ref, snapshots: dict) -> None:
    try:
        result = ray.get(ref, timeout=30)
    except Exception as exc:
        died = _died_reason(exc)
        outcome.state = "died" if died else "error"
        outcome.error = died or _first_line(exc)
        outcome.results = snapshots.get(outcome.node.node_id, {}).get("results", outcome.results)
        return
    outcome.started = True
    outcome.state = result.get("state", "error")
    outcome.exit_code = result.get("exit_code")
    outcome.results = result.get("results") or snapshots.get(outcome.node.node_id, {}).get("results")
    outcome.html = result.get("html")
    outcome.error = result.get("error")
    outcome.log_tail = result.get("log_tail", "")
    outcome.seconds = result.get("seconds")
    if outcome.state == "timed out" and not outcome.error:
        outcome.error = f"the suite ran past --timeout ({result.get('seconds')} s) and was stopped"


def _mark_dead(ray, refs: dict, outcomes: dict, snapshots: dict) -> None:
    """A node the cluster no longer lists as alive: its task will not answer; stop waiting for it."""
    try:
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    except Exception:
        return
    for ref, node_id in list(refs.items()):
        if node_id not in alive:
            o = outcomes[node_id]
            o.state = "died"
            o.error = "the node left the cluster mid-run (Ray marked it dead)"
            o.results = snapshots.get(node_id, {}).get("results", o.results)
            _cancel(ray, ref)
            refs.pop(ref)


def _cancel(ray, ref) -> None:
    try:
        ray.cancel(ref, force=True)
    except Exception:
        pass
