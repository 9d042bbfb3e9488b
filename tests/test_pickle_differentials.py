"""Parser differentials (issue 23): each generated attack really runs its payload under the loader a
user reaches for, and check-dir --allow-pickle refuses every one; benign files users really have
get no safety error; hostile bytes never crash or hang check-dir --json."""

from __future__ import annotations

import io
import json
import pickle
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.modeldir import check_dir

sys.path.insert(0, str(Path(__file__).parent))
import pickle_differentials  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def attacks(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("differentials")
    return pickle_differentials.build_all(root / "dirs", root / "markers")


def _safety_errors(report) -> list:
    return [f for f in report.findings if f.severity == "error" and f.code.startswith(("safety.", "file."))]


def test_every_attack_really_runs_under_its_loader(attacks):
    ran = pickle_differentials.prove_all(list(attacks.values()))
    assert [name for name, yes in ran.items() if not yes] == []
    assert len(attacks) >= 21 and len(pickle_differentials.CLASSES) == 7


@pytest.mark.parametrize("name", sorted(pickle_differentials.FIXTURES))
def test_check_dir_refuses_every_attack(attacks, name):
    fixture = attacks[name]
    report = check_dir(fixture.path.parent, allow_pickle=True)
    errors = _safety_errors(report)
    assert errors, [(f.code, f.message) for f in report.findings]


def test_check_dir_never_runs_a_payload(attacks):
    for fixture in attacks.values():
        if fixture.marker.exists():
            fixture.marker.unlink()
    for fixture in attacks.values():
        check_dir(fixture.path.parent, allow_pickle=True)
    assert [f.name for f in attacks.values() if f.marker.exists()] == []


def test_loaders_that_disagree_are_named(attacks):
    messages = {name: " ".join(f.message for f in check_dir(f.path.parent, allow_pickle=True).findings
                               if f.code == "safety.unverifiable") for name, f in attacks.items()}
    assert "different offsets" in messages["frame_past_stop_magic"]
    assert "Python's zipfile refuses" in messages["zip_local_name_differs"]
    assert "two members are named" in messages["zip_duplicate_data_pkl"]
    # since issue 43 the safetensors library's refusal of a file shaped like safetensors is its own finding
    shaped = attacks["safetensors_magic_pickle"]
    assert "safetensors.header_invalid" in {f.code for f in check_dir(shaped.path.parent, allow_pickle=True).errors}
    assert "gguf reader cannot read it" in messages["gguf_magic_pickle"]


# -- benign files users really have ----------------------------------------------------------------

def _benign_extra(root: Path) -> Path:
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    adapter = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(8, 32),
               "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(32, 8)}
    torch.save(adapter, root / "adapter_model.bin")
    for protocol in (2, 4, 5):
        torch.save({"w": torch.ones(3)}, root / f"protocol{protocol}.pt", pickle_protocol=protocol)
    tensors = {"bf16": torch.ones(4, dtype=torch.bfloat16), "fp8": torch.zeros(4).to(torch.float8_e4m3fn),
               "complex": torch.ones(2, dtype=torch.complex64),
               "coo": torch.eye(3).to_sparse(), "csr": torch.eye(3).to_sparse_csr(),
               "qint8": torch.quantize_per_tensor(torch.ones(4), 0.1, 0, torch.qint8)}
    torch.save(tensors, root / "tensors.pt")
    np.save(root / "embeddings.npy", np.arange(12, dtype=np.float32).reshape(3, 4))
    np.savez(root / "arrays.npz", a=np.zeros(3), b=np.ones((2, 2), dtype=np.int64))
    np.savez_compressed(root / "compressed.npz", a=np.zeros(5))
    torch.save({"step": 1, "rng": torch.random.get_rng_state(), "py": random.getstate()}, root / "rng_state.pth")
    return root


def test_benign_user_files_get_no_safety_error(tmp_path):
    root = _benign_extra(tmp_path / "benign")
    report = check_dir(root, allow_pickle=True)
    errors = _safety_errors(report)
    assert errors == [], [(f.path, f.code, f.message) for f in errors]
    pickles = {f.path for f in report.findings if f.code == "safety.pickle_file"}
    assert {"adapter_model.bin", "protocol2.pt", "protocol4.pt", "tensors.pt", "rng_state.pth"} <= pickles
    # torch.save(pickle_protocol=4/5) writes FRAMEs torch's own weights-only unpickler refuses: a warning
    framed = {"protocol4.pt", "protocol5.pt"}
    for name in framed:
        with pytest.raises(pickle.UnpicklingError, match="Unsupported operand 149"):
            torch.load(root / name, weights_only=True)
    assert {f.path for f in report.findings if f.code == "safety.pickle_framed"} == framed


def test_a_framed_pickle_with_a_payload_stays_an_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    payload = pickle_differentials.payload_pickle(f"touch {tmp_path / 'pwned'}")
    framed = b"\x80\x04\x95" + len(payload[2:]).to_bytes(8, "little") + payload[2:]
    (tmp_path / "model.pt").write_bytes(framed)
    report = check_dir(tmp_path, allow_pickle=True)
    assert "safety.pickle_dangerous" in {f.code for f in _safety_errors(report)}
    assert "safety.pickle_framed" not in {f.code for f in report.findings}


# -- hostile bytes: JSON only, never a traceback ---------------------------------------------------

@pytest.fixture(scope="module")
def seed_checkpoint() -> bytes:
    buffer = io.BytesIO()
    torch.save({"w": torch.ones(4), "b": torch.zeros(2, dtype=torch.bfloat16)}, buffer)
    return buffer.getvalue()


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_checkpoints_never_crash_check_dir(tmp_path_factory, seed_checkpoint, data):
    seeds = [seed_checkpoint, pickle.dumps({"a": [1, 2.0, "x"]}, protocol=2),
             pickle.dumps({"a": 1}, protocol=0)]
    raw = bytearray(data.draw(st.sampled_from(seeds)))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        kind = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if kind == "flip":
            raw[at] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "cut":
            del raw[at:]
            if not raw:
                raw = bytearray(b"\x80")
        else:
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=16))
    directory = tmp_path_factory.mktemp("fuzz")
    (directory / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (directory / "pytorch_model.bin").write_bytes(bytes(raw))
    report = check_dir(directory, allow_pickle=True)  # raises on a bug: hypothesis shrinks it
    json.dumps(report.to_dict())


def test_check_dir_json_prints_only_json_on_an_attack(attacks):
    fixture = attacks["int_hex"]
    done = subprocess.run([sys.executable, "-m", "harness", "check-dir", "--json", "--allow-pickle",
                           str(fixture.path.parent)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    payload = json.loads(done.stdout)
    assert done.returncode == 1 and payload["ok"] is False
    assert "Traceback" not in done.stderr
