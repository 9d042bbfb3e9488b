"""Pickle files are scanned, never unpickled: dangerous globals are named, torch checkpoints pass."""

from __future__ import annotations

import io
import os
import pickle
import zipfile

import pytest
import torch

from harness.modeldir.pickle_scan import classify, globals_in_pickle, scan_pickle_file


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _scan(path):
    with open(path, "rb") as fh:
        return scan_pickle_file(fh, path.stat().st_size)


def test_torch_state_dicts_are_clean(tmp_path):
    state = {"w": torch.ones(2, 3, dtype=torch.bfloat16), "b": torch.zeros(3)}
    zipped, legacy = tmp_path / "zip.bin", tmp_path / "legacy.bin"
    torch.save(state, zipped)
    torch.save(state, legacy, _use_new_zipfile_serialization=False)
    for path in (zipped, legacy):
        scan = _scan(path)
        assert scan.error is None and scan.dangerous == [] and scan.unknown == [], (path, scan)
        assert any("_rebuild_tensor" in g for g in scan.globals_seen)


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_os_system_payload_named_and_never_run(tmp_path, protocol):
    marker = tmp_path / "pwned"
    path = tmp_path / "pytorch_model.bin"
    path.write_bytes(pickle.dumps({"w": _Payload(marker)}, protocol=protocol))
    scan = _scan(path)
    assert any(name.endswith(".system") and name.split(".")[0] in ("os", "posix") for name in scan.dangerous), scan
    assert not marker.exists()


def test_payload_inside_a_torch_zip_checkpoint(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "model.pt"
    torch.save({"w": torch.ones(2), "x": _Payload(marker)}, path)
    scan = _scan(path)
    assert scan.dangerous and not marker.exists()


def test_stack_global_through_the_memo():
    # protocol 4 pushes module and name as strings, memoizes them, then STACK_GLOBAL
    data = pickle.dumps(eval, protocol=4)
    names, error = globals_in_pickle(data)
    assert error is None and names == ["builtins.eval"]
    assert classify("builtins.eval") == "dangerous"
    assert classify("subprocess.Popen") == "dangerous"
    assert classify("torch._utils._rebuild_tensor_v2") == "safe"
    assert classify("torch.BFloat16Storage") == "safe"
    assert classify("collections.Counter") == "unknown"


def test_garbage_and_bad_zip_are_unreadable(tmp_path):
    garbage = tmp_path / "pytorch_model.bin"
    garbage.write_bytes(b"\x93NUMPY not a pickle at all \xff\xfe")
    assert _scan(garbage).error
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("archive/readme.txt", "no pickle here")
    garbage.write_bytes(buf.getvalue())
    assert "without a .pkl" in _scan(garbage).error
