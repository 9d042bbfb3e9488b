"""A server's process group lives no longer than the harness process that started it.

Each layer covers a hole of the one before:
- `stop_group` when the caller's `with` ends (and an atexit hook for what a crashed caller left):
  SIGTERM to the whole group, then SIGKILL. Needs the harness to exit in order: under pytest the
  plugin turns SIGTERM into KeyboardInterrupt (`sigterm_as_interrupt`), which unwinds the `with`.
- PR_SET_PDEATHSIG(SIGTERM) on the group's leader: the harness killed outright (SIGKILL, the OOM
  killer, a second SIGTERM). Only from the main thread (it fires when the forking *thread* exits),
  it reaches the leader only, and vLLM handles SIGTERM itself.
- a reaper in the group: a small process that waits on a pipe whose write end only the harness
  holds. When the harness is gone by any means, from any thread, the pipe reads EOF and the reaper
  SIGTERMs the group, waits REAPER_GRACE_S for every other member to go, then SIGKILLs the group
  (itself last). Being a member, it also keeps the group's id from being reused while it waits.

This file runs as the reaper (`python -I -S process_group.py PGID GRACE_S`, by path): stdlib only.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

STOP_GRACE_S = 10.0  # an orderly stop: vLLM drains its engine core in a few seconds
REAPER_GRACE_S = 5.0  # the harness is gone: whatever has not left by then is killed
_QUIT = b"q"  # the harness stopped the group itself: the reaper leaves quietly

_LIVE: dict[int, tuple[subprocess.Popen | None, int | None]] = {}  # pgid -> (its reaper, the pipe's write end)
_LOCK = threading.Lock()


def group_members(pgid: int, but: int | None = None) -> list[int]:
    """Live (non-zombie) processes of the group, from /proc; [] when the group is gone."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:  # no /proc: only "is anyone there" can be told
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except (ProcessLookupError, PermissionError):
            return []
    for entry in entries:
        if not entry.isdigit() or int(entry) == but:
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, pgrp, ...
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(entry))
    return found


def _wait_gone(pgid: int, but: int | None, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while group_members(pgid, but):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def can_die_with_parent() -> bool:
    # PR_SET_PDEATHSIG fires when the *thread* that forked exits: only safe from the main thread.
    return sys.platform.startswith("linux") and threading.current_thread() is threading.main_thread()


def die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM it when the harness dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def watch(proc: subprocess.Popen) -> None:
    """Register `proc`'s group (it leads it) and put a reaper in it."""
    reaper, write_end = None, None
    if sys.platform.startswith("linux"):
        read_end, write_end = os.pipe()  # not inheritable: later children do not hold the write end
        try:
            reaper = subprocess.Popen([sys.executable, "-I", "-S", str(Path(__file__).resolve()), str(proc.pid),
                                       str(REAPER_GRACE_S)], stdin=read_end, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, process_group=proc.pid)
        except (OSError, subprocess.SubprocessError):  # the group is already gone: nothing to watch
            os.close(write_end)
            reaper, write_end = None, None
        finally:
            os.close(read_end)
    with _LOCK:
        _LIVE[proc.pid] = (reaper, write_end)


def _release(pgid: int) -> int | None:
    """Send the group's reaper away; its pid (None without one)."""
    with _LOCK:
        reaper, write_end = _LIVE.pop(pgid, (None, None))
    if write_end is not None:
        with contextlib.suppress(OSError):
            os.write(write_end, _QUIT)
        os.close(write_end)
    if reaper is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            reaper.wait(timeout=5)
        return reaper.pid
    return None


def stop_group(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the process group, wait until its members (not only the leader) are gone, then
    SIGKILL what is left; with no grace (grace_s <= 0) SIGKILL at once, as a crash would: vLLM
    answers a SIGTERM by failing its open requests politely (HTTP 500, error frames). Safe to call
    twice."""
    pgid = proc.pid
    with _LOCK:
        reaper = _LIVE.get(pgid, (None, None))[0]
    but = reaper.pid if reaper is not None else None
    steps = ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)) if grace_s > 0 else ((signal.SIGKILL, 5.0),)
    for sig, wait in steps:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)
        # the leader is gone; its children (vLLM's engine core, workers) may still be leaving
        if _wait_gone(pgid, but, max(0.5, deadline - time.monotonic())):
            break
    _release(pgid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=1)


@atexit.register
def _kill_leftovers() -> None:
    for pgid in list(_LIVE):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        _release(pgid)


def sigterm_as_interrupt():
    """From now on a first SIGTERM raises KeyboardInterrupt (so `with` blocks, fixtures' teardown
    and atexit run and stop the servers) and a second one kills at once. Returns the handler it
    replaced (None where it left things alone: not the main thread, or SIGTERM already handled)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None

    def interrupt(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise KeyboardInterrupt("SIGTERM: stopping; the servers this run started are stopped first")

    return signal.signal(signal.SIGTERM, interrupt)


def _reap(pgid: int, grace_s: float) -> int:
    """The reaper's life: wait for the harness to go, then empty the group."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the group's SIGTERM is for the others
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    while True:
        try:
            said = os.read(0, 1)
            break
        except InterruptedError:
            continue
    if said == _QUIT:
        return 0
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
        if not _wait_gone(pgid, os.getpid(), grace_s):
            os.killpg(pgid, signal.SIGKILL)  # the reaper included
    return 0


if __name__ == "__main__":
    sys.exit(_reap(int(sys.argv[1]), float(sys.argv[2])))
