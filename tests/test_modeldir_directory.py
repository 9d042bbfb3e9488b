"""check-dir over the whole directory (issue 43): code paths, safetensors headers judged by the
safetensors library, chat templates rendered in transformers' sandbox, config and weight values,
files their own parsers refuse, and the layouts users have (HF cache snapshots, text files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.modeldir import check_dir
from modeldir_cases import CASES, MARKER, build_case, cache_snapshot

# the finding each refused case must carry (the loader's reason, not just any error)
EXPECTED = {
    "auto_map_preprocessor_remote": "safety.remote_code",
    "auto_map_feature_extractor": "safety.remote_code",
    "auto_map_processor": "safety.remote_code",
    "auto_map_video_processor": "safety.remote_code",
    "auto_map_config_remote": "safety.remote_code",
    "auto_map_tokenizer_list": "safety.remote_code",
    "custom_generate": "safety.python_file",
    "header_bom": "safetensors.header_invalid",
    "header_not_object": "safetensors.header_invalid",
    "header_metadata_twice": "safetensors.header_invalid",
    "header_metadata_not_string": "safetensors.header_invalid",
    "header_nan": "safetensors.header_invalid",
    "sparse_100gib_tensor": "arch.unexpected_tensor",
    "template_nested_loops": "chat_template.unsafe",
    "template_string_repeat": "chat_template.unsafe",
    "template_output_flood": "chat_template.unsafe",
    "template_escape": "chat_template.unsafe",
    "template_syntax_error": "chat_template.invalid",
    "template_named_list_escape": "chat_template.unsafe",
    "template_json_loop": "chat_template.invalid",
    "config_rms_norm_eps_nan": "config.non_finite",
    "config_rope_theta_inf": "config.non_finite",
    "config_negative_eps": "config.out_of_range",
    "weights_nan": "tensor.nan",
    "weights_inf": "tensor.inf",
    "weights_all_zero": "tensor.all_zero",
    "weights_constant": "tensor.constant",
    "tokenizer_model_random": "tokenizer.invalid",
    "tokenizer_merges_unknown": "tokenizer.invalid",
    "index_without_metadata": "weights.index_invalid",
    "tokenizer_config_symlink_loop": "file.unreadable",
    "handler_py_is_code": "safety.python_file",
}


def _errors(report) -> set[str]:
    return {f.code for f in report.errors}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_case_refused_or_accepted_as_its_loader_would(case, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = build_case(case, tiny_model_dir, tmp_path)
    report = check_dir(d)
    if case.malicious:
        assert EXPECTED[case.name] in _errors(report), report.findings
    else:
        assert report.ok, report.findings
    assert not (tmp_path / MARKER).exists()  # nothing from the directory ran


def test_every_malicious_case_has_its_expected_code():
    assert {c.name for c in CASES if c.malicious} == set(EXPECTED)


def test_allow_remote_code_lists_code_paths_as_warnings(tiny_model_dir, tmp_path):
    for name in ("auto_map_preprocessor_remote", "custom_generate", "auto_map_feature_extractor"):
        case = next(c for c in CASES if c.name == name)
        report = check_dir(build_case(case, tiny_model_dir, tmp_path), allow_remote_code=True)
        assert report.ok, report.findings
        assert {"safety.remote_code", "safety.python_file"} & report.codes()


def test_remote_reference_names_the_repository_and_the_loader(tiny_model_dir, tmp_path):
    case = next(c for c in CASES if c.name == "auto_map_preprocessor_remote")
    report = check_dir(build_case(case, tiny_model_dir, tmp_path))
    message = next(f for f in report.errors if f.code == "safety.remote_code")
    assert message.path == "preprocessor_config.json"
    assert "attacker/payload" in message.message and "AutoImageProcessor.from_pretrained" in message.message


def test_sparse_tensor_is_answered_from_its_header(tiny_model_dir, tmp_path):
    case = next(c for c in CASES if c.name == "sparse_100gib_tensor")
    d = build_case(case, tiny_model_dir, tmp_path)
    assert (d / "model.safetensors").stat().st_size > 100 * 2**30
    report = check_dir(d)
    assert report.bytes_read < 4 * 2**20, report.bytes_read  # header, samples and small files only
    assert "arch.unexpected_tensor" in _errors(report)


def test_a_hole_where_a_weight_should_be_is_all_zero(tiny_model_dir, tmp_path):
    """A weight matrix's bytes never written (a sparse region): refused as all zeros, whether
    SEEK_DATA reports the hole or the sample reads the zeros."""
    import struct

    d = build_case(next(c for c in CASES if c.name == "benign_config_eps"), tiny_model_dir, tmp_path)
    path = d / "model.safetensors"
    blob = path.read_bytes()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    name = max((k for k in header if k != "__metadata__" and len(header[k]["shape"]) == 2),
               key=lambda k: header[k]["data_offsets"][1] - header[k]["data_offsets"][0])
    begin, end = (8 + n + x for x in header[name]["data_offsets"])
    with open(path, "wb") as fh:
        fh.write(blob[:begin])
        fh.seek(end)
        fh.write(blob[end:])
    report = check_dir(d)
    assert any(f.code == "tensor.all_zero" and name in f.message for f in report.errors), report.findings


def test_cache_snapshot_still_refuses_links_that_leave_the_cache(tiny_model_dir, tmp_path):
    case = next(c for c in CASES if c.name == "hf_cache_snapshot")
    d = build_case(case, tiny_model_dir, tmp_path)
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    os.symlink(outside, d / "extra.json")
    report = check_dir(d)
    assert [f.path for f in report.errors if f.code == "safety.path_escape"] == ["extra.json"]
    assert cache_snapshot(tmp_path / case.name) == d


def test_handler_py_is_code_never_a_pickle(tiny_model_dir, tmp_path):
    case = next(c for c in CASES if c.name == "handler_py_is_code")
    report = check_dir(build_case(case, tiny_model_dir, tmp_path), allow_remote_code=True)
    assert report.ok and not any(f.code.startswith("safety.pickle") for f in report.findings), report.findings


def test_protocol0_pickle_in_a_text_file_is_still_a_pickle(tiny_model_dir, tmp_path):
    d = build_case(next(c for c in CASES if c.name == "benign_config_eps"), tiny_model_dir, tmp_path)
    (d / "README.md").write_text(f"cbuiltins\nexec\n(V{MARKER!r}\ntR.")
    report = check_dir(d)
    assert {"safety.pickle_dangerous", "safety.pickle_file"} <= _errors(report), report.findings


def test_cli_last_line_and_exit_code(tiny_model_dir, tmp_path):
    case = next(c for c in CASES if c.name == "template_escape")
    d = build_case(case, tiny_model_dir, tmp_path)
    run = subprocess.run([sys.executable, "-m", "harness", "check-dir", str(d)], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert run.returncode == 1, run.stderr
    assert run.stdout.strip().splitlines()[-1].startswith("REFUSED")
    assert "Traceback" not in run.stderr
    run = subprocess.run([sys.executable, "-m", "harness", "check-dir", str(d), "--json"], capture_output=True,
                         text=True, cwd=Path(__file__).resolve().parents[1])
    data = json.loads(run.stdout)
    assert data["ok"] is False and "chat_template.unsafe" in {f["code"] for f in data["findings"]}


def test_config_values_nested_and_generation_config():
    from harness.modeldir.config_values import check_values
    from harness.modeldir.findings import Collector

    out = Collector()
    check_values("config.json", {"text_config": {"rope_parameters": {"rope_theta": float("inf")}},
                                 "layer_norm_eps": 0.0, "hidden_size": 64}, out)
    check_values("generation_config.json", {"temperature": float("nan"), "top_p": 0.9}, out)
    got = {(f.code, f.path, f.message.split(" ", 1)[0]) for f in out.findings}
    assert got == {("config.non_finite", "config.json", "text_config.rope_parameters.rope_theta"),
                   ("config.out_of_range", "config.json", "layer_norm_eps"),
                   ("config.non_finite", "generation_config.json", "temperature")}


def test_real_smollm2_as_a_hub_cache_snapshot_is_accepted(smollm2, tmp_path):
    """SmolLM2-135M-Instruct laid out as huggingface_hub lays a download out (snapshots/<rev>/*
    -> ../../blobs/<sha256>): its template renders, its weights sample finite, nothing escapes."""
    import shutil

    from modeldir_cases import _hf_cache

    d = tmp_path / "smollm2"
    shutil.copytree(smollm2, d, ignore=shutil.ignore_patterns("harness-recipe.json"))
    _hf_cache(d)
    snapshot = cache_snapshot(d)
    assert os.readlink(snapshot / "model.safetensors").startswith("../../blobs/")
    report = check_dir(snapshot)
    assert report.ok and not report.findings, report.findings


def test_processor_config_template_is_rendered_too(tiny_model_dir, tmp_path):
    d = build_case(next(c for c in CASES if c.name == "benign_config_eps"), tiny_model_dir, tmp_path)
    (d / "processor_config.json").write_text(json.dumps({"chat_template": "{{ ''.__class__.__mro__ }}"}))
    report = check_dir(d)
    assert [f.path for f in report.errors if f.code == "chat_template.unsafe"][:1] == ["processor_config.json"]
