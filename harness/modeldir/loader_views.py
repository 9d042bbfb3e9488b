"""What each loader would read from one file, found with that loader's own reading code.

Runs inside the reading child (harness.modeldir.read_child): it may parse hostile files with
torch, numpy, joblib, safetensors and gguf, so the child bounds its memory and time.

- torch.load: the same order as torch.serialization.load: `_is_zipfile` (PK\\x03\\x04 at offset 0),
  then torch's own zip reader torch._C.PyTorchFileReader (its data.pkl and every .pkl record);
  otherwise tarfile as _legacy_load opens it; otherwise the legacy pickles read one after the
  other from the file object, magic number and protocol version checked as torch checks them.
  Each pickle is read by the real C unpickler (harness.modeldir.real_unpickle), globals inert;
  the verdict is torch.load(weights_only=True, map_location="meta") itself (storages never read).
- numpy.load: numpy's own header parser (numpy.lib.format.read_magic / _read_array_header); an
  object dtype (dtype.hasobject, however it is spelled) means np.load(allow_pickle=True) unpickles
  what follows. .npz members are read with zipfile, as numpy does.
- joblib.load: joblib's own decompressor choice and file objects; the stream is then read by
  the C and the Python unpickler (joblib's NumpyUnpickler is the Python one).
- a file claiming safetensors or GGUF is accepted only once safetensors' / gguf's parser read it.

Where two readers of the same bytes disagree (zipfile and torch's zip reader, the C unpickler
reading a file and reading a buffer, the C and the Python unpickler), or a reader fails half-way
after importing something, the file "cannot be verified".
"""

from __future__ import annotations

import io
import pickle
import tarfile
import warnings
import zipfile
from dataclasses import dataclass, field

from . import format_reads
from .real_unpickle import StreamRead, read_bytes, read_stream

TORCH_MAGIC = 0x1950A86A20F9469CFC6C
TORCH_PROTOCOL = 1001
MAX_RECORD_BYTES = 256 * 1024 * 1024  # a .pkl record or decompressed stream larger than this is not read
ZIP_MAGIC = b"PK\x03\x04"  # torch.serialization._is_zipfile: the local header magic at offset 0
COMPRESSED_MAGIC = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ", b"\x5d\x00\x00", b"\x78\x01", b"\x78\x5e", b"\x78\x9c",
                    b"\x78\xda", b"ZF")


@dataclass
class Stream:
    where: str  # "data.pkl (torch's zip reader)", "legacy pickle 4 of 5 (the data)" ...
    read: StreamRead
    loader: str  # "torch.load", "numpy.load", "joblib.load", "pickle.load"


@dataclass
class LoaderRead:
    rel: str
    formats: list[str] = field(default_factory=list)  # what loaders read it as ("torch zip", "npy" ...)
    streams: list[Stream] = field(default_factory=list)
    unverifiable: list[str] = field(default_factory=list)
    weights_only: str | None = None  # torch.load(weights_only=True)'s refusal, in torch's words
    torch_reads: bool = False  # torch.load would unpickle something from it
    safe_format: str | None = None  # "safetensors" / "gguf" / "npy": its own parser read it whole
    format_errors: list[tuple[str, str]] = field(default_factory=list)  # (code, message): its parser refuses it

    @property
    def globals(self) -> list[tuple[str, str, str]]:
        return [(m, n, s.where) for s in self.streams for m, n in s.read.globals]


def read_file(path: str, rel: str) -> LoaderRead:
    out = LoaderRead(rel)
    with open(path, "rb") as fh:
        head = fh.read(64)
        size = fh.seek(0, 2)
    out.format_errors = format_reads.judge(path, rel, head, size)
    _claims(path, head, size, out)
    _numpy(path, head, out)
    if head.startswith(COMPRESSED_MAGIC):
        _joblib(path, out)
    _torch(path, head, out)
    if out.torch_reads:
        out.weights_only = torch_weights_only_verdict(path, legacy="torch legacy" in out.formats)
    return out


# -- safe-format claims -------------------------------------------------------------------------------

def _claims(path: str, head: bytes, size: int, out: LoaderRead) -> None:
    if out.rel.endswith(".safetensors") or format_reads.looks_safetensors(head, size):
        # judged by safetensors' own parser in format_reads: its refusal is a format error
        if not any(code.startswith("safetensors.") for code, _ in out.format_errors):
            out.safe_format = "safetensors"
            out.formats.append("safetensors")
    elif head.startswith(b"GGUF"):
        try:
            from gguf import GGUFReader

            GGUFReader(path, "r")
            out.safe_format = "gguf"
            out.formats.append("gguf")
        except Exception as exc:  # noqa: BLE001 - gguf's own refusal is the finding
            out.unverifiable.append(f"it begins with GGUF but the gguf reader cannot read it ({_line(exc)})")


# -- numpy ---------------------------------------------------------------------------------------------

def _npy_header(fh):
    try:
        from numpy.lib import _format_impl as npformat  # numpy >= 2.0
    except ImportError:
        from numpy.lib import format as npformat

    version = npformat.read_magic(fh)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shape, fortran, dtype = npformat._read_array_header(fh, version, max_header_size=1 << 20)
    return dtype


def _npy_stream(fh, where: str, out: LoaderRead) -> None:
    try:
        dtype = _npy_header(fh)
    except Exception as exc:  # noqa: BLE001 - numpy's own refusal
        out.unverifiable.append(f"{where}: begins like a .npy array but numpy cannot read its header ({_line(exc)})")
        return
    if dtype.hasobject:
        out.streams.append(Stream(f"{where}: object array ({dtype}) that np.load(allow_pickle=True) unpickles",
                                  read_stream(fh), "numpy.load"))
    elif out.safe_format is None and where == "npy":
        out.safe_format = "npy"


def _numpy(path: str, head: bytes, out: LoaderRead) -> None:
    if head.startswith(b"\x93NUMPY"):
        out.formats.append("npy")
        with open(path, "rb") as fh:
            _npy_stream(fh, "npy", out)
    elif head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        try:
            archive = zipfile.ZipFile(path)
            members = [i for i in archive.infolist() if i.filename.endswith(".npy")]
        except Exception:  # noqa: BLE001 - np.load fails too; the torch/zip side reports it
            return
        for info in members[:4096]:
            try:
                with archive.open(info) as member:
                    if member.read(6) != b"\x93NUMPY":
                        continue
                    data = b"\x93NUMPY" + member.read(MAX_RECORD_BYTES)
            except Exception as exc:  # noqa: BLE001
                out.unverifiable.append(f"{info.filename}: numpy's zip reader cannot read it ({_line(exc)})")
                continue
            if "npz" not in out.formats:
                out.formats.append("npz")
            _npy_stream(io.BytesIO(data), info.filename, out)


# -- joblib --------------------------------------------------------------------------------------------

def _joblib(path: str, out: LoaderRead) -> None:
    try:
        from joblib.numpy_pickle import _validate_fileobject_and_memmap
        from joblib.numpy_pickle_utils import _detect_compressor
    except Exception:  # noqa: BLE001 - fail closed
        out.unverifiable.append("a compressed stream, and joblib is not installed to read it as joblib.load does")
        return
    with open(path, "rb") as fh:
        codec = _detect_compressor(fh)
        if codec == "gzip":
            fh = _gzip_members(fh)  # joblib's gzip reader loops forever on a second member; gzip.open reads it
        if codec == "compat":
            out.unverifiable.append("a joblib < 0.10 file (ZF): not read here; joblib.load would unpickle it")
            return
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if codec == "gzip":
                    data = fh.read(MAX_RECORD_BYTES + 1)
                else:
                    with _validate_fileobject_and_memmap(fh, path) as (stream, _):
                        data = stream.read(MAX_RECORD_BYTES + 1)
        except Exception as exc:  # noqa: BLE001 - not really a compressed stream: joblib fails too
            out.formats.append(f"{codec} (joblib cannot decompress it: {_line(exc)})")
            return
    if len(data) > MAX_RECORD_BYTES:
        out.unverifiable.append(f"decompresses to more than {MAX_RECORD_BYTES >> 20} MiB (a bomb?)")
        return
    out.formats.append(f"{codec}-compressed (joblib)")
    c_run, py_run = read_bytes(data), read_bytes(data, python=True)
    where = f"{codec}-compressed pickle"
    out.streams.append(Stream(where, c_run, "pickle.load"))
    out.streams.append(Stream(where + " (joblib's Python unpickler)", py_run, "joblib.load"))
    _disagree(c_run, py_run, where, out)


def _gzip_members(fh):
    import gzip

    fh.seek(0)
    return gzip.GzipFile(fileobj=fh, mode="rb")


def _disagree(a: StreamRead, b: StreamRead, where: str, out: LoaderRead) -> None:
    if (a.end, a.complete) != (b.end, b.complete) or a.globals != b.globals:
        out.unverifiable.append(
            f"{where}: the {a.reader} and the {b.reader} read it differently (end at {a.end} vs {b.end}, "
            f"{a.error or 'complete'} vs {b.error or 'complete'})")


# -- torch ---------------------------------------------------------------------------------------------

def _torch(path: str, head: bytes, out: LoaderRead) -> None:
    with open(path, "rb") as fh:
        if head.startswith(ZIP_MAGIC):  # torch's _is_zipfile compares these 4 bytes; torch is imported only here
            import torch
            from torch.serialization import _is_zipfile

            if _is_zipfile(fh):
                _torch_zip(path, fh, out, torch)
                return
        try:
            tarfile.open(fileobj=fh, mode="r:", format=tarfile.PAX_FORMAT).close()
            is_tar = True
        except tarfile.TarError:
            is_tar = False
        except Exception as exc:  # noqa: BLE001 - tarfile can raise other kinds on hostile headers
            out.unverifiable.append(f"tarfile fails on it ({_line(exc)}): torch.load's reading order is unknown")
            return
        fh.seek(0)
        if is_tar:
            _torch_tar(fh, out)
        else:
            _torch_legacy(path, fh, out)


def _torch_zip(path: str, fh, out: LoaderRead, torch) -> None:
    try:
        reader = torch._C.PyTorchFileReader(fh)
        records = list(reader.get_all_records())
    except Exception as exc:  # noqa: BLE001 - torch.load raises the same: nothing is unpickled
        if _out_of_memory(exc):
            raise MemoryError(_line(exc)) from None
        out.formats.append(f"zip torch cannot open ({_line(exc)})")
        _zip_only(path, out)
        return
    out.formats.append("torchscript zip" if "constants.pkl" in records else "torch zip")
    out.torch_reads = True
    pickles = [r for r in records if r.lower().endswith(".pkl")]
    torch_bytes: dict[str, bytes] = {}
    for record in pickles:
        try:
            size = reader.get_record_size(record) if hasattr(reader, "get_record_size") else 0
            if size > MAX_RECORD_BYTES:
                out.unverifiable.append(f"{record}: a pickle of {size} bytes, more than {MAX_RECORD_BYTES >> 20} MiB")
                continue
            torch_bytes[record] = bytes(reader.get_record(record))
        except Exception as exc:  # noqa: BLE001
            if _out_of_memory(exc):  # the read child's memory limit, which it reports as such
                raise MemoryError(_line(exc)) from None
            out.unverifiable.append(f"{record}: torch's zip reader fails on it ({_line(exc)})")
            continue
        run = read_bytes(torch_bytes[record])
        out.streams.append(Stream(f"{record} (torch's zip reader)", run, "torch.load"))
    _compare_zip_readers(path, records, torch_bytes, out)


def _zip_prefix(names: list[str]) -> str:
    first = names[0] if names else ""
    return first.split("/", 1)[0] + "/" if "/" in first else ""


def _compare_zip_readers(path: str, records: list[str], torch_bytes: dict[str, bytes], out: LoaderRead) -> None:
    """Python's zipfile (numpy, scanners, unzip-like tools) must see the same members and bytes."""
    try:
        archive = zipfile.ZipFile(path)
        infos = archive.infolist()
    except Exception as exc:  # noqa: BLE001
        out.unverifiable.append(f"torch's zip reader opens it but Python's zipfile does not ({_line(exc)})")
        return
    prefix = _zip_prefix([i.filename for i in infos])
    names = [i.filename[len(prefix):] if i.filename.startswith(prefix) else i.filename for i in infos]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        out.unverifiable.append(f"two members are named {prefix}{dup}: readers may take either")
    if sorted(set(names)) != sorted(set(records)):
        only = sorted(set(names) ^ set(records))[:3]
        out.unverifiable.append(f"torch's zip reader and Python's zipfile list different members ({', '.join(only)})")
    if any(i.header_offset < 0 for i in infos) or (infos and min(i.header_offset for i in infos) != 0):
        out.unverifiable.append("data before the first zip member: readers disagree on where members start")
    for record, data in torch_bytes.items():
        try:
            theirs = archive.read(prefix + record)
        except Exception as exc:  # noqa: BLE001
            out.unverifiable.append(f"{record}: torch's zip reader reads it, Python's zipfile refuses ({_line(exc)})")
            continue
        if theirs != data:
            out.unverifiable.append(f"{record}: torch's zip reader and Python's zipfile read different bytes")


def _zip_only(path: str, out: LoaderRead) -> None:
    """torch cannot open it; Python's zipfile readers may: their .pkl members still count."""
    try:
        archive = zipfile.ZipFile(path)
        infos = [i for i in archive.infolist() if i.filename.lower().endswith(".pkl")]
    except Exception:  # noqa: BLE001 - no reader opens it
        return
    for info in infos[:64]:
        try:
            data = archive.read(info)
        except Exception as exc:  # noqa: BLE001
            out.unverifiable.append(f"{info.filename}: Python's zipfile cannot read it ({_line(exc)})")
            continue
        out.streams.append(Stream(f"{info.filename} (Python's zipfile)", read_bytes(data), "pickle.load"))


def _torch_tar(fh, out: LoaderRead) -> None:
    out.formats.append("torch legacy tar")
    out.torch_reads = True
    with tarfile.open(fileobj=fh, mode="r:", format=tarfile.PAX_FORMAT) as tar:
        for name in ("storages", "tensors", "pickle"):
            try:
                member = tar.extractfile(name)
            except KeyError:
                continue
            except Exception as exc:  # noqa: BLE001
                out.unverifiable.append(f"tar member {name}: cannot be read ({_line(exc)})")
                continue
            if member is not None:
                out.streams.append(Stream(f"tar member {name}", read_stream(member), "torch.load"))


_LEGACY = ("the magic number", "the protocol version", "sys_info", "the data", "the storage keys")


def _legacy_chain(fh, python: bool = False) -> list[StreamRead]:
    """The pickles _legacy_load reads one after the other, stopping where torch stops."""
    runs: list[StreamRead] = []
    for index in range(5):
        run = read_stream(fh, python=python)
        runs.append(run)
        if not run.complete:
            break
        if index == 0 and run.value != TORCH_MAGIC and not run.globals:
            break  # "Invalid magic number": torch stops
        if index == 1 and run.value != TORCH_PROTOCOL and not run.globals:
            break
    return runs


def _ran_out(run: StreamRead) -> bool:
    text = (run.error or "").lower()
    return "truncated" in text or "ran out of input" in text or "eof" in text


def _head(path: str, n: int) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(n)


def _torch_legacy(path: str, fh, out: LoaderRead) -> None:
    # a probe over the first MiB first: most files stop the unpickler at their first byte; one that
    # runs out of bytes there is probed again over MAX_RECORD_BYTES (not for a verified safe format)
    probe = read_stream(io.BytesIO(_head(path, 1 << 20)))
    if not probe.complete and not probe.globals and not out.safe_format and _ran_out(probe):
        probe = read_stream(io.BytesIO(_head(path, MAX_RECORD_BYTES)))
    if probe.error == "ran out of memory" and not out.safe_format:
        out.unverifiable.append("the unpickler cannot allocate what its first opcode asks for within the limit "
                                "(a loader with more memory would read on)")
        return
    if not probe.globals and (not probe.complete or out.safe_format):
        return  # the unpickler stops before importing anything: no loader runs code from it
    runs = _legacy_chain(fh)  # the file object, as torch.load(path) reads it
    first = runs[0]
    layout = len(runs) > 1 or first.value == TORCH_MAGIC
    out.formats.append("torch legacy" if layout else "pickle")
    out.torch_reads = layout  # a plain pickle: torch.load stops at the magic number, after running it
    for index, run in enumerate(runs):
        where = f"legacy pickle {index + 1} of 5 ({_LEGACY[index]})" if layout else "pickle"
        out.streams.append(Stream(where, run, "torch.load"))
    data = _head(path, MAX_RECORD_BYTES)
    buffered = _legacy_chain(io.BytesIO(data))
    python_runs = _legacy_chain(io.BytesIO(data), python=True)
    for other, how in ((buffered, "from a buffer (torch.load(io.BytesIO(...)))"),
                       (python_runs, "by the Python unpickler")):
        if [(r.end, r.globals) for r in other] != [(r.end, r.globals) for r in runs]:
            ends = [r.end for r in runs], [r.end for r in other]
            out.unverifiable.append(f"read from the file and read {how}, its pickles end at different offsets "
                                    f"{ends[0]} vs {ends[1]} (a FRAME running past STOP?)")
            out.streams += [Stream(f"pickle {i + 1} read {how}", r, "torch.load") for i, r in enumerate(other)]
            break


def torch_weights_only_verdict(path: str, legacy: bool) -> str | None:
    """None when torch.load(weights_only=True) of the installed torch loads it, storages on the meta
    device and never read; else torch's own sentence. When torch's list alone refuses, the globals
    transformers' Trainer allows when it reloads its own checkpoints (rng_state.pth) are tried."""
    first = _weights_only_load(path, legacy, trainer=False)
    if first is None or "numpy" not in first:  # the Trainer's extra globals are numpy's
        return first
    return first if _weights_only_load(path, legacy, trainer=True) is not None else None


def _weights_only_load(path: str, legacy: bool, trainer: bool) -> str | None:
    import contextlib

    import torch

    contexts = contextlib.ExitStack()
    with contexts:
        if trainer:
            try:
                from transformers.trainer_pt_utils import safe_globals
            except Exception:  # noqa: BLE001 - no transformers: torch's list alone
                return "refused"
            contexts.enter_context(safe_globals())
        if legacy:  # legacy storages follow the pickles: a fake mode keeps them unallocated
            from torch._subclasses.fake_tensor import FakeTensorMode

            contexts.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        contexts.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        try:
            torch.load(path, weights_only=True, map_location="meta")
        except pickle.UnpicklingError as exc:  # the weights-only unpickler's refusal
            return _weights_only_sentence(exc)
        except Exception:  # noqa: BLE001 - a rebuild the meta device cannot do (quantized tensors)
            try:  # storages mapped from the file, not read (zip); legacy ones under the child's limit
                torch.load(path, weights_only=True, map_location="cpu", mmap=not legacy)
            except Exception as exc:  # noqa: BLE001 - torch's refusal, whatever its type
                return _weights_only_sentence(exc)
    return None


def _weights_only_sentence(exc: Exception) -> str:
    text = str(exc)
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1]
        if text.strip().startswith("Unsupported operand 149"):
            return ("Unsupported operand 149 (FRAME: pickle protocol 4 or 5, which torch's weights-only unpickler "
                    "does not read; torch.save's default protocol 2 loads)")
    elif "Cannot use ``weights_only=True``" in text:
        text = text.split(" In PyTorch", 1)[0].replace("``", "")
    return _line_text(text)


def _line_text(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    first = lines[0] if lines else "refused"
    return first if len(first) <= 200 else first[:197] + "..."


def _out_of_memory(exc: BaseException) -> bool:
    """torch's C++ readers report an allocation refused under the read child's limit as a
    RuntimeError with the C library's words, not a MemoryError."""
    text = str(exc)
    return isinstance(exc, MemoryError) or "Cannot allocate memory" in text or "std::bad_alloc" in text


def _line(exc: Exception) -> str:
    return f"{type(exc).__name__}: {_line_text(str(exc) or type(exc).__name__)}"
