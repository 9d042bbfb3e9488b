"""Calls run side by side in forked copies of this process (plan --train's first traced lengths).

A traced step is seconds of pure Python on one core; the libraries it needs (torch, transformers,
peft: seconds more) are already imported when plan knows which lengths to trace. A fork starts
from that state at once, so on a box with cores to spare the first lengths are traced together,
each in its own copy, and their results come back pickled through a pipe. Linux only (fork after
torch's import is what torch's own DataLoader workers do); elsewhere, or on one core, nothing runs
side by side and the caller traces one length after another as before.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import sys
import time
from collections.abc import Callable
from typing import Any


def can_fork() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "fork")


class ForkedError(Exception):
    """What a call raised in its forked copy, when that exception could not be sent back as it was."""


def _one_thread() -> None:
    """torch's CPU kernels in one thread in the copy: an OpenMP team the parent started before the
    fork does not exist in the copy, and the first parallel kernel would wait on it for ever."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def _child(call: Callable[[], Any], write_fd: int) -> None:
    """In the forked copy: run the call, send ("ok", result) or ("error", exception), never return."""
    code = 0
    try:
        try:
            _one_thread()
            message = ("ok", call())
        except BaseException as exc:  # noqa: BLE001 - whatever it raised goes back to the parent
            message, code = ("error", exc), 1
        try:
            blob = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - an unpicklable result or exception: said in words
            blob = pickle.dumps(("error", ForkedError(f"{type(exc).__name__}: {exc}")))
            code = 1
        with os.fdopen(write_fd, "wb") as fh:
            fh.write(blob)
    finally:
        os._exit(code)  # no atexit handlers, no flushing of the parent's buffers


# How long the copies may take once here() is done: this many times its time, and at least this long
WAIT_FACTOR, WAIT_AT_LEAST_S = 5, 60.0


def _read_until(fd: int, deadline: float) -> bytes | None:
    """Everything the copy writes to fd until it closes it, or None at the deadline."""
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def side_by_side(here: Callable[[], Any], elsewhere: list[Callable[[], Any]]) -> tuple[Any, list[Any]]:
    """(here(), [each of elsewhere's results]): here runs in this process while each call of
    elsewhere runs in a forked copy of it. A call that raised gives its exception in its place in
    the list (ForkedError where it could not be pickled, or where the copy took WAIT_FACTOR times
    here()'s time, and at least WAIT_AT_LEAST_S, after here() was done: killed); what here() raises
    is raised, the copies killed first."""
    sys.stdout.flush()
    sys.stderr.flush()
    children: list[tuple[int, int]] = []  # (pid, read fd)
    try:
        for call in elsewhere:
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read_fd)
                signal.signal(signal.SIGINT, signal.SIG_DFL)  # ^C ends the copies with the parent
                _child(call, write_fd)
            os.close(write_fd)
            children.append((pid, read_fd))
        t0 = time.monotonic()
        result = here()
        # a copy does what here() did: one far slower than that is stuck, not busy
        deadline = time.monotonic() + max(WAIT_AT_LEAST_S, WAIT_FACTOR * (time.monotonic() - t0))
        results = []
        while children:
            pid, read_fd = children[0]
            blob = _read_until(read_fd, deadline)
            if blob is None:
                os.kill(pid, signal.SIGKILL)
            os.close(read_fd)
            os.waitpid(pid, 0)
            children.pop(0)
            try:
                _, value = pickle.loads(blob) if blob is not None else ("error", ForkedError("timed out"))
            except Exception as exc:  # noqa: BLE001 - a copy that died before it wrote (killed, out of memory)
                value = ForkedError(f"the forked process sent nothing readable: {exc}")
            results.append(value)
        return result, results
    finally:
        for pid, read_fd in children:  # only after an exception here: the rest are not wanted
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
            try:
                os.close(read_fd)
            except OSError:
                pass
