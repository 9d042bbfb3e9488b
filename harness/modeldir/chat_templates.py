"""Chat templates, rendered the way transformers renders them, in the bounded reading child.

Where they live (transformers 5 reads all of them): tokenizer_config.json's `chat_template` (a
string, or a list of {name, template}), chat_template.jinja, chat_template.json and
processor_config.json ({"chat_template": ...}), additional_chat_templates/*.jinja. Each is
compiled by transformers' own `_compile_jinja_template` (jinja2's ImmutableSandboxedEnvironment with trim_blocks,
lstrip_blocks, loopcontrols, the generation tracker, and its raise_exception / strftime_now /
dict / namespace globals) and rendered on CONVERSATIONS with the tokenizer's special tokens, as
`apply_chat_template` passes them, under RENDER_SECONDS, RENDER_MEMORY_BYTES and OUTPUT_CHARS.

Verdicts: a template that does not compile, escapes the sandbox (SecurityError, on any
conversation), runs over the time, memory or output limit, or fails on the plainest
conversation (one user turn) is an error: vLLM's and transformers' chat endpoints would fail on
every request. A template's own raise_exception on the other conversations (no system role,
turns that must alternate) is its rule, not a fault.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from .findings import Collector
from .paths import DirView, NotAFile, PathEscape

RENDER_SECONDS = 5.0
RENDER_MEMORY_BYTES = 1024 ** 3
OUTPUT_CHARS = 1024 * 1024  # a rendered prompt over a million characters for a three-turn chat

CONVERSATIONS = (
    ("one user turn", [{"role": "user", "content": "Hello, who are you?"}]),
    ("system + user", [{"role": "system", "content": "You are a helpful assistant."},
                       {"role": "user", "content": "What is 2 + 2?"}]),
    ("three turns", [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4."},
                     {"role": "user", "content": "And 3 + 3?"}]),
)
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


@dataclass
class TemplateRead:
    where: str
    errors: list[str] = field(default_factory=list)  # fatal: unsafe, over a limit, broken
    refusals: list[str] = field(default_factory=list)  # the template's own raise_exception on a conversation


def templates(view: DirView) -> tuple[dict[str, str], dict]:
    """(where -> template text, special tokens) of every chat template the directory holds."""
    found: dict[str, str] = {}
    tok_config = _json(view, "tokenizer_config.json")
    specials = {}
    if isinstance(tok_config, dict):
        for key in SPECIAL_KEYS:
            value = tok_config.get(key)
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str):
                specials[key] = value
        _add(found, "tokenizer_config.json", tok_config.get("chat_template"))
    for rel in ("chat_template.json", "processor_config.json"):  # a processor's template lives in either
        data = _json(view, rel)
        if isinstance(data, dict):
            _add(found, rel, data.get("chat_template"))
    for rel in sorted(view.entries):
        if rel == "chat_template.jinja" or (rel.startswith("additional_chat_templates/") and rel.endswith(".jinja")):
            text = _text(view, rel)
            if text is not None:
                found[rel] = text
    return found, specials


def _add(found: dict[str, str], where: str, value) -> None:
    if isinstance(value, str):
        found[where] = value
    elif isinstance(value, list):  # named templates: [{"name": ..., "template": ...}]
        for item in value:
            if isinstance(item, dict) and isinstance(item.get("template"), str):
                found[f"{where} ({item.get('name')!s})"] = item["template"]


def _json(view: DirView, rel: str):
    if not view.exists(rel):
        return None
    try:
        return view.read_json(rel)
    except (ValueError, OSError, NotAFile, PathEscape):
        return None  # reported by the checks that own the file


def _text(view: DirView, rel: str) -> str | None:
    if not view.exists(rel):
        return None
    try:
        return view.read_bytes(rel, OUTPUT_CHARS * 4).decode("utf-8", errors="replace")
    except (OSError, NotAFile, PathEscape):
        return None


def check_templates(view: DirView, out: Collector) -> None:
    from . import verdict_cache

    found, specials = templates(view)
    keys = {where: verdict_cache.key("template", [text, specials], "chat_templates.py") for where, text in found.items()}
    found = {where: text for where, text in found.items() if verdict_cache.load(keys[where]) != "clean"}
    if not found:
        return  # none, or each rendered cleanly before with these versions: no jinja2 / transformers import
    from .read_child import ReadFailure, read_all

    _preload()
    reader = functools.partial(_render_job, found, specials)
    results = read_all([(where, where) for where in found], seconds=RENDER_SECONDS, memory=RENDER_MEMORY_BYTES,
                       reader=reader)
    for where, result in results.items():
        if isinstance(result, TemplateRead) and not result.errors:
            verdict_cache.save(keys[where], "clean")
    for where, result in results.items():
        path = where.split(" (", 1)[0]
        if isinstance(result, ReadFailure):
            out.add("chat_template.unsafe", path,
                    f"{where}: rendering it on a short chat {result.reason.replace('reading it ', '')}: every chat "
                    "request would hang or exhaust the server (a template loop or string repeat); replace the template")
            continue
        for error in result.errors[:3]:
            unsafe = "SecurityError" in error or "characters for a" in error
            code = "chat_template.unsafe" if unsafe else "chat_template.invalid"
            out.add(code, path, f"{where}: {error}")


class _Flood(Exception):
    """The rendered prompt ran over OUTPUT_CHARS."""


def _preload() -> None:
    try:
        import jinja2  # noqa: F401
        from transformers.utils import chat_template_utils  # noqa: F401
    except Exception:  # noqa: BLE001 - the child reports it
        pass


def _render_job(found: dict[str, str], specials: dict, where: str, _rel: str) -> TemplateRead:
    """In the child: compile and render one template on every conversation."""
    read = TemplateRead(where)
    try:
        from jinja2.exceptions import SecurityError, TemplateError
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except Exception as exc:  # noqa: BLE001 - fail closed
        read.errors.append(f"cannot be verified: transformers' template renderer is not importable ({exc})")
        return read
    try:
        compiled = _compile_jinja_template(found[where])
    except Exception as exc:  # noqa: BLE001 - jinja2's refusal (syntax) is the verdict
        read.errors.append(f"does not compile in transformers' jinja2 sandbox ({_sentence(exc)}): "
                           "apply_chat_template fails on every request; fix the template")
        return read
    for label, messages in CONVERSATIONS:
        try:
            size = 0
            for piece in compiled.generate(messages=messages, tools=None, documents=None,
                                           add_generation_prompt=True, **specials):
                size += len(piece)
                if size > OUTPUT_CHARS:
                    raise _Flood(f"renders more than {OUTPUT_CHARS:,} characters")
        except SecurityError as exc:
            read.errors.append(f"escapes jinja2's sandbox on a {label} chat (SecurityError: {_sentence(exc)}): "
                               "transformers and vLLM refuse it at chat time; a template must not reach Python "
                               "internals: replace it")
        except _Flood as exc:
            read.errors.append(f"{exc} for a {label} chat: a template flood would exhaust the server; replace it")
        except TemplateError as exc:
            if label == CONVERSATIONS[0][0] or type(exc) is not TemplateError:  # raise_exception's own type
                read.errors.append(f"fails on a {label} chat ({type(exc).__name__}: {_sentence(exc)}): "
                                   "apply_chat_template raises the same; fix the template")
            else:
                read.refusals.append(f"{label}: {_sentence(exc)}")
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - a render that raises is a broken template
            read.errors.append(f"fails on a {label} chat ({type(exc).__name__}: {_sentence(exc)}): "
                               "apply_chat_template raises the same; fix the template")
    return read


def _sentence(exc: Exception) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__
