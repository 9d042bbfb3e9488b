"""Scan pickle files for the globals they would import, without ever unpickling them.

pickletools.genops walks the opcodes; GLOBAL/INST carry "module name" inline, STACK_GLOBAL takes
the two strings pushed before it (directly or through the memo). Torch checkpoints are either a
zip archive holding */data.pkl or the legacy format (several pickles followed by raw storage).
"""

from __future__ import annotations

import io
import pickletools
import zipfile
from dataclasses import dataclass, field

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
MAX_PICKLE_BYTES = 256 * 1024 * 1024  # a data.pkl is small; storages live outside it

# What torch.save writes for a state dict (and what torch.load(weights_only=True) allows).
SAFE_GLOBALS = {
    "collections.OrderedDict", "builtins.set", "builtins.frozenset", "builtins.slice",
    "builtins.complex", "builtins.bytearray", "_codecs.encode",
    "torch._utils._rebuild_tensor", "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor_v3",
    "torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state",
    "torch._utils._rebuild_sparse_tensor", "torch._utils._rebuild_meta_tensor_no_storage",
    "torch._utils._rebuild_wrapper_subclass", "torch._utils._rebuild_device_tensor_from_numpy",
    "torch._utils._rebuild_qtensor", "torch.Size", "torch.device", "torch.serialization._get_layout",
    "torch._tensor._rebuild_from_type_v2", "torch.storage.UntypedStorage",
}
SAFE_MODULE_PREFIXES = ("torch.",)  # torch.FloatStorage, torch.bfloat16, torch.float32 ...
SAFE_TORCH_NAMES_SUFFIX = ("Storage",)
TORCH_DTYPE_NAMES = {"float32", "float16", "bfloat16", "float64", "int8", "uint8", "int16", "int32",
                     "int64", "bool", "float8_e4m3fn", "float8_e5m2", "complex64", "qint8", "quint8"}

DANGEROUS_MODULES = ("os", "posix", "nt", "subprocess", "sys", "shutil", "socket", "importlib",
                     "runpy", "pickle", "_pickle", "marshal", "ctypes", "pty", "webbrowser", "code",
                     "commands", "multiprocessing", "urllib", "requests", "http", "ftplib", "asyncio",
                     "signal", "tempfile", "io", "pathlib", "zipimport")
DANGEROUS_BUILTINS = {"eval", "exec", "compile", "open", "__import__", "getattr", "setattr", "delattr",
                      "globals", "locals", "vars", "input", "breakpoint", "memoryview", "type", "object",
                      "super", "classmethod", "staticmethod", "property", "apply", "execfile", "reload"}
DANGEROUS_TORCH = ("torch.load", "torch.storage._load_from_bytes", "torch.hub", "torch.jit",
                   "torch.ops", "torch._C", "torch.serialization.load", "torch.utils.cpp_extension",
                   "torch._dynamo", "torch.package", "torch.fx")


@dataclass
class PickleScan:
    globals_seen: list[str] = field(default_factory=list)
    dangerous: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    error: str | None = None  # opcodes could not be read


def classify(name: str) -> str:
    """'safe', 'dangerous' or 'unknown' for a 'module.attr' global name."""
    module, _, attr = name.rpartition(".")
    if name in SAFE_GLOBALS:
        return "safe"
    if name.startswith(DANGEROUS_TORCH):
        return "dangerous"
    top = module.split(".")[0]
    if top in DANGEROUS_MODULES or top in {"__builtin__", "builtins"} and attr in DANGEROUS_BUILTINS:
        return "dangerous"
    if module == "torch" and (attr.endswith(SAFE_TORCH_NAMES_SUFFIX) or attr in TORCH_DTYPE_NAMES):
        return "safe"
    if module in {"__builtin__", "builtins"}:
        return "unknown"
    return "unknown"


def globals_in_pickle(data: bytes, max_pickles: int = 1) -> tuple[list[str], str | None]:
    """Globals imported by the first `max_pickles` pickles in `data`; (names, error or None)."""
    stream = io.BytesIO(data)
    names: list[str] = []
    for index in range(max_pickles):
        if stream.tell() >= len(data):
            break
        strings: list[object] = []
        memo: dict[int, object] = {}
        last: object = None
        try:
            for opcode, arg, _pos in pickletools.genops(stream):
                op = opcode.name
                if op in ("GLOBAL", "INST"):
                    module, _, attr = str(arg).partition(" ")
                    names.append(f"{module}.{attr}")
                    last = None
                elif op == "STACK_GLOBAL":
                    if len(strings) >= 2 and all(isinstance(s, str) for s in strings[-2:]):
                        names.append(f"{strings[-2]}.{strings[-1]}")
                    else:
                        names.append("<unresolved STACK_GLOBAL>")
                    last = None
                elif op in ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING",
                            "BINSTRING", "STRING"):
                    last = arg
                    strings.append(arg)
                elif op == "MEMOIZE":
                    memo[len(memo)] = last
                elif op in ("BINPUT", "LONG_BINPUT", "PUT"):
                    memo[int(arg)] = last
                elif op in ("BINGET", "LONG_BINGET", "GET"):
                    last = memo.get(int(arg))
                    strings.append(last)
                else:
                    last = None
        except Exception as exc:  # noqa: BLE001 - any parse failure is reported, never raised
            if index == 0:
                return names, f"{type(exc).__name__}: {exc}"
            break  # legacy format: raw storage bytes follow the pickles
    return names, None


def scan_pickle_file(fh, size: int) -> PickleScan:
    """Scan an open binary file (a torch zip checkpoint or a plain/legacy pickle)."""
    head = fh.read(4)
    fh.seek(0)
    result = PickleScan()
    if head.startswith(b"PK"):
        try:
            archive = zipfile.ZipFile(fh)
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            result.error = f"damaged zip archive: {exc}"
            return result
        members = [i for i in archive.infolist() if i.filename.endswith(".pkl")]
        if not members:
            result.error = "zip archive without a .pkl member"
            return result
        for info in members:
            if info.file_size > MAX_PICKLE_BYTES:
                result.error = f"{info.filename} is {info.file_size} bytes, too large to scan"
                return result
            try:
                data = archive.read(info)
            except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError) as exc:
                result.error = f"cannot read {info.filename}: {exc}"
                return result
            names, error = globals_in_pickle(data, max_pickles=1)
            result.globals_seen += names
            result.error = result.error or error
    else:
        data = fh.read(min(size, MAX_PICKLE_BYTES))
        names, error = globals_in_pickle(data, max_pickles=5)
        result.globals_seen = names
        result.error = error
    for name in dict.fromkeys(result.globals_seen):
        kind = "dangerous" if name.startswith("<unresolved") else classify(name)
        if kind == "dangerous":
            result.dangerous.append(name)
        elif kind == "unknown":
            result.unknown.append(name)
    return result
