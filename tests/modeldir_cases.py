"""Generated directory-level cases for check-dir (issue 43): each edits a copy of a healthy model
directory the way an attacker or a broken download/merge does, with benign twins beside them.

No payload does more than write a marker file (MARKER in the working directory). Used by
tests/test_modeldir_directory.py and benchmarks/modeldir/directory_cases.py.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

MARKER = "checkdir-payload-ran"
PAYLOAD = f"open({MARKER!r}, 'w').write('ran')\n"


@dataclass(frozen=True)
class Case:
    name: str
    klass: str  # code, headers, templates, values, parsers, layouts
    malicious: bool  # True: a loader runs code, refuses or mis-reads it; False: a healthy twin
    build: Callable[[Path], None]  # edits a copy of the healthy directory in place


def _json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2))


def _edit(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    _json(path, data)


def _raw_safetensors(path: Path, header_text: bytes, data: bytes) -> None:
    path.write_bytes(struct.pack("<Q", len(header_text)) + header_text + data)


def _rewrite_header(d: Path, transform: Callable[[bytes], bytes]) -> None:
    """Rewrite model.safetensors' header text (padded to keep the data offset 8-aligned)."""
    path = d / "model.safetensors"
    blob = path.read_bytes()
    n = struct.unpack("<Q", blob[:8])[0]
    header, data = blob[8:8 + n], blob[8 + n:]
    new = transform(header.rstrip(b" "))
    new += b" " * (-len(new) % 8)
    _raw_safetensors(path, new, data)


def _metadata_twice(header: bytes) -> bytes:
    return b'{"__metadata__":{"format":"pt"},' + header[1:]


def _metadata_not_string(header: bytes) -> bytes:
    obj = json.loads(header)
    obj["__metadata__"] = {"format": "pt", "step": 1000}
    return json.dumps(obj).encode()


def _nan_in_header(header: bytes) -> bytes:
    obj = json.loads(header)
    name = next(k for k in obj if k != "__metadata__")
    text = json.dumps(obj)
    return text.replace(f'"{name}": {{', f'"{name}": {{"scale": NaN, ', 1).encode()


def _sparse_tensor(d: Path, gib: int = 100) -> None:
    """An extra F32 tensor of `gib` GiB whose bytes are a hole: the file is sparse on disk."""
    path = d / "model.safetensors"
    blob = path.read_bytes()
    n = struct.unpack("<Q", blob[:8])[0]
    obj = json.loads(blob[8:8 + n])
    end = max(v["data_offsets"][1] for k, v in obj.items() if k != "__metadata__")
    count = gib * 2**30 // 4
    obj["model.extra.weight"] = {"dtype": "F32", "shape": [count], "data_offsets": [end, end + count * 4]}
    header = json.dumps(obj).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header + blob[8 + n:])
        fh.truncate(8 + len(header) + end + count * 4)


def _edit_tensor(d: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    path = d / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


def _first_matrix(tensors) -> str:
    return next(k for k, v in sorted(tensors.items()) if v.dim() == 2 and "proj" in k)


def _set(tensors, value) -> None:
    name = _first_matrix(tensors)
    tensors[name][0, 0] = value


def _zero(tensors) -> None:
    name = _first_matrix(tensors)
    tensors[name].zero_()


def _empty_extra(tensors) -> None:
    import torch

    tensors["model.unused_buffer"] = torch.zeros(0)


def _shard(d: Path, metadata: bool) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(d / "model.safetensors"))
    (d / "model.safetensors").unlink()
    names = sorted(tensors)
    halves = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    total = 0
    for i, part in enumerate(halves, 1):
        fname = f"model-{i:05d}-of-00002.safetensors"
        save_file({k: tensors[k] for k in part}, str(d / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in part})
        total += sum(tensors[k].numel() * tensors[k].element_size() for k in part)
    index = {"weight_map": weight_map}
    if metadata:
        index["metadata"] = {"total_size": total}
    _json(d / "model.safetensors.index.json", index)


def _bad_merges(d: Path) -> None:
    tok = json.loads((d / "tokenizer.json").read_text())
    tok["model"]["merges"].append(["zzzunknownA", "zzzunknownB"])
    _json(d / "tokenizer.json", tok)


def _random_spm(d: Path) -> None:
    (d / "tokenizer.json").unlink()
    (d / "tokenizer.model").write_bytes(os.urandom(4096))
    _edit(d / "tokenizer_config.json", tokenizer_class="LlamaTokenizer")


def _symlink_loop(d: Path) -> None:
    (d / "tokenizer_config.json").unlink()
    os.symlink("tokenizer_config.json", d / "tokenizer_config.json")


def _template(d: Path, text: str) -> None:
    (d / "chat_template.jinja").write_text(text)


def _auto_map(file: str, extra: dict | None = None, auto_map: dict | None = None):
    def build(d: Path) -> None:
        path = d / file
        data = json.loads(path.read_text()) if path.exists() else {}
        data.update(extra or {})
        data["auto_map"] = auto_map
        _json(path, data)
    return build


def _with_py(build, name: str):
    def both(d: Path) -> None:
        build(d)
        (d / name).write_text(f"{PAYLOAD}class Evil:\n    pass\n")
    return both


def _custom_generate(d: Path) -> None:
    (d / "custom_generate").mkdir()
    (d / "custom_generate" / "generate.py").write_text(f"{PAYLOAD}def generate(model, **kw):\n    return None\n")


def _hf_cache(d: Path) -> None:
    """Lay the directory out as huggingface_hub's cache does: snapshots/<rev>/<file> -> ../../blobs/<hash>."""
    import hashlib
    import shutil

    repo = d / "models--org--tiny"
    snap = repo / "snapshots" / ("0" * 40)
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    for item in sorted(d.iterdir()):
        if item.name == "models--org--tiny":
            continue
        digest = hashlib.sha256(item.read_bytes()).hexdigest()
        shutil.move(str(item), repo / "blobs" / digest)
        os.symlink(f"../../blobs/{digest}", snap / item.name)


def cache_snapshot(d: Path) -> Path:
    """The snapshot folder of a directory built by _hf_cache (what a user passes to check-dir)."""
    return d / "models--org--tiny" / "snapshots" / ("0" * 40)


REMOTE = "attacker/payload--evil.Evil"
GEMMA_LIKE = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
              "{% endif %}{% for message in messages %}{{ '<start_of_turn>' + message['role'] + '\n' + message['content'] "
              "+ '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")

CASES: list[Case] = [
    # 1. code paths
    Case("auto_map_preprocessor_remote", "code", True, _auto_map(
        "preprocessor_config.json", {"image_processor_type": "Evil"}, {"AutoImageProcessor": REMOTE})),
    Case("auto_map_feature_extractor", "code", True, _with_py(_auto_map(
        "preprocessor_config.json", {"feature_extractor_type": "Evil"}, {"AutoFeatureExtractor": "evil.Evil"}), "evil.py")),
    Case("auto_map_processor", "code", True, _auto_map("processor_config.json", {}, {"AutoProcessor": REMOTE})),
    Case("auto_map_video_processor", "code", True, _auto_map(
        "video_preprocessor_config.json", {}, {"AutoVideoProcessor": REMOTE})),
    Case("auto_map_config_remote", "code", True, lambda d: _edit(d / "config.json", auto_map={"AutoModelForCausalLM": REMOTE})),
    Case("auto_map_tokenizer_list", "code", True, lambda d: _edit(d / "tokenizer_config.json",
                                                                 auto_map={"AutoTokenizer": [REMOTE, None]})),
    Case("custom_generate", "code", True, _custom_generate),
    Case("benign_preprocessor_config", "code", False, lambda d: _json(d / "preprocessor_config.json",
                                                                      {"image_processor_type": "SiglipImageProcessor"})),
    # 2. safetensors headers
    Case("header_bom", "headers", True, lambda d: _rewrite_header(d, lambda h: b"\xef\xbb\xbf" + h)),
    Case("header_not_object", "headers", True, lambda d: _rewrite_header(d, lambda h: b"[" + h + b"]")),
    Case("header_metadata_twice", "headers", True, lambda d: _rewrite_header(d, _metadata_twice)),
    Case("header_metadata_not_string", "headers", True, lambda d: _rewrite_header(d, _metadata_not_string)),
    Case("header_nan", "headers", True, lambda d: _rewrite_header(d, _nan_in_header)),
    Case("sparse_100gib_tensor", "headers", True, _sparse_tensor),
    Case("benign_header_leading_space", "headers", False, lambda d: _rewrite_header(d, lambda h: b" " + h)),
    Case("benign_header_metadata", "headers", False, lambda d: _rewrite_header(d, lambda h: json.dumps(
        {**json.loads(h), "__metadata__": {"format": "pt", "note": "merged"}}).encode())),
    # 3. chat templates
    Case("template_nested_loops", "templates", True, lambda d: _template(
        d, "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}")),
    Case("template_string_repeat", "templates", True, lambda d: _template(d, "{{ 'x' * 4000000000 }}")),
    Case("template_output_flood", "templates", True, lambda d: _template(
        d, "{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}")),
    Case("template_escape", "templates", True, lambda d: _template(
        d, "{{ ''.__class__.__mro__[1].__subclasses__() }}{% for m in messages %}{{ m.content }}{% endfor %}")),
    Case("template_syntax_error", "templates", True, lambda d: _template(d, "{% for m in messages %}{{ m.content }")),
    Case("template_named_list_escape", "templates", True, lambda d: (
        (d / "chat_template.jinja").unlink(),
        _edit(d / "tokenizer_config.json", chat_template=[
            {"name": "default", "template": "{% for m in messages %}{{ m.content }}{% endfor %}"},
            {"name": "tool_use", "template": "{{ cycler.__init__.__globals__.os.system('touch x') }}"}]))),
    Case("template_json_loop", "templates", True, lambda d: (
        (d / "chat_template.jinja").unlink(),
        _json(d / "chat_template.json", {"chat_template": "{% for i in range(10**9) %}{% endfor %}"}))),
    Case("benign_template_refuses_system", "templates", False, lambda d: _template(d, GEMMA_LIKE)),
    # 4. values
    Case("config_rms_norm_eps_nan", "values", True, lambda d: (d / "config.json").write_text(
        (d / "config.json").read_text().replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": NaN'))),
    Case("config_rope_theta_inf", "values", True, lambda d: (d / "config.json").write_text(
        (d / "config.json").read_text().replace('"rope_theta": 10000.0', '"rope_theta": Infinity'))),
    Case("config_negative_eps", "values", True, lambda d: _edit(d / "config.json", rms_norm_eps=-1e-6)),
    Case("weights_nan", "values", True, lambda d: _edit_tensor(d, lambda t: _set(t, float("nan")))),
    Case("weights_inf", "values", True, lambda d: _edit_tensor(d, lambda t: _set(t, float("inf")))),
    Case("weights_all_zero", "values", True, lambda d: _edit_tensor(d, _zero)),
    Case("weights_constant", "values", True, lambda d: _edit_tensor(d, lambda t: t[_first_matrix(t)].fill_(0.5))),
    Case("benign_config_eps", "values", False, lambda d: _edit(d / "config.json", rms_norm_eps=1e-5)),
    # 5. parsers
    Case("tokenizer_model_random", "parsers", True, _random_spm),
    Case("tokenizer_merges_unknown", "parsers", True, _bad_merges),
    Case("index_without_metadata", "parsers", True, lambda d: _shard(d, metadata=False)),
    Case("tokenizer_config_symlink_loop", "parsers", True, _symlink_loop),
    Case("benign_sharded_index", "parsers", False, lambda d: _shard(d, metadata=True)),
    # 6. layouts users have (benign)
    Case("hf_cache_snapshot", "layouts", False, _hf_cache),
    Case("text_file_like_pickle", "layouts", False, lambda d: (d / "NOTES.txt").write_text(
        "class of 2024: notes\n  (see README)\nimport notes\n")),
    Case("empty_extra_tensor", "layouts", False, lambda d: _edit_tensor(d, _empty_extra)),
    Case("handler_py_is_code", "layouts", True, lambda d: (d / "handler.py").write_text(
        "class EndpointHandler:\n    def __init__(self, path=''):\n        self.path = path\n")),
]


def build_case(case: Case, base: Path, work: Path) -> Path:
    """Copy `base` to work/<name>, apply the case; returns the directory check-dir is given."""
    import shutil

    target = work / case.name
    shutil.copytree(base, target, ignore=shutil.ignore_patterns("harness-recipe.json"))
    case.build(target)
    return cache_snapshot(target) if case.build is _hf_cache else target
