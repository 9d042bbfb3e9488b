"""The whole-directory rules of issue 43, applied by check_dir after the loader reads.

- code paths (harness.modeldir.code_paths),
- what the loaders' own parsers refused in the reading child (LoaderRead.format_errors: the
  safetensors library for every header, tokenizers for tokenizer.json, sentencepiece for
  tokenizer.model),
- links that lead nowhere (a loop, a dangling target): transformers skips such a file silently
  (a tokenizer_config.json loop loses the chat template and special tokens),
- chat templates (harness.modeldir.chat_templates),
- numbers in config.json and generation_config.json (harness.modeldir.config_values).
"""

from __future__ import annotations

from . import chat_templates, code_paths, config_values
from .findings import Collector
from .loader_views import LoaderRead
from .paths import DirView, NotAFile, PathEscape
from .safetensors_header import HeaderProblem, read_header


def check_directory(view: DirView, out: Collector, reads: dict, allow_remote_code: bool) -> set[str]:
    """Returns the safetensors files found unreadable (already reported: the weights check skips them)."""
    code_paths.check_code_paths(view, out, allow_remote_code)
    refused = set()
    for rel in sorted(reads):
        read = reads[rel]
        if not isinstance(read, LoaderRead):
            continue
        for code, message in read.format_errors:
            if code.startswith("safetensors."):
                refused.add(rel)
                problem = _own_header_problem(view, rel)  # a more telling name: LFS pointer, truncated ...
                code, message = (problem.code, problem.message) if problem else (code, message)
            elif rel == "tokenizer.json" and not _json_parses(view, rel):
                continue  # not JSON at all: the tokenizer check's own tokenizer.invalid says so
            out.add(code, rel, message)
    _broken_links(view, out)
    chat_templates.check_templates(view, out)
    for rel in config_values.FILES:
        if view.exists(rel):
            try:
                data = view.read_json(rel)
            except (ValueError, OSError, NotAFile, PathEscape):
                continue  # reported as invalid by the check that owns the file
            config_values.check_values(rel, data, out)
    return refused


def _json_parses(view: DirView, rel: str) -> bool:
    try:
        view.read_json(rel)
        return True
    except (ValueError, OSError, NotAFile, PathEscape):
        return False


def _own_header_problem(view: DirView, rel: str) -> HeaderProblem | None:
    try:
        with view.open_binary(rel) as fh:
            read_header(fh, view.size(rel))
    except HeaderProblem as problem:
        return problem
    except (OSError, NotAFile, PathEscape):
        return None
    return None


def _broken_links(view: DirView, out: Collector) -> None:
    import os

    for rel, entry in view.entries.items():
        if entry.kind != "symlink" or not entry.inside or os.path.exists(entry.target or ""):
            continue
        try:
            os.stat(view.root / rel)
            why = "cannot be resolved"
        except OSError as exc:
            why = "is a symlink loop" if exc.errno == 40 else f"points at nothing ({exc.strerror})"
        out.add("file.unreadable", rel,
                f"{rel} {why}: the loaders skip it silently (a tokenizer_config.json loop loses the chat template "
                "and special tokens); replace it with the real file")
