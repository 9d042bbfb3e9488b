"""check_dir: completeness, integrity, consistency, leftovers, quantization, safety (+ --deep)."""

from __future__ import annotations

import os

from . import consistency, deep as deep_scan, directory_rules, gguf_dir, quantization, weight_sample
from .findings import WARNING, Collector, DirReport
from .paths import DirView, NotAFile, PathEscape
from .loader_verdict import inert_text, merge
from .pickle_scan import PickleScan, scan_pickle_file
from .read_child import read_all
from .safetensors_header import HeaderProblem, SafetensorsHeader, read_header

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tiktoken.model", "vocab.json")


def check_dir(path: str | os.PathLike, deep: bool = False, allow_remote_code: bool = False,
              allow_pickle: bool = False, progress: bool = False) -> DirReport:
    """Check a model directory. Raises UsageError when DIR is missing, not a directory,
    unreadable or empty; everything else is a finding in the returned DirReport."""
    view = DirView.open(path)
    out = Collector()
    reads = _check_entries(view, out, allow_remote_code, allow_pickle, progress)
    refused = directory_rules.check_directory(view, out, reads, allow_remote_code)
    if gguf_dir.is_gguf_dir(view):  # llama.cpp's deliverable: architecture and tokenizer inside the file
        gguf_dir.check_gguf_dir(view, out, deep=deep)
        out.close()
        return DirReport(directory=str(view.root), findings=out.findings, deep=deep, bytes_read=view.bytes_read,
                         files_checked=sum(1 for e in view.entries.values() if e.kind == "file"))
    config = _check_config(view, out, allow_remote_code)
    tokenizer_json = _check_tokenizer(view, out, allow_remote_code)
    _check_generation_config(view, out, config)
    headers, stored, weights_whole = _check_weights(view, out, refused)
    # also: does transformers accept the config? (the stored tensors let a family rule confirm them)
    expected = _expected(config, out, stored if weights_whole else None) if config is not None else None
    if headers and not deep:
        weight_sample.sample_weights(view, headers, out)

    if stored:
        leftovers = consistency.adapter_keys(stored)
        if leftovers:
            out.add("leftover.adapter_keys", stored[leftovers[0]][0],
                    f"{len(leftovers)} adapter key(s) such as {leftovers[0]}: the model was saved before merging "
                    "(or from the PeftModel); run merged = model.merge_and_unload() and save `merged`")
    if config is not None and stored:
        quantized = quantization.check_quantization(config, stored, out)
        if not quantized:
            consistency.check_dtype(config, stored, out)
        if expected is not None and weights_whole:
            consistency.check_tensors(expected, stored, out, quantized)
            if quantized:
                quantization.check_quantized_layout(config, stored, expected, out)
        if expected is not None and tokenizer_json is not None:
            _check_tokenizer_fits(expected, stored, tokenizer_json, out)
        if deep:
            _deep(view, out, headers, stored, expected, progress)
    elif deep and headers:
        _deep(view, out, headers, stored, None, progress)

    out.close()
    report = DirReport(directory=str(view.root), findings=out.findings, deep=deep,
                       files_checked=sum(1 for e in view.entries.values() if e.kind == "file"),
                       bytes_read=view.bytes_read)
    return report


# -- entries: links, special files, code, pickles ------------------------------------------------

def _loader_reads(view: DirView, progress: bool = False) -> dict:
    """Every regular file read by the loaders' own code, in one bounded child process."""
    files = []
    for rel, entry in view.entries.items():
        if entry.kind in ("file", "symlink") and view.exists(rel) and (entry.kind == "file" or entry.inside):
            try:
                files.append((str(view.resolve(rel)), rel))
            except PathEscape:
                continue
    return read_all(files, progress=progress)


def _check_entries(view: DirView, out: Collector, allow_remote_code: bool, allow_pickle: bool,
                   progress: bool = False) -> dict:
    reads = _loader_reads(view, progress)
    for rel, entry in view.entries.items():
        if entry.kind == "symlink" and not entry.inside:
            out.add("safety.path_escape", rel,
                    f"symlink to {entry.target}, outside the directory (not followed): copy the real file in "
                    "(for a Hugging Face cache snapshot, download with --local-dir instead)")
            continue
        if entry.kind == "special":
            out.add("safety.special_file", rel, "a FIFO, socket or device file (not opened): remove it")
            continue
        if entry.kind == "unreadable_dir":
            out.add("file.unreadable", rel, "cannot list this folder (permissions?): fix its permissions")
            continue
        if entry.kind == "too_deep":
            out.add("file.unreadable", rel, "folders nested too deep to walk: its files were not checked; flatten it")
            continue
        if not view.exists(rel):
            continue
        _check_pickle(view, rel, out, allow_pickle, reads.get(rel))
    return reads


def _check_pickle(view: DirView, rel: str, out: Collector, allow_pickle: bool, read=None) -> None:
    """Every regular file is sniffed: pickles are found by content, whatever their name."""
    try:
        with view.open_binary(rel) as fh:
            scan = scan_pickle_file(fh, view.size(rel))
    except (OSError, NotAFile, PathEscape) as exc:
        out.add("file.unreadable", rel, f"cannot read: {_oserror(exc)}")
        return
    except Exception as exc:  # noqa: BLE001 - a scanner bug must not hide the file or crash the check
        out.add("safety.pickle_unreadable", rel,
                f"the pickle scan failed ({type(exc).__name__}: {exc}): do not load this file")
        return
    scan = merge(scan, read)
    if scan.is_pickle and inert_text(read, view.read_bytes(rel, 65536)):
        return  # text no unpickler gets past its first import (handler.py, a README): not a pickle
    if scan.is_pickle:
        _report_pickle(rel, scan, out, allow_pickle)


def _report_pickle(rel: str, scan: PickleScan, out: Collector, allow_pickle: bool) -> None:
    loader = "torch.load(weights_only=False), pickle.load or an old transformers"
    for reason in scan.unverifiable[:3]:
        out.add("safety.unverifiable", rel, f"cannot be verified: {reason}; what its loader would run cannot be "
                "vouched for: do not load this file")
    for problem in scan.problems[:3]:
        out.add("safety.archive_invalid", rel, f"{problem}: its pickles cannot be checked as a loader reads them; "
                "do not load this file")
    if scan.unscanned:
        out.add("safety.archive_unscanned", rel, f"{scan.unscanned}: unpack it and check the contents")
    named = scan.dangerous[:3] + scan.unresolved[:2]
    if named:
        out.add("safety.pickle_dangerous", rel,
                f"would import {'; '.join(named)}: {loader} would run it; delete the file and get safetensors weights")
    reasons = ([scan.torch_refuses] if scan.torch_refuses else []) + scan.refused[:3]
    if scan.refused or (scan.torch_refuses and not named):
        out.add("safety.pickle_refused", rel,
                f"torch.load(weights_only=True) would refuse it ({'; '.join(reasons)}); {loader} would run it "
                "unchecked: convert to safetensors or remove it")
    if scan.framed_only:
        out.add("safety.pickle_framed", rel,
                f"torch.load(weights_only=True) cannot read it ({scan.framed_only}); every global and call the C "
                "unpickler reads keeps torch's rule, so only weights_only=False loads it: re-save it with "
                "torch.save's default protocol (or convert to safetensors)")
    for message in scan.unreadable[:3]:
        out.add("safety.pickle_unreadable", rel, f"pickle cannot be read to its end ({message}): do not load this file")
    if scan.known_safe and not (named or scan.refused):
        out.add("safety.pickle_unknown_global", rel,
                f"imports {'; '.join(scan.known_safe[:3])}: outside torch's allow-list, so "
                "torch.load(weights_only=True) refuses it (no model loader reads it)")
    where = ", ".join(scan.pickles[:3]) + (" ..." if len(scan.pickles) > 3 else "")
    out.add("safety.pickle_file", rel,
            f"{scan.kind} ({where or 'no pickle read'}): pickles run code when loaded without weights_only=True: "
            "convert to safetensors (or pass --allow-pickle)", severity=WARNING if allow_pickle else None)

# -- config, tokenizer, generation config ------------------------------------------------------

def _check_config(view: DirView, out: Collector, allow_remote_code: bool) -> dict | None:
    if not view.exists("config.json"):
        inside = sorted(rel.rsplit("/", 1)[0] for rel in view.entries
                        if rel.endswith("/config.json") and rel.count("/") <= 2 and view.exists(rel))
        if inside:
            named = ", ".join(inside[:5]) + (f" and {len(inside) - 5} more" if len(inside) > 5 else "")
            out.add("config.missing", "config.json",
                    f"no config.json here, but {named} hold one: this looks like a folder of models; "
                    f"check each one (check-dir {view.root / inside[0]})")
            return None
        out.add("config.missing", "config.json",
                "no config.json: copy it from the base model (and set its dtype and vocab_size to match the weights)")
        return None
    config = _read_json(view, "config.json", out, "config.invalid")
    if config is None:
        return None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        out.add("config.invalid", "config.json", "config.json has no model_type: copy it from the base model")
        return None
    return config


def _check_tokenizer(view: DirView, out: Collector, allow_remote_code: bool) -> dict | None:
    present = [f for f in TOKENIZER_FILES if view.exists(f)]
    if not present:
        out.add("tokenizer.missing", ".",
                "no tokenizer.json / tokenizer.model: save the tokenizer with tokenizer.save_pretrained(DIR) "
                "(vLLM and chat templates need it)")
    tokenizer_json = None
    if view.exists("tokenizer.json"):
        tokenizer_json = _read_json(view, "tokenizer.json", out, "tokenizer.invalid")
    tok_config = None
    if view.exists("tokenizer_config.json"):
        tok_config = _read_json(view, "tokenizer_config.json", out, "tokenizer.invalid")
    elif present:
        out.add("tokenizer.config_missing", "tokenizer_config.json",
                "no tokenizer_config.json: special tokens and the chat template are unknown; save the tokenizer again")
    has_template = (view.exists("chat_template.jinja") or view.exists("chat_template.json")
                    or (isinstance(tok_config, dict) and bool(tok_config.get("chat_template"))))
    if not has_template and present:
        out.add("chat_template.missing", ".",
                "no chat template (chat_template.jinja or tokenizer_config.json): /v1/chat/completions will fail; "
                "set tokenizer.chat_template and save the tokenizer")
    return tokenizer_json if isinstance(tokenizer_json, dict) else None


def _check_generation_config(view: DirView, out: Collector, config: dict | None) -> None:
    eos = (config or {}).get("eos_token_id")
    if not view.exists("generation_config.json"):
        out.add("generation_config.missing", "generation_config.json",
                "no generation_config.json: vLLM takes default sampling and stop ids from it; "
                "save model.generation_config with the model")
    else:
        gen = _read_json(view, "generation_config.json", out, "generation_config.invalid")
        if isinstance(gen, dict) and gen.get("eos_token_id") is not None:
            eos = gen["eos_token_id"]
    if eos is None or eos == []:
        out.add("generation_config.no_eos", "generation_config.json",
                "no eos_token_id: generation will not stop at the end of a turn; set eos_token_id (e.g. <|im_end|>'s id)")


def _read_json(view: DirView, rel: str, out: Collector, code: str):
    try:
        return view.read_json(rel)
    except ValueError as exc:
        out.add(code, rel, f"{rel} is not valid: {exc}; save it again")
    except (OSError, NotAFile, PathEscape) as exc:
        out.add("file.unreadable", rel, f"cannot read {rel}: {_oserror(exc)}")
    return None


def _oserror(exc: Exception) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


# -- weights ------------------------------------------------------------------------------------

def _check_weights(view: DirView, out: Collector, refused: set[str]):
    """Headers of every weights file; returns (headers, stored name -> (file, info), whole)."""
    top = set(view.top_level())
    safetensors = sorted(f for f in top if f.endswith(".safetensors") and not f.startswith("adapter_model")
                         and view.exists(f))
    pickles = sorted(f for f in top if f.startswith("pytorch_model") and f.endswith(".bin") and view.exists(f))
    adapters = [f for f in ADAPTER_FILES if f in top]
    whole = True

    shards: list[str] = []
    if INDEX in top:
        shards = _index_shards(view, out)
        if shards is None:
            return {}, {}, False
        named = set(shards)
        for name in safetensors:
            if name not in named:
                out.add("weights.orphan_file", name,
                        f"{name} is not named by {INDEX}: a leftover of an earlier save? delete it (some loaders read every *.safetensors)")
        for shard in shards:
            if not view.exists(shard):
                if not out.has("safety.path_escape") or shard not in _escaped(out):
                    out.add("weights.missing_shard", shard,
                            f"{INDEX} names {shard} but it is not in the directory: copy it (an interrupted upload or copy?)")
                whole = False
        shards = [s for s in shards if view.exists(s)]
    elif SINGLE in safetensors:
        shards = [SINGLE]
        for name in safetensors:
            if name != SINGLE:
                out.add("weights.orphan_file", name, f"{name} beside model.safetensors and no index: delete it")
    elif len(safetensors) > 1:
        out.add("weights.index_missing", INDEX,
                f"{len(safetensors)} safetensors files but no {INDEX}: transformers will not find them; save the model again")
        shards = safetensors
    elif safetensors:
        shards = safetensors

    if not shards and not pickles:
        if adapters:
            out.add("weights.adapter_only", adapters[0],
                    "only an adapter was saved: merge_and_unload() returns the merged model; assign it "
                    "(merged = model.merge_and_unload()) and call merged.save_pretrained(DIR)")
        elif not out.has("weights.missing_shard"):
            out.add("weights.missing", ".", "no model weights (model.safetensors or an index and its shards): save the model")
        return {}, {}, False
    if adapters and (shards or pickles):
        out.add("leftover.adapter_files", adapters[0],
                f"{', '.join(adapters)} beside full weights: transformers loads the adapter on top of the merged weights "
                "(applying it twice); delete the adapter files from the merged directory")

    headers: dict[str, SafetensorsHeader] = {}
    stored: dict[str, tuple[str, object]] = {}
    for shard in shards:
        header = None if shard in refused else _header(view, shard, out)  # refused: reported already
        if header is None:
            whole = False
            continue
        headers[shard] = header
        for name, info in header.tensors.items():
            if name in stored:
                out.add("weights.duplicate_tensor", shard,
                        f"{name} is stored in both {stored[name][0]} and {shard}: delete the stale file")
                continue
            stored[name] = (shard, info)
    if INDEX in top and whole:
        _check_index_agrees(view, out, headers)
    return headers, stored, whole


def _escaped(out: Collector) -> set[str]:
    return {f.path for f in out.findings if f.code == "safety.path_escape"}


def _index_shards(view: DirView, out: Collector) -> list[str] | None:
    index = _read_json(view, INDEX, out, "weights.index_invalid")
    if index is None:
        return None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        out.add("weights.index_invalid", INDEX, f"{INDEX} has no weight_map of tensor names to files: save the model again")
        return None
    if not isinstance(index.get("metadata"), dict):
        out.add("weights.index_invalid", INDEX,
                f"{INDEX} has no metadata object: transformers 5 reads index['metadata'] and fails with "
                "KeyError: 'metadata'; add \"metadata\": {\"total_size\": <bytes>} or save the model again")
    shards: list[str] = []
    for target in dict.fromkeys(weight_map.values()):
        try:
            view.resolve(target)
        except PathEscape as exc:
            out.add("safety.path_escape", target, f"{INDEX} points at {exc} (not followed): entries must be file names in the directory")
            continue
        shards.append(target)
    view._weight_map = weight_map  # kept for the agreement check
    return shards


def _check_index_agrees(view: DirView, out: Collector, headers: dict[str, SafetensorsHeader]) -> None:
    weight_map: dict[str, str] = getattr(view, "_weight_map", {})
    absent = [(name, f) for name, f in weight_map.items() if f in headers and name not in headers[f].tensors]
    if absent:
        name, f = absent[0]
        out.add("weights.index_mismatch", f,
                f"{len(absent)} tensor(s) the index places in files that do not hold them, e.g. {name} in {f}: save the model again")
    unnamed = [(name, f) for f, h in headers.items() for name in h.tensors if weight_map.get(name) != f]
    if unnamed:
        name, f = unnamed[0]
        out.add("weights.index_mismatch", f,
                f"{len(unnamed)} stored tensor(s) the index does not place there, e.g. {name}: save the model again",
                severity=WARNING)


def _header(view: DirView, rel: str, out: Collector) -> SafetensorsHeader | None:
    try:
        size = view.size(rel)
        with view.open_binary(rel) as fh:
            return read_header(fh, size)
    except HeaderProblem as problem:
        out.add(problem.code, rel, problem.message)
    except (OSError, NotAFile) as exc:
        out.add("file.unreadable", rel, f"cannot read: {_oserror(exc)}; fix its permissions")
    except PathEscape as exc:
        out.add("safety.path_escape", rel, f"{exc} (not followed)")
    return None


# -- consistency helpers ------------------------------------------------------------------------

def _expected(config: dict, out: Collector, stored: dict | None = None):
    try:
        return consistency.expected_model(config, stored)
    except Exception as exc:  # noqa: BLE001 - any failure to build the architecture is a finding
        reason = _transformers_sentence(exc)
        if _known_model_type(config.get("model_type")):
            import transformers

            out.add("config.rejected", "config.json",
                    f"transformers {transformers.__version__} refuses this config.json: {reason[:300]}; "
                    "from_pretrained would fail the same way: fix config.json")
            return None
        out.add("arch.unknown", "config.json",
                f"cannot instantiate model_type {config.get('model_type')!r} with this transformers ({reason[:200]}): "
                "shapes and vocab not checked")
        return None


def _transformers_sentence(exc: Exception) -> str:
    """The most specific line of transformers' error (a validator's ValueError under its wrapper)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    inner = [line for line in lines[1:] if ":" in line and line.split(":", 1)[0].endswith(("Error", "Exception"))]
    return inner[0].split(":", 1)[1].strip().replace("`", "") if inner else lines[0]


def _known_model_type(model_type) -> bool:
    try:
        from transformers import CONFIG_MAPPING

        return isinstance(model_type, str) and model_type in CONFIG_MAPPING
    except Exception:  # noqa: BLE001 - transformers missing: nothing is known
        return False


def _check_tokenizer_fits(expected, stored, tokenizer_json: dict, out: Collector) -> None:
    size = consistency.tokenizer_size(tokenizer_json)
    embed = stored.get(expected.embed_key) if expected.embed_key else None
    rows = embed[1].shape[0] if embed else expected.vocab_size
    if size and rows and size > rows:
        out.add("vocab.tokenizer_overflow", "tokenizer.json",
                f"the tokenizer has ids up to {size - 1} but the embedding has {rows} rows: tokens were added without "
                "model.resize_token_embeddings(len(tokenizer)); resize before training, then merge and save again")


def _deep(view: DirView, out: Collector, headers, stored, expected, progress: bool) -> None:
    for rel, header in headers.items():
        try:
            deep_scan.scan_file(view, rel, header, out, progress=progress)
        except (OSError, NotAFile) as exc:
            out.add("file.unreadable", rel, f"read failed during --deep: {_oserror(exc)}")
    if expected is not None and expected.tied and expected.lm_head_key in stored and expected.embed_key in stored:
        head_rel, head = stored[expected.lm_head_key]
        emb_rel, emb = stored[expected.embed_key]
        if not deep_scan.tensors_equal(view, (head_rel, headers[head_rel], head), (emb_rel, headers[emb_rel], emb)):
            out.add("tied.lm_head_differs", head_rel,
                    f"config ties embeddings but the stored {expected.lm_head_key} differs from {expected.embed_key}: "
                    "loaders disagree (transformers 5 keeps the stored lm_head with a warning, loaders that honour the "
                    "config use the embedding); set tie_word_embeddings=false if lm_head was trained, else drop lm_head")


