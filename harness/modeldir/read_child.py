"""Read a directory's files with the loaders' own code in a child process with a memory and time limit.

The parent (check-dir) forks one child per directory; the child inherits the imported torch (a
fork costs milliseconds, an interpreter start with torch a second), caps its address space
(RLIMIT_AS: what it had plus READ_MEMORY_BYTES; the parent also kills it once its resident size
grows by more, see _start_fresh) and reads the files one after the other
(harness.modeldir.loader_views), sending one result per file through a pipe. The parent waits at
most READ_SECONDS for each result; a child that runs over, runs out of memory or dies is killed,
the file it was reading becomes "cannot be verified", and a fresh child reads the files left.
Nothing hostile runs in the parent: a file that hangs torch's reader or exhausts memory costs the
child only.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import time
from dataclasses import dataclass

from .loader_views import LoaderRead, read_file

READ_SECONDS = 60.0  # per file
READ_MEMORY_BYTES = 8 * 1024 ** 3  # address space (and resident memory) the child may add to what it inherited
WATCH_S = 0.05  # how often the parent looks at the child's resident size while it waits


@dataclass
class ReadFailure:
    rel: str
    reason: str  # "took longer than 60 s", "ran out of memory" ...


def read_all(files: list[tuple[str, str]], seconds: float = READ_SECONDS, memory: int = READ_MEMORY_BYTES,
             progress: bool = False, reader=read_file) -> dict[str, LoaderRead | ReadFailure]:
    """files: (absolute path, relative name). Returns rel -> LoaderRead (or what `reader(path, rel)`
    returns: it runs in the forked child), or ReadFailure. With progress, a line on stderr every
    2 s once reading takes longer than that."""
    _preload(files if reader is read_file else [])

    results: dict[str, LoaderRead | ReadFailure] = {}
    left = list(files)
    note = _Progress(len(files)) if progress else None
    while left:
        got = _one_child(left, seconds, memory, note, reader)
        for rel, value in got.items():
            results[rel] = value
        left = [item for item in left if item[1] not in results]
    return results


def _preload(files: list[tuple[str, str]]) -> None:
    """Import the readers here, once: a child forked afterwards inherits them instead of paying.
    Only the readers the files' first bytes call for (_readers_for): torch (most of the cost) for a
    zip, a binary pickle or a tar; a text file that turns out to be a pickle imports it in the child."""
    import importlib

    wanted: set[str] = set()
    for path, _rel in files:
        wanted |= _readers_for(*_head(path))
    modules = ["numpy", "safetensors", "tokenizers"]
    if "torch" in wanted:
        modules += ["torch", "torch.serialization", "torch._weights_only_unpickler"]
    modules += sorted(wanted - {"torch"})
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - a missing reader fails closed in the child
            pass


def _readers_for(head: bytes, size: int) -> set[str]:
    from .format_reads import looks_safetensors
    from .loader_views import COMPRESSED_MAGIC

    wanted = set()
    pickle_like = head.startswith(b"\x80") and not looks_safetensors(head, size)  # a header length may end in 0x80
    if head.startswith(b"PK\x03\x04") or pickle_like or head[257:262] == b"ustar":
        wanted.add("torch")
    if head.startswith(COMPRESSED_MAGIC):
        wanted.add("joblib.numpy_pickle")
    if head.startswith(b"GGUF"):
        wanted.add("gguf")
    return wanted


def _head(path: str) -> tuple[bytes, int]:
    import stat

    try:  # never blocks: a FIFO (or anything but a regular file) is not read here
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return b"", 0
    try:
        info = os.fstat(fd)
        return (os.read(fd, 512), info.st_size) if stat.S_ISREG(info.st_mode) else (b"", 0)
    except OSError:
        return b"", 0
    finally:
        os.close(fd)


class _Progress:
    def __init__(self, total: int) -> None:
        self.total, self.done = total, 0
        self.started = self.last = time.monotonic()

    def step(self, rel: str) -> None:
        import sys

        self.done += 1
        now = time.monotonic()
        if now - self.last > 2:
            self.last = now
            print(f"\r[check-dir] read {self.done}/{self.total} files with their loaders' code ({rel})",
                  end="", file=sys.stderr, flush=True)
        if self.done == self.total and now - self.started > 2:
            print(f"\r[check-dir] read {self.total} files in {now - self.started:.1f} s", file=sys.stderr, flush=True)


def _one_child(files: list[tuple[str, str]], seconds: float, memory: int, note: _Progress | None = None,
               reader=read_file) -> dict:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_end)
        _child(files, write_end, memory, reader)
    os.close(write_end)
    got: dict = {}
    try:
        with os.fdopen(read_end, "rb", buffering=0) as pipe:
            start = _read_exact(pipe, 8, time.monotonic() + seconds, lambda: False)
            if start is None:
                return {files[0][1]: ReadFailure(files[0][1], _why(pid, seconds))}
            rss_limit = struct.unpack("<Q", start)[0] + memory
            over = lambda: _rss(pid) > rss_limit  # noqa: E731
            for _, rel in files:
                message = _receive(pipe, seconds, over)
                if message is None or over():  # a read that went over its memory is no verdict
                    got[rel] = ReadFailure(rel, _memory_reason(memory) if over() else _why(pid, seconds))
                    break
                got[message[0]] = message[1]
                if note is not None:
                    note.step(message[0])
    finally:
        _reap(pid)
    return got


def _child(files: list[tuple[str, str]], fd: int, memory: int, reader=read_file) -> None:
    code = 0
    try:
        _limit_memory(memory)
        os.write(fd, struct.pack("<Q", _start_fresh()))
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        for path, rel in files:
            try:
                value: LoaderRead | ReadFailure = reader(path, rel)
            except MemoryError:
                value = ReadFailure(rel, _memory_reason(memory))
            except Exception as exc:  # noqa: BLE001 - any reader failure is a verdict, never a crash
                value = ReadFailure(rel, f"the reader failed ({type(exc).__name__}: {str(exc)[:160]})")
            data = pickle.dumps((rel, value), protocol=4)
            os.write(fd, struct.pack("<Q", len(data)))
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
    except BaseException:  # noqa: BLE001 - the parent sees a dead child
        code = 1
    finally:
        os._exit(code)


def _memory_reason(memory: int) -> str:
    size = f"{memory / 1024 ** 3:g} GiB" if memory >= 1024 ** 3 else f"{memory / 1024 ** 2:g} MiB"
    return f"reading it needs more than {size} of memory"


def _start_fresh() -> int:
    """In the child: give the heap's free pages back and restart the peak count; returns the
    resident bytes to measure growth from. A forked child shares its parent's pages, and a free
    chunk of the parent's heap (left by earlier work in a long-lived parent, a pytest worker say)
    that the child reuses neither grows its address space (RLIMIT_AS never fires) nor its resident
    size (the copy-on-write copy replaces a page already counted): a 96 MiB read once fitted under
    a 32 MiB limit that way. Trimmed, a reused free page is a fresh page and counts."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)  # glibc: every arena's free pages back to the kernel
    except (OSError, AttributeError):
        pass  # no glibc: free heap the parent held may go unseen
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # VmHWM := VmRSS (Linux >= 4.0)
    except OSError:
        return _status_bytes(os.getpid(), "VmHWM:")  # the peak so far is then the baseline
    return _status_bytes(os.getpid(), "VmRSS:")


def _rss(pid: int) -> int:
    """Peak resident bytes of the child since _start_fresh (VmHWM: a read that is over and done
    between two looks still counts). 0 once it is gone."""
    try:
        return _status_bytes(pid, "VmHWM:")
    except OSError:
        return 0


def _status_bytes(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next((int(line.split()[1]) * 1024 for line in status if line.startswith(field)), 0)


def _limit_memory(extra: int) -> None:
    import resource

    with open("/proc/self/status") as status:
        vm = next((int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:")), 0)
    limit = vm + extra
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _receive(pipe, seconds: float, over=lambda: False):
    deadline = time.monotonic() + seconds
    header = _read_exact(pipe, 8, deadline, over)
    if header is None:
        return None
    body = _read_exact(pipe, struct.unpack("<Q", header)[0], deadline + seconds, over)
    if body is None:
        return None
    return pickle.loads(body)  # our own child's dataclasses, never file content


def _read_exact(pipe, n: int, deadline: float, over) -> bytes | None:
    """n bytes from the child, or None at the deadline or once over() says its memory ran over:
    RLIMIT_AS alone lets a child reuse the free heap the parent had mapped (after earlier
    allocations) without growing its address space, so its resident size is watched too."""
    chunks = bytearray()
    while len(chunks) < n:
        wait = deadline - time.monotonic()
        if wait <= 0 or over():
            return None
        if not select.select([pipe], [], [], min(wait, WATCH_S))[0]:
            continue
        piece = pipe.read(n - len(chunks))
        if not piece:
            return None
        chunks += piece
    return bytes(chunks)


def _why(pid: int, seconds: float) -> str:
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return "the reading process died"
    if done == 0:
        return f"reading it took longer than {seconds:g} s"
    if os.WIFSIGNALED(status):
        return f"the reading process was killed by signal {os.WTERMSIG(status)} (out of memory?)"
    return "the reading process stopped (out of memory?)"


def _reap(pid: int) -> None:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    except (ChildProcessError, ProcessLookupError):
        pass
