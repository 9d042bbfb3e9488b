"""Find the pickles in a file by its content, and read each one the way its loader reads it.

- torch zip (starts with PK\\x03\\x04, torch's own test): torch reads `<archive>/data.pkl`, the
  archive being the first member's folder, matched case-insensitively as miniz does; every member
  whose name ends in .pkl in any case is read too (a decoy data.pkl beside archive/data.PKL).
  A `constants.pkl` makes it TorchScript (torch.load(weights_only=True) refuses, torch.jit.load
  runs its code). Storage members are never read.
- other zips (numpy .npz, anything else): members are sniffed by content (.npy headers, pickles).
- legacy tar (torch.load tries tarfile first): refused by weights_only; every member is sniffed.
- numpy .npy with an object dtype: the pickle after the header (np.load(allow_pickle=True)).
- joblib: zlib/gzip/bz2/xz/lzma-compressed pickles are decompressed (bounded), array payloads
  of NumpyArrayWrapper skipped as joblib's unpickler does.
- raw pickles: the pickle at offset 0; when its value is torch's legacy magic number, the five
  pickles torch.load reads (magic, protocol, sys_info, the data, storage keys); otherwise every
  further pickle that follows, as repeated pickle.load calls would read them.

Zip members are read from their local headers with our own bounded reader: the encrypted and
patched-data flags, a wrong CRC or a local name that differs from the central directory do not
hide a member (they are reported), and no member is decompressed past MAX_PICKLE_BYTES.
"""

from __future__ import annotations

import ast
import bz2
import io
import lzma
import struct
import tarfile
import zipfile
import zlib
from dataclasses import dataclass, field

from .pickle_vm import AllowList, PickleRun, simulate

MAX_PICKLE_BYTES = 256 * 1024 * 1024  # a data.pkl is small: storages live outside it
MAX_MEMBERS = 65536  # more zip/tar members than this: treated as a bomb, not read
MAX_TOTAL_BYTES = 1024 * 1024 * 1024  # decompressed bytes read from one file, all members together
MAX_CHAIN = 64  # consecutive pickles read from one stream
MAX_NPY_HEADER = 1 << 16
TORCH_MAGIC = 0x1950A86A20F9469CFC6C
TORCH_PROTOCOL = 1001
LEGACY_NAMES = ("magic number", "protocol version", "sys_info", "data", "storage keys")


@dataclass
class PickleSource:
    where: str  # "archive/data.pkl", "pickle 4 of 5 (legacy torch layout: the data)" ...
    run: PickleRun
    read_by_torch: bool = True  # torch.load would unpickle it (else another loader would)


@dataclass
class FileScan:
    kind: str | None = None  # None: no pickle in it; else "pickle", "torch zip", "torch legacy" ...
    pickles: list[PickleSource] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # the container is damaged, flagged or a bomb
    torch_refuses: str | None = None  # torch.load(weights_only=True) refuses the container itself
    unscanned: str | None = None  # an archive format we do not open


class _Budget:
    def __init__(self) -> None:
        self.left = MAX_TOTAL_BYTES

    def take(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise _Bomb(f"more than {MAX_TOTAL_BYTES >> 20} MiB to decompress")


class _Bomb(Exception):
    pass


def scan_file(fh, size: int, allow: AllowList) -> FileScan:
    """Sniff an open binary file and replay every pickle its loader would unpickle."""
    fh.seek(0)
    head = fh.read(512)
    fh.seek(0)
    scan = FileScan()
    budget = _Budget()
    if _is_safetensors(head, size) or head.startswith(b"GGUF"):
        return scan  # their headers are JSON / GGUF metadata: nothing a loader unpickles
    if head.startswith(b"PK\x03\x04") or (head.startswith(b"PK\x05\x06") and size <= 65557):
        _scan_zip(fh, size, allow, scan, budget)
    elif head.startswith(b"\x93NUMPY"):
        _scan_npy(fh, 0, "", allow, scan)
    elif head.startswith((b"7z\xbc\xaf\x27\x1c", b"Rar!\x1a\x07")):
        scan.kind = "archive"
        scan.unscanned = "a 7z or RAR archive: no model loader opens it, and it is not read here"
    elif _is_tar(fh, size):
        _scan_tar(fh, allow, scan, budget)
    else:
        compressed = _decompress_joblib(head, fh, budget)
        if compressed is not None:
            data, codec = compressed
            chain = _pickle_chain(io.BytesIO(data), len(data), allow, f"{codec}-compressed pickle (joblib)")
            if chain:
                scan.kind = "joblib"
                scan.pickles += chain
        else:
            chain = _pickle_chain(fh, size, allow, "", legacy=True)
            if chain:
                legacy = any("legacy torch layout" in p.where for p in chain)
                scan.kind = "torch legacy" if legacy else "pickle"
                scan.pickles += chain
    return scan


def _is_safetensors(head: bytes, size: int) -> bool:
    if len(head) < 9 or head[8:9] != b"{":
        return False
    return 8 + int.from_bytes(head[:8], "little") <= size


# -- raw pickle streams ----------------------------------------------------------------------------

def _looks_like_pickle(run: PickleRun, first_bytes: bytes) -> bool:
    """A stream is a pickle when it unpickles to the end, reaches an import on the way (a broken
    payload still ran), or starts with a PROTO opcode."""
    if run.complete or run.imports:
        return True
    return len(first_bytes) >= 2 and first_bytes[0] == 0x80 and first_bytes[1] <= 5


def _peek(fh, n: int) -> bytes:
    here = fh.tell()
    data = fh.read(n)
    fh.seek(here)
    return data


def _pickle_chain(fh, size: int, allow: AllowList, label: str, legacy: bool = False,
                  start: int = 0, limit: int = MAX_CHAIN) -> list[PickleSource]:
    """The pickle at `start` and those that follow it. With legacy=True, a first value equal to
    torch's magic number (or computed, followed by protocol 1001) is torch's legacy layout:
    exactly five pickles, then raw storage bytes that are never read."""
    fh.seek(start)
    first = simulate(fh, allow, MAX_PICKLE_BYTES)
    if not _looks_like_pickle(first, _peek_at(fh, start, 2)):
        return []
    runs = [first]
    layout = legacy and first.complete and first.value == TORCH_MAGIC
    while runs[-1].complete and len(runs) < (5 if layout else limit) and runs[-1].end < size:
        fh.seek(runs[-1].end)
        head = _peek(fh, 2)
        run = simulate(fh, allow, MAX_PICKLE_BYTES)
        if len(runs) == 1 and legacy and _computed(first.value) and run.complete and run.value == TORCH_PROTOCOL:
            layout = True  # the magic number was computed by a call (a bypass): torch reads on
        if not layout and not _looks_like_pickle(run, head):
            break  # trailing bytes that are not a pickle: no loader reads them as one
        runs.append(run)
        if layout and len(runs) == 2 and isinstance(run.value, int) and run.value != TORCH_PROTOCOL:
            break  # torch stops at a wrong protocol version
    if layout and len(runs) < 5 and runs[-1].complete:
        fh.seek(runs[-1].end)
        runs.append(simulate(fh, allow, MAX_PICKLE_BYTES))  # truncated: the error says where
    prefix = f"{label}: " if label else ""
    if layout:
        return [PickleSource(f"{prefix}pickle {i + 1} of 5 (legacy torch layout: {LEGACY_NAMES[i]})", run)
                for i, run in enumerate(runs)]
    if len(runs) == 1:
        return [PickleSource(label or "pickle", first)]
    return [PickleSource(f"{prefix}pickle {i + 1}" + (" (read by a repeated pickle.load)" if i else ""), run,
                         read_by_torch=i == 0) for i, run in enumerate(runs)]


def _peek_at(fh, offset: int, n: int) -> bytes:
    here = fh.tell()
    fh.seek(offset)
    data = fh.read(n)
    fh.seek(here)
    return data


def _computed(value: object) -> bool:
    return value is not None and not isinstance(value, (int, float, str, bytes, bool))


# -- numpy -----------------------------------------------------------------------------------------

def _scan_npy(fh, offset: int, label: str, allow: AllowList, scan: FileScan) -> None:
    fh.seek(offset)
    magic = fh.read(8)
    where = f"{label}: " if label else ""
    try:
        major = magic[6]
        if major == 1:
            (hlen,) = struct.unpack("<H", fh.read(2))
        else:
            (hlen,) = struct.unpack("<I", fh.read(4))
        if hlen > MAX_NPY_HEADER:
            raise ValueError(f"header of {hlen} bytes")
        header = fh.read(hlen).decode("utf-8" if major >= 3 else "latin-1")
        meta = ast.literal_eval(header)
        descr = meta["descr"]
    except Exception as exc:  # noqa: BLE001 - a damaged header is a problem, not a crash
        scan.kind = scan.kind or "npy"
        scan.problems.append(f"{where}numpy header unreadable ({type(exc).__name__}: {exc})")
        return
    scan.kind = scan.kind or "npy"
    if "O" not in repr(descr):
        return  # plain arrays hold no pickle
    chain = _pickle_chain(fh, 1 << 62, allow, f"{where}object array (np.load(allow_pickle=True) unpickles it)",
                          start=fh.tell(), limit=1)
    if not chain:
        run = simulate(_at(fh, fh.tell()), allow, MAX_PICKLE_BYTES)
        chain = [PickleSource(f"{where}object array", run)]
    for source in chain:
        source.read_by_torch = False
    scan.pickles += chain


def _at(fh, offset: int):
    fh.seek(offset)
    return fh


# -- tar -------------------------------------------------------------------------------------------

def _is_tar(fh, size: int) -> bool:
    if size < 512:
        return False
    fh.seek(0)
    try:
        with tarfile.open(fileobj=fh, mode="r:") as tar:
            tar.next()
        return True
    except Exception:  # noqa: BLE001 - tarfile raises several kinds on non-tar data
        return False
    finally:
        fh.seek(0)


def _scan_tar(fh, allow: AllowList, scan: FileScan, budget: _Budget) -> None:
    scan.kind = "torch legacy tar"
    scan.torch_refuses = "a legacy tar checkpoint: torch.load(weights_only=True) refuses the format"
    try:
        with tarfile.open(fileobj=fh, mode="r:") as tar:
            count = 0
            for member in tar:
                count += 1
                if count > MAX_MEMBERS:
                    scan.problems.append(f"more than {MAX_MEMBERS} tar members: not read further")
                    break
                if not member.isfile():
                    continue
                if member.size > MAX_PICKLE_BYTES:
                    continue  # raw storages
                budget.take(member.size)
                data = tar.extractfile(member).read(MAX_PICKLE_BYTES)
                scan.pickles += _pickle_chain(io.BytesIO(data), len(data), allow, f"tar member {member.name}")
    except _Bomb as exc:
        scan.problems.append(str(exc))
    except Exception as exc:  # noqa: BLE001 - a damaged tar is a problem, not a crash
        scan.problems.append(f"damaged tar archive ({type(exc).__name__}: {exc})")


# -- zip -------------------------------------------------------------------------------------------

_LOCAL = struct.Struct("<4s5H3I2H")  # signature, version, flags, method, time, date, crc, csize, usize, nlen, xlen


def _scan_zip(fh, size: int, allow: AllowList, scan: FileScan, budget: _Budget) -> None:
    scan.kind = "zip"
    try:
        archive = zipfile.ZipFile(fh)
        infos = archive.infolist()
    except Exception as exc:  # noqa: BLE001 - BadZipFile, OSError, ValueError, struct errors ...
        scan.problems.append(f"damaged zip archive ({type(exc).__name__}: {exc}); torch cannot open it either")
        scan.kind = "zip (damaged)"
        _walk_local_headers(fh, size, allow, scan, budget)
        return
    if len(infos) > MAX_MEMBERS:
        scan.problems.append(f"{len(infos)} zip members (more than {MAX_MEMBERS}): a zip bomb? not read")
        return
    if not infos:
        return
    first = infos[0].filename
    prefix = first.split("/", 1)[0] if "/" in first else None
    data_pkl = f"{prefix}/data.pkl".lower() if prefix else None
    lower_names = {i.filename.lower() for i in infos}
    torch_zip = data_pkl is not None and data_pkl in lower_names
    if torch_zip:
        scan.kind = "torch zip"
        if any(n.rsplit("/", 1)[-1] == "constants.pkl" for n in lower_names):
            scan.kind = "torchscript zip"
            scan.torch_refuses = ("a TorchScript archive (constants.pkl): torch.load(weights_only=True) refuses it and "
                                  "torch.jit.load runs its code")
    for info in infos:
        name_lower = info.filename.lower()
        if info.is_dir():
            continue
        is_pkl = name_lower.endswith(".pkl")
        if torch_zip and not is_pkl:
            continue  # storages and version records: never unpickled
        if info.flag_bits & 0x1:
            scan.problems.append(f"{info.filename}: the encrypted flag is set (torch refuses it; read as stored)")
        if info.flag_bits & 0x60:
            scan.problems.append(f"{info.filename}: patched-data or strong-encryption flag set (read as stored)")
        try:
            data = _read_member(fh, info, budget)
        except _Bomb as exc:
            scan.problems.append(f"{info.filename}: {exc}")
            return
        except Exception as exc:  # noqa: BLE001
            scan.problems.append(f"{info.filename}: cannot be read ({type(exc).__name__}: {exc})")
            continue
        if zlib.crc32(data) != info.CRC and len(data) == info.file_size:
            scan.problems.append(f"{info.filename}: CRC mismatch (corrupted or tampered)")
        read_by_torch = torch_zip and name_lower == data_pkl
        if data.startswith(b"\x93NUMPY"):
            _scan_npy(io.BytesIO(data), 0, info.filename, allow, scan)
            continue
        if is_pkl:
            run = simulate(io.BytesIO(data), allow, MAX_PICKLE_BYTES)
            scan.pickles.append(PickleSource(info.filename, run, read_by_torch=read_by_torch))
            continue
        chain = _pickle_chain(io.BytesIO(data), len(data), allow, info.filename)
        for source in chain:
            source.read_by_torch = False
        scan.pickles += chain
    if torch_zip is False and prefix is not None and any(n.endswith(".pkl") for n in lower_names) and scan.kind == "zip":
        scan.kind = "zip with pickles"


def _read_member(fh, info: zipfile.ZipInfo, budget: _Budget) -> bytes:
    """The member's bytes from its local header, bounded, whatever its flags say."""
    fh.seek(info.header_offset)
    header = fh.read(_LOCAL.size)
    if len(header) != _LOCAL.size or header[:4] != b"PK\x03\x04":
        raise ValueError("no local header where the central directory points")
    fields = _LOCAL.unpack(header)
    name_len, extra_len = fields[9], fields[10]
    fh.seek(info.header_offset + _LOCAL.size + name_len + extra_len)
    return _inflate(fh, info.compress_type, info.compress_size, budget)


def _inflate(fh, method: int, compressed_size: int, budget: _Budget) -> bytes:
    cap = MAX_PICKLE_BYTES
    if method == zipfile.ZIP_STORED:
        if compressed_size > cap:
            raise _Bomb(f"stored member of {compressed_size} bytes, more than {cap >> 20} MiB")
        budget.take(compressed_size)
        return fh.read(compressed_size)
    if method == zipfile.ZIP_DEFLATED:
        engine = zlib.decompressobj(-15)
    elif method == zipfile.ZIP_BZIP2:
        engine = bz2.BZ2Decompressor()
    elif method == zipfile.ZIP_LZMA:
        return _inflate_zip_lzma(fh, compressed_size, budget)
    else:
        raise ValueError(f"compression method {method} unsupported")
    return _bounded_decompress(engine, _chunks(fh, compressed_size), budget)


def _inflate_zip_lzma(fh, compressed_size: int, budget: _Budget) -> bytes:
    raw = fh.read(min(compressed_size, MAX_PICKLE_BYTES))
    psize = struct.unpack("<H", raw[2:4])[0]
    props = lzma._decode_filter_properties(lzma.FILTER_LZMA1, raw[4:4 + psize])
    engine = lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=[props])
    return _bounded_decompress(engine, iter([raw[4 + psize:]]), budget)


def _chunks(fh, total: int, size: int = 1 << 20):
    left = total
    while left > 0:
        chunk = fh.read(min(size, left))
        if not chunk:
            return
        left -= len(chunk)
        yield chunk


_ZLIB = type(zlib.decompressobj())


def _bounded_decompress(engine, chunks, budget: _Budget) -> bytes:
    out = bytearray()

    def add(piece: bytes) -> None:
        out.extend(piece)
        budget.take(len(piece))
        if len(out) > MAX_PICKLE_BYTES:
            raise _Bomb(f"decompresses to more than {MAX_PICKLE_BYTES >> 20} MiB (a zip bomb?)")

    def room() -> int:
        return MAX_PICKLE_BYTES - len(out) + 1

    for chunk in chunks:
        if isinstance(engine, _ZLIB):
            data = chunk
            while data and not engine.eof:
                add(engine.decompress(data, room()))
                data = engine.unconsumed_tail
        else:
            add(engine.decompress(chunk, max_length=room()))
            while not engine.eof and not engine.needs_input:
                piece = engine.decompress(b"", max_length=room())
                if not piece:
                    break
                add(piece)
        if engine.eof:
            break
    return bytes(out)


def _walk_local_headers(fh, size: int, allow: AllowList, scan: FileScan, budget: _Budget) -> None:
    """No usable central directory: walk the local headers from the start, as a lenient reader would."""
    offset = 0
    for _ in range(MAX_MEMBERS):
        fh.seek(offset)
        header = fh.read(_LOCAL.size)
        if len(header) != _LOCAL.size or header[:4] != b"PK\x03\x04":
            return
        fields = _LOCAL.unpack(header)
        flags, method, csize, name_len, extra_len = fields[2], fields[3], fields[7], fields[9], fields[10]
        name = fh.read(name_len).decode("utf-8", "replace")
        data_at = offset + _LOCAL.size + name_len + extra_len
        if flags & 0x08 or csize == 0:
            return  # sizes in a data descriptor: cannot skip safely without the directory
        fh.seek(data_at)
        try:
            data = _inflate(fh, method, csize, budget)
        except _Bomb as exc:
            scan.problems.append(f"{name}: {exc}")
            return
        except Exception:  # noqa: BLE001
            data = b""
        if name.lower().endswith(".pkl"):
            scan.pickles.append(PickleSource(name, simulate(io.BytesIO(data), allow, MAX_PICKLE_BYTES)))
        elif data:
            scan.pickles += _pickle_chain(io.BytesIO(data), len(data), allow, name)
        offset = data_at + csize


# -- joblib ----------------------------------------------------------------------------------------

_COMPRESSORS = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bz2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x5d\x00\x00", "lzma"),
    (b"\x78\x01", "zlib"), (b"\x78\x5e", "zlib"), (b"\x78\x9c", "zlib"), (b"\x78\xda", "zlib"),
)


def _decompress_joblib(head: bytes, fh, budget: _Budget) -> tuple[bytes, str] | None:
    """joblib.dump(compress=...) writes one compressed stream; None when the file is not one."""
    codec = next((name for magic, name in _COMPRESSORS if head.startswith(magic)), None)
    if codec is None:
        return None
    if codec == "gzip":
        engine = zlib.decompressobj(16 + zlib.MAX_WBITS)
    elif codec == "zlib":
        engine = zlib.decompressobj()
    elif codec == "bz2":
        engine = bz2.BZ2Decompressor()
    elif codec == "xz":
        engine = lzma.LZMADecompressor(lzma.FORMAT_XZ)
    else:
        engine = lzma.LZMADecompressor(lzma.FORMAT_ALONE)
    fh.seek(0)
    try:
        data = _bounded_decompress(engine, _chunks(fh, 1 << 62), budget)
    except _Bomb:
        return None
    except Exception:  # noqa: BLE001 - not really a compressed stream
        return None
    if not data.startswith(b"\x80"):
        return None
    return data, codec
