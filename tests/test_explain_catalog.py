"""The catalog of the libraries' own messages (harness/explain/data/catalog.json.gz, built by
scripts/explain_catalog.py from the installed venvs): what it records, that it is what the
installed code says, and how explain matches a pasted text against it (whole, cut, wrapped,
decorated) without claiming a kind for text that is not this field's."""

from __future__ import annotations

import importlib.util
import gzip
import json
import re
from pathlib import Path

import pytest

from harness.explain import KINDS, explain
from harness.explain.catalog import DATA, load

ROOT = Path(__file__).resolve().parents[1]
CATALOG = json.loads(gzip.decompress(DATA.read_bytes()))


def _script():
    spec = importlib.util.spec_from_file_location("explain_catalog", ROOT / "scripts" / "explain_catalog.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_catalog_records_its_versions_and_only_declared_kinds():
    libraries = {b["library"]: b for b in CATALOG["libraries"]}
    assert {"vllm", "transformers", "peft", "torch", "bitsandbytes", "accelerate", "safetensors"} <= set(libraries)
    assert all(b["version"] and b["templates"] == sum(1 for r in CATALOG["sites"] if r[0] == b["library"])
               for b in libraries.values())
    assert {r[6] for r in CATALOG["sites"]} - {None} <= set(KINDS)


@pytest.mark.parametrize("library", ["peft", "safetensors", "bitsandbytes"])
def test_the_checked_in_rows_are_what_the_installed_code_raises(library):
    """Rebuilding from the installed package gives the same rows (else: rerun the script)."""
    script = _script()
    site = script._site_packages(ROOT / ".venv")
    block = next(b for b in CATALOG["libraries"] if b["library"] == library)
    if site is None or script._version(site, library) != block["version"]:
        pytest.skip(f"{library} {block['version']} is not the installed version")
    fresh = script.mine(library, site)["rows"]
    assert sorted((r["t"], r["file"], r["line"]) for r in fresh) == \
        sorted((r[1], r[2], r[3]) for r in CATALOG["sites"] if r[0] == library)


def test_a_raise_site_is_where_the_catalog_says():
    site = load().match("ValueError: Target modules {'c_attn'} not found in the base model. Please check the target "
                        "modules and try again.")
    assert site.library == "peft" and site.kind == "peft_config" and site.exception == "ValueError"
    source = next((ROOT / ".venv").glob("lib/python3*/site-packages")) / site.file
    lines = source.read_text().splitlines()[site.line - 1:site.line + 6]
    assert any("not found in the base model" in line for line in lines)


def test_templates_of_each_call_kind():
    script = _script()
    import ast

    code = '''
def f(name, n):
    msg = f"Model {name} has "
    msg += "no tokenizer.json in its directory"
    if n > 3:
        raise ValueError(msg)
    logger.warning("Cannot load %s shards of the checkpoint: %d failed", name, n)
    warnings.warn("The tokenizer {} has no pad token set at all".format(name), FutureWarning)
'''
    visitor = script.Sites(code)
    visitor.visit(ast.parse(code))
    got = {(r["t"], r["exc"], r["if"]) for r in visitor.rows}
    assert got == {("Model {*} has no tokenizer.json in its directory", "ValueError", "n > 3"),
                   ("Cannot load {*} shards of the checkpoint: {*} failed", "logger.warning", None),
                   ("The tokenizer {*} has no pad token set at all", "FutureWarning", None)}


CHAT = ("ValueError: Cannot use chat template functions because tokenizer.chat_template is not set and no template "
        "argument was passed! For information about writing templates and setting the tokenizer.chat_template "
        "attribute, please see the documentation at https://huggingface.co/docs/transformers/main/en/chat_templating")


@pytest.mark.parametrize("text, matched", [
    (CHAT, "whole"),
    (CHAT[:140], "cut"),  # an issue title: the message cut short
    ("\n".join(re.findall(r".{1,79}(?:\s|$)", CHAT)), "whole"),  # wrapped at 80 columns
    ("\n".join(f"(APIServer pid=7) ERROR 01-02 10:00:00 [serving.py:1] {line}" for line in
               re.findall(r".{1,100}(?:\s|$)", CHAT)), "whole"),
])
def test_match_whole_cut_wrapped_and_decorated(text, matched):
    result = explain(text)
    assert result.kind == "chat_template" and result.source["matched"] == matched
    assert result.source["library"] == "transformers" and result.source["file"].endswith("tokenization_utils_base.py")


def test_a_message_only_the_catalog_knows_gets_its_kind_and_raise_site():
    text = ("ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla T4 "
            "GPU has compute capability 7.5. You can use float16 instead by explicitly setting the `dtype` flag in "
            "CLI, for example: --dtype=half.")
    result = explain(text)
    assert result.recognised and result.kind == "vllm_startup"
    assert result.source["library"] == "vllm" and result.source["file"] == "vllm/platforms/cuda.py"


NOT_THIS_FIELD = [  # written for this test: generic errors of other fields, and routine ML log lines
    "TypeError: Foo.__init__() got an unexpected keyword argument 'bar'",
    "AttributeError: 'NoneType' object has no attribute 'shape'",
    "IndexError: list index out of range",
    "npm ERR! code ERESOLVE\nnpm ERR! ERESOLVE unable to resolve dependency tree",
    "django.db.utils.OperationalError: could not connect to server: Connection refused",
    "error: Your local changes to the following files would be overwritten by merge:\n\tsrc/main.py",
    "INFO 12-02 10:11:12 [gpu_model_runner.py:1772] Model loading took 14.99 GiB and 5.2 seconds",
    "{'train_runtime': 120.5, 'train_samples_per_second': 8.3, 'train_loss': 1.02, 'epoch': 3.0}",
    "The quick brown fox jumps over the lazy dog. Please check the documentation and try again.",
]


@pytest.mark.parametrize("text", NOT_THIS_FIELD)
def test_not_this_field_is_not_recognised_and_names_no_library(text):
    result = explain(text)
    assert not result.recognised and result.kind is None and result.source is None
