"""Pickles are found by content and judged by torch's weights-only rule, never unpickled.

Cross-checks use torch's own weights-only unpickler (torch's security boundary: it never calls a
global outside its allow-list), so no malicious file is ever really loaded.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.modeldir import check_dir
from harness.modeldir import pickle_sources
from harness.modeldir.pickle_scan import scan_pickle_file
from harness.modeldir.pickle_vm import resolve_name, simulate
from harness.modeldir.torch_rule import torch_allow_list

sys.path.insert(0, str(Path(__file__).parent))
import pickle_evasions  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _scan_bytes(data: bytes):
    return scan_pickle_file(io.BytesIO(data), len(data))


def _safety_errors(report) -> list:
    return [f for f in report.findings if f.severity == "error" and f.code.startswith(("safety.", "file."))]


def _weights_only_loads(path: Path) -> bool:
    try:
        torch.load(path, weights_only=True)
        return True
    except Exception:  # noqa: BLE001 - any refusal counts
        return False


# -- the simulated unpickler -----------------------------------------------------------------------

@pytest.mark.parametrize("protocol", range(6))
def test_payload_named_at_every_protocol_and_never_run(tmp_path, protocol):
    marker = tmp_path / "pwned"
    scan = _scan_bytes(pickle.dumps({"w": _Payload(marker)}, protocol=protocol))
    assert not scan.accepted
    assert any(d.startswith(("os.system", "posix.system")) for d in scan.dangerous), scan
    assert not marker.exists()


def test_stack_global_operands_come_from_the_stack_not_the_last_strings():
    run = simulate(io.BytesIO(pickle_evasions.decoys_popped()), torch_allow_list(), 1 << 20)
    assert [i.full for i in run.imports] == ["os.system"]
    run = simulate(io.BytesIO(pickle_evasions.decoys_through_memo()), torch_allow_list(), 1 << 20)
    assert [i.full for i in run.imports] == ["os.system"]
    run = simulate(io.BytesIO(pickle_evasions.computed_operands()), torch_allow_list(), 1 << 20)
    assert [i.full for i in run.imports] == ["_codecs.encode", "_codecs.encode", "os.system"]


def test_operands_nobody_can_know_statically_are_dangerous():
    # module name = the result of collections.OrderedDict(): not a constant, not a pure codec
    data = b"\x80\x04ccollections\nOrderedDict\n)R\x8c\x06system\x93)R."
    scan = _scan_bytes(data)
    assert scan.unresolved and not scan.accepted
    scan = _scan_bytes(b"\x80\x02\x82\x01)R.")  # EXT1: copyreg's extension registry
    assert scan.unresolved


def test_find_class_name_rules():
    assert resolve_name("cPickle", "loads", protocol=2) == ("pickle", "loads")
    assert resolve_name("urllib2", "urlopen", protocol=0) == ("urllib.request", "urlopen")
    assert resolve_name("__builtin__", "set", protocol=2) == ("builtins", "set")
    assert resolve_name("cPickle", "loads", protocol=4) == ("cPickle", "loads")  # no mapping from 3 on


def test_a_broken_pickle_still_reports_what_ran_before_the_break():
    # picklescan's "keyerror" exploit: os.system is called, then a missing memo key stops the load
    data = (b"\x80\x04cos\nsystem\nVecho pwned\n\x85R0" + b"\x8c\x02os\x94h\x03h\x00\x93K\x42.")
    scan = _scan_bytes(data)
    assert any(d.startswith("os.system") for d in scan.dangerous)


def test_allow_list_is_torchs_own():
    allow = torch_allow_list()
    from torch._weights_only_unpickler import _get_allowed_globals
    assert set(_get_allowed_globals()) <= allow.names
    assert not allow.allowed("os.system") and not allow.allowed("builtins.eval")
    assert allow.allowed("torch._utils._rebuild_tensor_v2") and allow.allowed("collections.OrderedDict")


# -- benign checkpoints stay quiet -----------------------------------------------------------------

def _benign_dir(root: Path) -> Path:
    """What transformers 4.x save_pretrained(safe_serialization=False) and the Trainer leave."""
    from transformers import AutoConfig, AutoModelForCausalLM, TrainingArguments

    cfg = AutoConfig.for_model("qwen2", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    state = model.state_dict()
    root.mkdir()
    cfg.save_pretrained(root)
    torch.save(state, root / "pytorch_model.bin")  # transformers 4.x: zip format, bf16
    torch.save(state, root / "legacy.bin", _use_new_zipfile_serialization=False)
    names = list(state)
    half = len(names) // 2
    shards = {"pytorch_model-00001-of-00002.bin": names[:half], "pytorch_model-00002-of-00002.bin": names[half:]}
    sharded = root / "sharded"
    sharded.mkdir()
    for shard, keys in shards.items():
        torch.save({k: state[k] for k in keys}, sharded / shard)
    (sharded / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 0}, "weight_map": {k: s for s, keys in shards.items() for k in keys}}))
    checkpoint = root / "checkpoint-1"
    checkpoint.mkdir()
    torch.save(TrainingArguments(output_dir=str(root / "out"), report_to=[]), checkpoint / "training_args.bin")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.float()
    loss = model(torch.tensor([[1, 2, 3]])).logits.sum()
    loss.backward()
    optimizer.step()
    torch.save(optimizer.state_dict(), checkpoint / "optimizer.pt")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    torch.save(scheduler.state_dict(), checkpoint / "scheduler.pt")
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()},
               checkpoint / "rng_state.pth")
    return root


@pytest.fixture(scope="module")
def benign(tmp_path_factory) -> Path:
    return _benign_dir(tmp_path_factory.mktemp("benign") / "model")


def test_benign_checkpoints_get_no_safety_error(benign):
    report = check_dir(benign, allow_pickle=True)
    assert _safety_errors(report) == [], _safety_errors(report)
    pickles = {f.path for f in report.findings if f.code == "safety.pickle_file"}
    assert {"pytorch_model.bin", "legacy.bin", "sharded/pytorch_model-00001-of-00002.bin",
            "checkpoint-1/optimizer.pt", "checkpoint-1/rng_state.pth", "checkpoint-1/training_args.bin"} <= pickles
    warned = {f.path for f in report.findings if f.code == "safety.pickle_unknown_global"}
    assert warned == {"checkpoint-1/training_args.bin"}
    # without --allow-pickle every pickle is still an error
    assert not check_dir(benign).ok


def test_benign_verdicts_agree_with_torchs_weights_only_unpickler(benign):
    from transformers.trainer_pt_utils import safe_globals

    for path in [benign / "pytorch_model.bin", benign / "legacy.bin", benign / "checkpoint-1" / "optimizer.pt",
                 benign / "checkpoint-1" / "scheduler.pt"]:
        with open(path, "rb") as fh:
            assert scan_pickle_file(fh, path.stat().st_size).accepted, path
        assert _weights_only_loads(path), path
    rng = benign / "checkpoint-1" / "rng_state.pth"
    with safe_globals():  # what the Trainer does when it resumes
        assert _weights_only_loads(rng)
    args = benign / "checkpoint-1" / "training_args.bin"
    with open(args, "rb") as fh:
        assert not scan_pickle_file(fh, args.stat().st_size).accepted
    assert not _weights_only_loads(args)


def test_non_pickle_files_are_not_reported(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "README.md").write_text("# model\n")
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\n")
    (tmp_path / "vocab.txt").write_text("[PAD]\n[unused0]\nhello\n")
    (tmp_path / "weights.bin").write_bytes(bytes(range(256)) * 8)
    report = check_dir(tmp_path, allow_pickle=True)
    assert not [f for f in report.findings if f.code.startswith("safety.pickle")], report.findings


# -- the evasions of issue 12 ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def evasions(tmp_path_factory) -> dict[str, Path]:
    return pickle_evasions.build_all(tmp_path_factory.mktemp("evasions"))


@pytest.mark.parametrize("name", sorted(pickle_evasions.EVASIONS))
def test_every_listed_evasion_is_refused(evasions, name):
    report = check_dir(evasions[name], allow_pickle=True)
    codes = {f.code for f in _safety_errors(report)}
    assert "safety.pickle_dangerous" in codes, report.findings
    rel = pickle_evasions.EVASIONS[name][0]
    assert not _weights_only_loads(evasions[name] / rel)  # torch refuses it too


def test_encrypted_flag_is_a_finding_and_the_payload_is_still_read(evasions, tmp_path):
    report = check_dir(evasions["zip_encrypted_flag"], allow_pickle=True)
    assert "safety.archive_invalid" in {f.code for f in report.findings}
    path = tmp_path / "m"
    path.mkdir()
    data = bytearray(pickle_evasions.torch_zip_with_upper_case_payload())
    for sig, offset in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        start = 0
        while (start := data.find(sig, start)) != -1:
            data[start + offset] |= 0x01
            start += 4
    (path / "pytorch_model.bin").write_bytes(bytes(data))
    codes = {f.code for f in check_dir(path, allow_pickle=True).findings}
    assert {"safety.archive_invalid", "safety.pickle_dangerous"} <= codes


# -- never crash -----------------------------------------------------------------------------------

def _zip_bytes(members: dict[str, bytes], method=zipfile.ZIP_DEFLATED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", method) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buffer.getvalue()


def test_damaged_inputs_become_findings(tmp_path, monkeypatch):
    good = pickle.dumps({"a": 1}, protocol=2)
    torch_zip = io.BytesIO()
    torch.save({"w": torch.ones(2)}, torch_zip)
    cases = {
        "truncated.pkl": pickle.dumps({"a": list(range(100))}, protocol=4)[:40],
        "corrupt_zip.bin": b"PK\x03\x04" + os.urandom(200),
        "truncated_zip.bin": torch_zip.getvalue()[: len(torch_zip.getvalue()) // 2],
        "bomb.bin": _zip_bytes({"archive/data.pkl": good + b"\x00" * (3 << 20)}),
        "legacy_truncated.bin": pickle_evasions.legacy_framed_sys_info()[:30],
    }
    monkeypatch.setattr(pickle_sources, "MAX_PICKLE_BYTES", 1 << 20)
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
    report = check_dir(tmp_path, allow_pickle=True)
    flagged = {f.path for f in _safety_errors(report)}
    assert set(cases) <= flagged, report.findings
    bomb = [f for f in report.findings if f.path == "bomb.bin"]
    assert any(f.code == "safety.archive_invalid" and "MiB" in f.message for f in bomb), bomb


def test_too_many_zip_members_is_a_bomb(tmp_path, monkeypatch):
    monkeypatch.setattr(pickle_sources, "MAX_MEMBERS", 10)
    (tmp_path / "many.bin").write_bytes(_zip_bytes({f"archive/data/{i}": b"" for i in range(11)} | {"archive/data.pkl": b"N."}))
    report = check_dir(tmp_path, allow_pickle=True)
    assert any(f.code == "safety.archive_invalid" and "members" in f.message for f in report.findings)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "check-dir", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_json_is_always_printed(evasions, tmp_path):
    done = _cli(str(evasions["zip_encrypted_flag"]), "--json", "--allow-pickle")
    assert done.returncode == 1, done.stderr
    assert "safety.archive_invalid" in {f["code"] for f in json.loads(done.stdout)["findings"]}
    done = _cli(str(tmp_path / "missing"), "--json")
    assert done.returncode == 2
    payload = json.loads(done.stdout)
    assert payload["ok"] is False and "no such directory" in payload["error"]
    assert "Traceback" not in done.stderr
