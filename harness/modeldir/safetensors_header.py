"""Reading and validating a safetensors header from the first bytes of a file.

Layout: 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape,
data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the data block. A file is whole
only if its size is exactly 8 + N + the last end offset. Only 8 + N bytes are ever read here.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from math import prod

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors library refuses larger headers

# dtype -> bits per element (safetensors 0.4 - 0.8 names)
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}
FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}

LFS_PREFIX = b"version https://git-lfs"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # relative to the data block
    end: int

    @property
    def numel(self) -> int:
        return prod(self.shape)


@dataclass
class SafetensorsHeader:
    header_len: int
    file_size: int
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def data_start(self) -> int:
        return 8 + self.header_len


class HeaderProblem(Exception):
    """A file that is not a whole, well-formed safetensors file; `code` is a finding code."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def sniff_non_safetensors(head: bytes) -> HeaderProblem | None:
    """Recognise what people get instead of weights: an LFS pointer or an HTML page."""
    if head.startswith(LFS_PREFIX):
        return HeaderProblem("safetensors.lfs_pointer",
                             "a git-lfs pointer file, not the weights: run `git lfs pull` in the clone, or download again")
    stripped = head.lstrip()[:64].lower()
    if stripped.startswith((b"<!doctype html", b"<html", b"<?xml", b"<head", b"<body")):
        return HeaderProblem("safetensors.html_page",
                             "an HTML page (a login, error or redirect page saved by a failed download): download the file again")
    return None


def read_header(fh, file_size: int) -> SafetensorsHeader:
    """Parse and validate the header from an open binary file; raises HeaderProblem."""
    head = fh.read(8)
    if len(head) < 8:
        sniffed = sniff_non_safetensors(head)
        if sniffed:
            raise sniffed
        raise HeaderProblem("safetensors.truncated", f"only {len(head)} bytes: the file was cut short; copy or download it again")
    (header_len,) = struct.unpack("<Q", head)
    if header_len > MAX_HEADER_BYTES:
        more = fh.read(56)
        sniffed = sniff_non_safetensors(head + more)
        if sniffed:
            raise sniffed
        raise HeaderProblem("safetensors.header_too_large",
                            f"header length {header_len} bytes is over the 100 MB limit: not a safetensors file")
    if 8 + header_len > file_size:
        raise HeaderProblem("safetensors.truncated",
                            f"the header alone needs {8 + header_len} bytes but the file has {file_size}: the file was cut short; copy it again")
    raw = fh.read(header_len)
    sniffed = sniff_non_safetensors(head + raw[:56])
    if sniffed:
        raise sniffed
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HeaderProblem("safetensors.header_invalid", f"header is not JSON ({type(exc).__name__}): the file is damaged; save it again") from None
    if not isinstance(header, dict):
        raise HeaderProblem("safetensors.header_invalid", "header is not a JSON object: the file is damaged; save it again")

    parsed = SafetensorsHeader(header_len=header_len, file_size=file_size)
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise HeaderProblem("safetensors.header_invalid", "__metadata__ is not an object")
    parsed.metadata = {str(k): str(v) for k, v in metadata.items()}
    for name, info in header.items():
        parsed.tensors[name] = _tensor_info(name, info)
    _check_layout(parsed)
    return parsed


def _tensor_info(name: str, info) -> TensorInfo:
    if not isinstance(info, dict):
        raise HeaderProblem("safetensors.header_invalid", f"entry {name!r} is not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in DTYPE_BITS:
        raise HeaderProblem("safetensors.unknown_dtype", f"tensor {name!r} has unknown dtype {dtype!r}: re-save with a current safetensors")
    if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise HeaderProblem("safetensors.header_invalid", f"tensor {name!r} has an invalid shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) and o >= 0 for o in offsets)):
        raise HeaderProblem("safetensors.header_invalid", f"tensor {name!r} has invalid data_offsets {offsets!r}")
    begin, end = offsets
    bits = prod(shape) * DTYPE_BITS[dtype]
    if end < begin or bits % 8 or end - begin != bits // 8:
        raise HeaderProblem("safetensors.bad_offsets",
                            f"tensor {name!r}: offsets {begin}..{end} do not hold {dtype} {shape}: the file is damaged; save it again")
    return TensorInfo(name, dtype, tuple(shape), begin, end)


def _check_layout(parsed: SafetensorsHeader) -> None:
    position = 0
    for info in sorted(parsed.tensors.values(), key=lambda t: (t.begin, t.end)):
        if info.begin != position:
            what = "overlaps the previous tensor" if info.begin < position else f"leaves a gap of {info.begin - position} bytes"
            raise HeaderProblem("safetensors.bad_offsets", f"tensor {info.name!r} {what}: the file is damaged; save it again")
        position = info.end
    expected = parsed.data_start + position
    if parsed.file_size < expected:
        raise HeaderProblem("safetensors.truncated",
                            f"{parsed.file_size} bytes but the header needs {expected} ({expected - parsed.file_size} missing): "
                            "the copy or download was interrupted; copy it again")
    if parsed.file_size > expected:
        raise HeaderProblem("safetensors.trailing_bytes",
                            f"{parsed.file_size - expected} bytes after the last tensor: the file was appended to or damaged; save it again")
