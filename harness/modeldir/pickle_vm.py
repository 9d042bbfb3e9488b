"""Run a pickle's opcodes on a simulated stack, never executing it: what would it import and call?

pickletools.genops decodes the opcodes; this module replays them the way the C unpickler
(pickle.load, torch.load(weights_only=False), np.load(allow_pickle=True)) does: MARK and the
metastack, the memo (PUT, BINPUT, LONG_BINPUT, MEMOIZE, GET ...), FRAME ignored as the C unpickler
ignores it, STACK_GLOBAL taking its two operands from the simulated stack (so strings pushed and
POPped, or fetched from the memo, or computed by a call, are what they really are), protocols 0-5,
and find_class's name rules: for protocol < 3 the fix_imports mapping of _compat_pickle
(``cPickle`` -> ``pickle``, ``urllib2.urlopen`` -> ``urllib.request.urlopen``), dotted names
(``builtins.eval.__call__`` reaches ``builtins.eval``).

Values are symbolic: constants stay Python constants; globals, call results and persistent ids
are small objects. Nothing is imported. Where the real unpickler would stop with an error (stack
underflow, missing memo key, STACK_GLOBAL of non-strings, truncated data) the run stops there too,
keeping what was reached before (the payload of a "broken" pickle runs before the break).

While replaying, the run checks torch's weights-only rule through an `AllowList`: every global
reached must be allowed, REDUCE/NEWOBJ/OBJ/INST may only call allowed globals, BUILD may only
target what allowed constructors made, persistent ids must be torch storages, and items may only
be set on dicts and appended to lists. Each breach is a `Violation`.
"""

from __future__ import annotations

import _compat_pickle
import codecs
import pickletools
from dataclasses import dataclass, field
from typing import Protocol

# _codecs.encode is on torch's allow-list (protocol 2 stores bytes as encode(text, "latin1")); a
# pickle can also use it to compute a STACK_GLOBAL operand. These pure text codecs are evaluated so
# the computed name is known; any other codec leaves the value unknown.
_PURE_CODECS = {"latin1", "latin-1", "iso-8859-1", "iso8859-1", "ascii", "utf-8", "utf8", "rot13", "rot_13"}
MAX_CONST_LEN = 4096  # longer computed strings are not evaluated


class AllowList(Protocol):
    def allowed(self, full_name: str) -> bool: ...

    def buildable(self, full_name: str) -> bool: ...


@dataclass(frozen=True)
class Import:
    """A global the unpickler would import: find_class(module, name) after its name rules."""

    module: str
    name: str
    opcode: str  # GLOBAL, STACK_GLOBAL, INST, EXT1 ...
    offset: int
    resolved: bool = True  # False: operands computed at load time or an extension code

    @property
    def full(self) -> str:
        return f"{self.module}.{self.name}" if self.resolved else self.name

    @property
    def root(self) -> str:
        """module.first_attribute: what a dotted name reaches first (builtins.eval.__call__ -> builtins.eval)."""
        return f"{self.module}.{self.name.split('.')[0]}" if self.resolved else self.name


@dataclass(frozen=True)
class Violation:
    kind: str  # "global", "call", "build", "persistent_id", "setitem", "append", "unresolved"
    detail: str
    offset: int
    global_name: str | None = None  # the global outside the allow-list, when there is one


@dataclass
class PickleRun:
    start: int
    end: int | None = None  # offset just past STOP; None when the run stopped early
    protocol: int = 0
    opcodes: int = 0
    imports: list[Import] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    error: str | None = None  # why the real unpickler would stop (None: it reached STOP)
    value: object = None  # the unpickled value when it is a constant (legacy magic number, protocol)

    @property
    def complete(self) -> bool:
        return self.error is None and self.end is not None


# -- symbolic values -------------------------------------------------------------------------------

class _Sym:
    __slots__ = ()


class _Global(_Sym):
    __slots__ = ("imp", "allowed")

    def __init__(self, imp: Import, allowed: bool):
        self.imp, self.allowed = imp, allowed

    def __repr__(self) -> str:
        return self.imp.full


class _Made(_Sym):
    """What a call returned; `const` when it is known (a pure codec's output)."""

    __slots__ = ("maker", "buildable", "const")

    def __init__(self, maker: str, buildable: bool, const: object = None):
        self.maker, self.buildable, self.const = maker, buildable, const

    def __repr__(self) -> str:
        return f"<result of {self.maker}>"


class _Persistent(_Sym):
    __slots__ = ()

    def __repr__(self) -> str:
        return "<persistent object>"


class _Dict(_Sym):
    __slots__ = ()

    def __repr__(self) -> str:
        return "<dict>"


class _Set(_Sym):
    __slots__ = ()

    def __repr__(self) -> str:
        return "<set>"


class _Stop(Exception):
    """The real unpickler would raise here."""


def _describe(value: object) -> str:
    if isinstance(value, _Sym):
        return repr(value)
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, _Made) and isinstance(value.const, str):
        return value.const
    return None


def resolve_name(module: str, name: str, protocol: int, fix_imports: bool = True) -> tuple[str, str]:
    """find_class's renaming: Python 2 names are mapped for protocol < 3 (fix_imports=True)."""
    if protocol < 3 and fix_imports:
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
    return module, name


# -- the run ---------------------------------------------------------------------------------------

class _Machine:
    def __init__(self, fh, allow: AllowList, run: PickleRun, max_bytes: int):
        self.fh, self.allow, self.run, self.max_bytes = fh, allow, run, max_bytes
        self.stack: list = []
        self.metastack: list[list] = []
        self.memo: dict[int, object] = {}
        self.imported: set[str] = set()

    # stack helpers: an empty stack is an unpickling error, as in the C unpickler
    def pop(self):
        if not self.stack:
            raise _Stop("stack underflow")
        return self.stack.pop()

    def top(self):
        if not self.stack:
            raise _Stop("stack underflow")
        return self.stack[-1]

    def pop_mark(self) -> list:
        if not self.metastack:
            raise _Stop("MARK expected but not found")
        items = self.stack
        self.stack = self.metastack.pop()
        return items

    def violate(self, kind: str, detail: str, offset: int, global_name: str | None = None) -> None:
        self.run.violations.append(Violation(kind, detail, offset, global_name))

    def import_global(self, module: object, name: object, opcode: str, offset: int) -> _Global:
        mod_text, name_text = _text(module), _text(name)
        if mod_text is None or name_text is None:
            if opcode == "STACK_GLOBAL" and not (isinstance(module, _Sym) or isinstance(name, _Sym)):
                raise _Stop("STACK_GLOBAL requires str")
            imp = Import("?", f"<STACK_GLOBAL of {_describe(module)}, {_describe(name)}>", opcode, offset, resolved=False)
            self.run.imports.append(imp)
            self.violate("unresolved", f"{opcode} whose operands are computed at load time ({_describe(module)}, "
                         f"{_describe(name)})", offset, imp.full)
            return _Global(imp, False)
        mod_text, name_text = resolve_name(mod_text, name_text, self.run.protocol)
        imp = Import(mod_text, name_text, opcode, offset)
        self.run.imports.append(imp)
        self.imported.add(imp.full)
        allowed = self.allow.allowed(imp.full)
        if not allowed:
            self.violate("global", f"imports {imp.full}", offset, imp.full)
        return _Global(imp, allowed)

    def call(self, func: object, args: object, opcode: str, offset: int) -> _Made:
        if isinstance(func, _Global) and func.allowed:
            const = self._evaluate(func.imp.full, args)
            return _Made(func.imp.full, self.allow.buildable(func.imp.full), const)
        if isinstance(func, _Global):
            name = func.imp.full
            # the import itself is already a violation; the call is named for the message
            self.violate("call", f"{opcode} calls {name}", offset, name)
        else:
            name = _describe(func)
            self.violate("call", f"{opcode} calls {name}, not an allowed global", offset)
        return _Made(name, False)

    @staticmethod
    def _evaluate(full: str, args: object) -> object:
        if full != "_codecs.encode" or not isinstance(args, tuple) or not args:
            return None
        text = args[0]
        encoding = args[1] if len(args) > 1 else "utf-8"
        if (isinstance(text, str) and isinstance(encoding, str) and encoding.lower() in _PURE_CODECS
                and len(text) <= MAX_CONST_LEN and len(args) <= 3):
            try:
                return codecs.encode(text, encoding)
            except (UnicodeError, LookupError, TypeError):
                return None
        return None

    def run_ops(self) -> None:
        run, fh = self.run, self.fh
        ops = pickletools.genops(fh)
        while True:
            try:
                opcode, arg, pos = next(ops)
            except StopIteration:
                return
            except _Stop:
                raise
            except Exception as exc:  # noqa: BLE001 - genops raises many kinds on bad input
                raise _Stop(_short(exc)) from None
            run.opcodes += 1
            if pos is not None and pos - run.start > self.max_bytes:
                raise _Stop(f"pickle longer than {self.max_bytes} bytes: not read further")
            name = opcode.name
            handler = getattr(self, "op_" + name, None)
            if handler is None:
                raise _Stop(f"opcode {name} not handled")
            handler(arg, pos)
            if name == "STOP":
                run.end = fh.tell()
                return

    # -- opcodes: constants ----------------------------------------------------------------------
    def _push_arg(self, arg, pos):
        self.stack.append(arg)

    op_INT = op_BININT = op_BININT1 = op_BININT2 = op_LONG = op_LONG1 = op_LONG4 = _push_arg
    op_FLOAT = op_BINFLOAT = _push_arg
    op_STRING = op_BINSTRING = op_SHORT_BINSTRING = _push_arg
    op_UNICODE = op_BINUNICODE = op_SHORT_BINUNICODE = op_BINUNICODE8 = _push_arg
    op_BINBYTES = op_SHORT_BINBYTES = op_BINBYTES8 = _push_arg

    def op_BYTEARRAY8(self, arg, pos):
        self.stack.append(bytearray(arg))

    def op_NONE(self, arg, pos):
        self.stack.append(None)

    def op_NEWTRUE(self, arg, pos):
        self.stack.append(True)

    def op_NEWFALSE(self, arg, pos):
        self.stack.append(False)

    def op_NEXT_BUFFER(self, arg, pos):
        raise _Stop("out-of-band buffer (protocol 5) without buffers")

    def op_READONLY_BUFFER(self, arg, pos):
        self.top()

    # -- containers ------------------------------------------------------------------------------
    def op_MARK(self, arg, pos):
        self.metastack.append(self.stack)
        self.stack = []

    def op_EMPTY_TUPLE(self, arg, pos):
        self.stack.append(())

    def op_TUPLE(self, arg, pos):
        items = tuple(self.pop_mark())  # before self.stack.append: pop_mark swaps the list
        self.stack.append(items)

    def op_TUPLE1(self, arg, pos):
        self.stack.append((self.pop(),))

    def op_TUPLE2(self, arg, pos):
        b, a = self.pop(), self.pop()
        self.stack.append((a, b))

    def op_TUPLE3(self, arg, pos):
        c, b, a = self.pop(), self.pop(), self.pop()
        self.stack.append((a, b, c))

    def op_EMPTY_LIST(self, arg, pos):
        self.stack.append([])

    def op_LIST(self, arg, pos):
        items = list(self.pop_mark())
        self.stack.append(items)

    def op_EMPTY_DICT(self, arg, pos):
        self.stack.append(_Dict())

    def op_DICT(self, arg, pos):
        items = self.pop_mark()
        if len(items) % 2:
            raise _Stop("odd number of items for DICT")
        self.stack.append(_Dict())

    def op_EMPTY_SET(self, arg, pos):
        self.stack.append(_Set())

    def op_FROZENSET(self, arg, pos):
        self.pop_mark()
        self.stack.append(_Set())

    def op_ADDITEMS(self, arg, pos):
        self.pop_mark()
        if not isinstance(self.top(), _Set):
            self.violate("append", f"ADDITEMS on {_describe(self.top())}", pos)

    def _dict_target(self, opcode: str, pos: int) -> None:
        target = self.top()
        ok = isinstance(target, _Dict) or (isinstance(target, _Made) and target.maker in
                                            ("collections.OrderedDict", "collections.Counter"))
        if not ok:
            self.violate("setitem", f"{opcode} on {_describe(target)}", pos)

    def op_SETITEM(self, arg, pos):
        self.pop(), self.pop()
        self._dict_target("SETITEM", pos)

    def op_SETITEMS(self, arg, pos):
        items = self.pop_mark()
        if len(items) % 2:
            raise _Stop("odd number of items for SETITEMS")
        self._dict_target("SETITEMS", pos)

    def op_APPEND(self, arg, pos):
        item = self.pop()
        target = self.top()
        if isinstance(target, list):
            target.append(item)
        else:
            self.violate("append", f"APPEND on {_describe(target)}", pos)

    def op_APPENDS(self, arg, pos):
        items = self.pop_mark()
        target = self.top()
        if isinstance(target, list):
            target.extend(items)
        else:
            self.violate("append", f"APPENDS on {_describe(target)}", pos)

    # -- stack and memo --------------------------------------------------------------------------
    def op_POP(self, arg, pos):
        if self.stack:
            self.stack.pop()
        else:
            self.pop_mark()

    def op_POP_MARK(self, arg, pos):
        self.pop_mark()

    def op_DUP(self, arg, pos):
        self.stack.append(self.top())

    def _put(self, arg, pos):
        if arg is None or arg < 0:
            raise _Stop("negative PUT argument")
        self.memo[arg] = self.top()

    op_PUT = op_BINPUT = op_LONG_BINPUT = _put

    def op_MEMOIZE(self, arg, pos):
        self.memo[len(self.memo)] = self.top()

    def _get(self, arg, pos):
        if arg not in self.memo:
            raise _Stop(f"memo key {arg!r} missing")
        self.stack.append(self.memo[arg])

    op_GET = op_BINGET = op_LONG_BINGET = _get

    # -- the risky ones --------------------------------------------------------------------------
    def _raw_global_pair(self, pos: int) -> tuple[str, str]:
        """GLOBAL/INST operands as the unpickler reads them: two lines, UTF-8, no escapes."""
        here = self.fh.tell()
        try:
            self.fh.seek(pos + 1)
            module = self.fh.readline()
            name = self.fh.readline()
        finally:
            self.fh.seek(here)
        try:
            return module[:-1].decode("utf-8"), name[:-1].decode("utf-8")
        except UnicodeDecodeError:
            raise _Stop("GLOBAL operands are not UTF-8") from None

    def op_GLOBAL(self, arg, pos):
        module, name = self._raw_global_pair(pos)
        self.stack.append(self.import_global(module, name, "GLOBAL", pos))

    def op_STACK_GLOBAL(self, arg, pos):
        name, module = self.pop(), self.pop()
        self.stack.append(self.import_global(module, name, "STACK_GLOBAL", pos))

    def op_INST(self, arg, pos):
        module, name = self._raw_global_pair(pos)
        args = tuple(self.pop_mark())
        cls = self.import_global(module, name, "INST", pos)
        self.stack.append(self.call(cls, args, "INST", pos))

    def op_OBJ(self, arg, pos):
        items = self.pop_mark()
        if not items:
            raise _Stop("OBJ without a class")
        self.stack.append(self.call(items[0], tuple(items[1:]), "OBJ", pos))

    def _ext(self, arg, pos, opcode):
        imp = Import("?", f"<extension code {arg}>", opcode, pos, resolved=False)
        self.run.imports.append(imp)
        self.violate("unresolved", f"{opcode} {arg}: a global looked up in copyreg's extension registry at load time",
                     pos, imp.full)
        self.stack.append(_Global(imp, False))

    def op_EXT1(self, arg, pos):
        self._ext(arg, pos, "EXT1")

    def op_EXT2(self, arg, pos):
        self._ext(arg, pos, "EXT2")

    def op_EXT4(self, arg, pos):
        self._ext(arg, pos, "EXT4")

    def op_REDUCE(self, arg, pos):
        args = self.pop()
        func = self.pop()
        self.stack.append(self.call(func, args, "REDUCE", pos))

    def op_NEWOBJ(self, arg, pos):
        args = self.pop()
        cls = self.pop()
        self.stack.append(self.call(cls, args, "NEWOBJ", pos))

    def op_NEWOBJ_EX(self, arg, pos):
        self.pop()
        args = self.pop()
        cls = self.pop()
        self.stack.append(self.call(cls, args, "NEWOBJ_EX", pos))

    def op_BUILD(self, arg, pos):
        self.pop()
        inst = self.top()
        if not (isinstance(inst, _Made) and inst.buildable):
            maker = inst.maker if isinstance(inst, _Made) and inst.maker in self.imported else None
            self.violate("build", f"BUILD (__setstate__) on {_describe(inst)}", pos, maker)

    def _persistent(self, pid, pos, opcode):
        storage = (isinstance(pid, tuple) and pid and isinstance(pid[0], (str, bytes))
                   and (pid[0] if isinstance(pid[0], str) else pid[0].decode("latin-1")) == "storage")
        if not storage:
            self.violate("persistent_id", f"{opcode} {_describe(pid)}: only torch storages are allowed", pos)
        self.stack.append(_Persistent())

    def op_PERSID(self, arg, pos):
        self._persistent(arg, pos, "PERSID")

    def op_BINPERSID(self, arg, pos):
        self._persistent(self.pop(), pos, "BINPERSID")

    # -- framing ---------------------------------------------------------------------------------
    def op_PROTO(self, arg, pos):
        if not 0 <= arg <= 5:
            raise _Stop(f"unsupported pickle protocol: {arg}")
        self.run.protocol = arg

    def op_FRAME(self, arg, pos):
        pass  # the C unpickler only checks that the bytes exist, then reads on as if unframed

    def op_STOP(self, arg, pos):
        value = self.pop()
        if isinstance(value, (int, float, str, bytes, bool)) or value is None:
            self.run.value = value
        elif isinstance(value, _Made):
            self.run.value = value


def _short(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def simulate(fh, allow: AllowList, max_bytes: int) -> PickleRun:
    """Replay one pickle starting at fh's position. fh: a seekable binary file (position ends
    just after STOP when the pickle is complete)."""
    run = PickleRun(start=fh.tell())
    machine = _Machine(fh, allow, run, max_bytes)
    try:
        machine.run_ops()
    except _Stop as stop:
        run.error = str(stop)
    except RecursionError:
        run.error = "nested too deeply"
    return run
