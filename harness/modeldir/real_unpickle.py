"""Run a pickle through the REAL unpicklers (CPython's C `pickle.Unpickler` and the pure-Python
`pickle._Unpickler` joblib uses) with every global replaced by an inert stand-in.

The parsing (framing, protocol-0 number and string syntax, memo, marks) is the loader's own code,
so what it reads is what a loader reads; only find_class and persistent_load are ours. They never
import anything: each returns a fresh class that accepts any call, BUILD, item or append and does
nothing. What the run records is every global the unpickler asked for (the module and name as the
stream spells them, and after Python 2 renaming for protocols < 3), where it stopped (the file
position just after STOP, frames included as the reader consumed them) and why it stopped early.

Caveat, handled by the caller: a stand-in returns another stand-in, so a pickle that computes a
value with an allowed global (a name built by _codecs.encode) can stop where the real loader goes
on. Such a run requested a global and did not finish: it is never accepted.
"""

from __future__ import annotations

import _compat_pickle
import io
import pickle
from dataclasses import dataclass, field


@dataclass
class StreamRead:
    reader: str  # "C unpickler", "Python unpickler"
    start: int
    end: int | None = None  # position after the unpickler returned (None: it raised)
    error: str | None = None
    protocol: int = 0
    globals: list[tuple[str, str]] = field(default_factory=list)  # (module, name) after renaming
    persistent_ids: list[str] = field(default_factory=list)  # repr of each, cut short
    value: object = None  # int/str/bytes results (legacy magic number, protocol version)

    @property
    def complete(self) -> bool:
        return self.error is None

    @property
    def full_names(self) -> list[str]:
        return [f"{m}.{n}" for m, n in self.globals]


class _Inert:
    """What every global becomes: callable, buildable, a container that keeps nothing."""

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Inert()

    def __setstate__(self, state):
        pass

    def __setitem__(self, key, value):
        pass

    def append(self, item):
        pass

    def extend(self, items):
        pass

    def add(self, item):
        pass


def _renamed(module: str, name: str, protocol: int) -> tuple[str, str]:
    if protocol < 3:
        if (module, name) in _compat_pickle.NAME_MAPPING:
            return _compat_pickle.NAME_MAPPING[(module, name)]
        if module in _compat_pickle.IMPORT_MAPPING:
            return _compat_pickle.IMPORT_MAPPING[module], name
    return module, name


def _recording(base):
    class Recording(base):
        def __init__(self, fh, run: StreamRead):
            super().__init__(fh, encoding="latin1")  # torch and numpy load with a str-friendly encoding
            self._run = run

        def find_class(self, module, name):
            if not isinstance(module, str) or not isinstance(name, str):
                raise pickle.UnpicklingError("global names must be str")
            self._run.globals.append(_renamed(module, name, self._run.protocol))
            return type("Inert", (_Inert,), {})

        def persistent_load(self, pid):
            text = repr(pid)
            self._run.persistent_ids.append(text if len(text) <= 120 else text[:117] + "...")
            return _Inert()

    return Recording


_C_RECORDING = _recording(pickle.Unpickler)
_PY_RECORDING = _recording(pickle._Unpickler)


def _protocol_of(fh) -> int:
    here = fh.tell()
    head = fh.read(2)
    fh.seek(here)
    return head[1] if len(head) == 2 and head[0] == 0x80 else 0


def read_stream(fh, python: bool = False) -> StreamRead:
    """Unpickle one pickle from fh's position with the real unpickler, globals inert."""
    run = StreamRead("Python unpickler" if python else "C unpickler", start=fh.tell())
    run.protocol = _protocol_of(fh)
    unpickler = (_PY_RECORDING if python else _C_RECORDING)(fh, run)
    try:
        value = unpickler.load()
    except RecursionError:
        run.error = "nested too deeply"
        return run
    except MemoryError:
        run.error = "ran out of memory"
        return run
    except Exception as exc:  # noqa: BLE001 - the unpicklers raise many kinds on bad input
        text = str(exc) or type(exc).__name__
        run.error = text if len(text) <= 160 else text[:157] + "..."
        return run
    run.end = fh.tell()
    if isinstance(value, (int, str, bytes)) and not isinstance(value, bool):
        run.value = value if not isinstance(value, (str, bytes)) or len(value) <= 64 else None
    return run


def read_bytes(data: bytes, python: bool = False) -> StreamRead:
    return read_stream(io.BytesIO(data), python=python)
