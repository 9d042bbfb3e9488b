"""Every path by which loading the directory runs code (issue 43).

- `auto_map` in any JSON file of the directory: transformers reads it from config.json,
  tokenizer_config.json, preprocessor_config.json (AutoImageProcessor, AutoFeatureExtractor),
  processor_config.json, video_preprocessor_config.json, audio_tokenizer_config.json ... and
  `Auto*.from_pretrained(..., trust_remote_code=True)` imports the class it names. A value
  `repo--module.Class` names code in another Hub repository (get_class_from_dynamic_module splits
  at "--"): nothing of it is in the directory, and it runs all the same. A tokenizer's entry is a
  [slow, fast] pair.
- `custom_generate/generate.py`: GenerationMixin.load_custom_generate runs it when the model is
  loaded with trust_remote_code=True, no auto_map needed.
- any other `.py`: the modules an auto_map names import their neighbours.

Each is an error naming the file and what would run it; --allow-remote-code makes them warnings.
"""

from __future__ import annotations

from .findings import WARNING, Collector
from .paths import DirView, NotAFile, PathEscape

CUSTOM_GENERATE = "custom_generate/generate.py"


def check_code_paths(view: DirView, out: Collector, allow_remote_code: bool) -> None:
    severity = WARNING if allow_remote_code else None
    imported: set[str] = set()
    for rel in sorted(view.entries):
        if not rel.endswith(".json") or not view.exists(rel):
            continue
        auto_map = _auto_map(view, rel)
        if not auto_map:
            continue
        for auto_class, reference in _references(auto_map):
            remote, module = _split(reference)
            runs = f"{auto_class}.from_pretrained(DIR, trust_remote_code=True)"
            if remote:
                out.add("safety.remote_code", rel,
                        f"auto_map {auto_class} -> {reference}: {runs} downloads and runs {module}.py from the Hub "
                        f"repository {remote} (not in this directory): remove auto_map, or pass --allow-remote-code "
                        "after reviewing that repository", severity=severity)
                continue
            local = _module_file(rel, module)
            imported.add(local)
            present = "" if view.exists(local) else f" ({local} is not here: loading fails after trusting it)"
            out.add("safety.remote_code", rel,
                    f"auto_map {auto_class} -> {reference}: {runs} imports and runs {local}{present}: remove "
                    "auto_map for a built-in class, or pass --allow-remote-code after reviewing it", severity=severity)
    for rel in sorted(view.entries):
        if not rel.endswith(".py") or not view.exists(rel):
            continue
        if rel == CUSTOM_GENERATE:
            why = ("model.generate() is replaced by its generate() whenever the model is loaded with "
                   "trust_remote_code=True (GenerationMixin.load_custom_generate; no auto_map needed)")
        elif rel in imported:
            why = "an auto_map names it: trust_remote_code=True imports and runs it"
        else:
            why = "Python code in a model directory runs under trust_remote_code (modules an auto_map names import it)"
        out.add("safety.python_file", rel, f"{why}: remove it, or pass --allow-remote-code if you reviewed it",
                severity=severity)


def _auto_map(view: DirView, rel: str):
    try:
        data = view.read_json(rel)
    except (ValueError, OSError, NotAFile, PathEscape):
        return None  # reported by the check that owns the file (or not a file a loader reads)
    return data.get("auto_map") if isinstance(data, dict) else None


def _references(auto_map):
    """(auto class, class reference) pairs; a tokenizer's [slow, fast] pair gives two."""
    if isinstance(auto_map, list):  # very old tokenizer configs: a bare [slow, fast] pair
        auto_map = {"AutoTokenizer": auto_map}
    if not isinstance(auto_map, dict):
        yield "auto_map", repr(auto_map)[:80]
        return
    for auto_class, value in auto_map.items():
        for reference in value if isinstance(value, (list, tuple)) else [value]:
            if reference is not None:
                yield str(auto_class), str(reference)


def _split(reference: str) -> tuple[str | None, str]:
    """(remote repository or None, module) of `repo--module.Class` / `module.Class`."""
    remote = None
    if "--" in reference:
        remote, reference = reference.split("--", 1)
    module = reference.rsplit(".", 1)[0] if "." in reference else reference
    return remote, module


def _module_file(rel: str, module: str) -> str:
    folder = rel.rsplit("/", 1)[0] + "/" if "/" in rel else ""
    return f"{folder}{module.replace('.', '/')}.py"
