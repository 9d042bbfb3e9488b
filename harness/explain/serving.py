"""Errors at load or request time in serving stacks: chat templates, tokenizers, and GGUF files
that Ollama or llama.cpp cannot load.

Messages: transformers' "Cannot use chat template functions because tokenizer.chat_template is not
set and no template argument was passed!", vLLM's "As of transformers v4.44, default chat template
is no longer allowed", jinja2's "Conversation roles must alternate user/assistant/...", "System
role not supported"; "Asking to pad but the tokenizer does not have a padding token"; llama.cpp's
"llama_model_load: error loading model: error loading model architecture: unknown model
architecture: 'qwen3'", "gguf_init_from_file: invalid magic characters", "wrong number of
tensors", "key not found in model", Ollama's "llama runner process has terminated".
"""

from __future__ import annotations

from .kinds import declare
from .model import Cause, Context, Finding
from .text import Log

declare("chat_template", "chat template",
        "give the tokenizer a chat template (tokenizer_config.json's chat_template, or vLLM --chat-template FILE), "
        "and send messages in the order and roles the template accepts")
declare("tokenizer", "tokenizer",
        "set the special tokens the call needs (tokenizer.pad_token = tokenizer.eos_token for padding) and install "
        "the tokenizer's backend (sentencepiece, tiktoken, protobuf)")
declare("gguf_load", "GGUF loading (Ollama/llama.cpp)",
        "update Ollama/llama.cpp to a release that knows the architecture, or convert the model again with the "
        "convert_hf_to_gguf.py of the runtime's version; download the file again when its magic or tensor count "
        "is wrong")

_NO_TEMPLATE = (r"tokenizer\.chat_template is not set|default chat template is no longer allowed|"
                r"(?:no|does not have a|doesn't have a) chat[_ ]template|chat_template.{0,30}(?:is None|not found|"
                r"missing)")
_TEMPLATE_RUN = (r"Conversation roles must alternate|System role not supported|TemplateError|"
                 r"jinja2\.exceptions\.\w+|Error (?:in|rendering) (?:the )?chat template|apply_chat_template.{0,80}"
                 r"(?:Error|error)")
_PAD = (r"Asking to pad but the tokenizer does not have a padding token|does not have a padding token|"
        r"pad_token_id.{0,20}(?:is None|not set)|Using pad_token, but it is not set yet")
_BACKEND = (r"requires the (?:protobuf|tiktoken|SentencePiece) library|No module named '(?:sentencepiece|tiktoken|"
            r"google\.protobuf)'|Converting from (?:SentencePiece|Tiktoken) failed")
_GGUF_ARCH = r"unknown model architecture:? '?([\w.-]+)'?|GGUF model with architecture (\w+) is not supported"
_GGUF_FILE = (r"invalid magic characters|gguf_init_from_file\w*: .*(?:failed|invalid)|wrong number of tensors; "
              r"expected (\d+), got (\d+)|key not found in model: ([\w.]+)|error loading model: .+|"
              r"llama_(?:load_)?model_load\w*: .*(?:failed|error)|llama runner process has terminated|"
              r"failed to load model '?[^'\n]*\.gguf|unable to load model: \S+")


def recognise_chat_template(log: Log, ctx: Context) -> list[Finding]:
    m = log.search(_NO_TEMPLATE)
    if m:
        return [Finding("chat_template", "the tokenizer has no chat template, and the request needs one",
                        [Cause("a base (not instruct) model or a directory saved without tokenizer_config.json's "
                               "chat_template; transformers stopped supplying a default template in 4.44",
                               log.line_of(m))],
                        "copy tokenizer_config.json (with chat_template) from the instruct model, pass a template "
                        "(vLLM --chat-template FILE.jinja; apply_chat_template(chat_template=...)), or call the "
                        "completions API with a plain prompt.", score=85, position=m.end())]
    m = log.search(_TEMPLATE_RUN)
    if not m:
        return []
    return [Finding("chat_template", "the chat template refused the request's messages",
                    [Cause("the template raises on this conversation: roles that do not alternate user/assistant, a "
                           "system message the model's template does not support, or a field (tools, images) it does "
                           "not handle", log.line_of(m))],
                    "send messages the template accepts (merge the system prompt into the first user turn; strictly "
                    "alternate user/assistant), or serve with a template that handles them (--chat-template).",
                    score=75, position=m.end())]


def recognise_tokenizer(log: Log, ctx: Context) -> list[Finding]:
    out = []
    m = log.search(_PAD)
    if m:
        out.append(Finding("tokenizer", "the tokenizer has no padding token and the call pads",
                           [Cause("many causal LMs (Llama, Mistral, GPT-2) ship without a pad token", log.line_of(m))],
                           "set tokenizer.pad_token = tokenizer.eos_token (and model.config.pad_token_id to match), "
                           "or add a pad token and resize_token_embeddings; in training mask padding with -100.",
                           score=75, position=m.end()))
    m = log.search(_BACKEND)
    if m:
        out.append(Finding("tokenizer", "the tokenizer's backend library is missing",
                           [Cause("the tokenizer needs a package that is not installed (sentencepiece, tiktoken or "
                                  "protobuf) to load or convert its vocabulary", log.line_of(m))],
                           "pip install sentencepiece protobuf tiktoken (the one the message names).",
                           score=70, position=m.end()))
    return out


def recognise_gguf(log: Log, ctx: Context) -> list[Finding]:
    a, f = log.search(_GGUF_ARCH), log.search(_GGUF_FILE)
    if not (a or f):
        return []
    if not (a or log.has(r"gguf|llama\.cpp|llama_model|ollama|llama runner|llama-server|llama_load")):
        return []
    causes = []
    if a:
        arch = a.group(1) or a.group(2)
        causes.append(Cause(f"this Ollama/llama.cpp (or transformers' GGUF reader) does not know the architecture "
                            f"'{arch}': the model is newer than the runtime", log.line_of(a)))
    if f:
        text = f.group(0)
        if "magic" in text:
            causes.append(Cause("the file is not GGUF (an HTML page or a git-lfs pointer saved under the name, or a "
                                "cut download)", log.line_of(f)))
        elif f.group(1):
            causes.append(Cause(f"the file has {f.group(2)} tensors where the runtime expects {f.group(1)}: converted "
                                "by a different llama.cpp version (or a multimodal projector split off)", log.line_of(f)))
        elif f.group(3):
            causes.append(Cause(f"the GGUF metadata lacks {f.group(3)}: converted by an older or newer converter "
                                "than this runtime", log.line_of(f)))
        elif not a:
            causes.append(Cause("llama.cpp could not load the model file: an architecture or quantization type the "
                                "runtime does not know, a cut download, or too little memory", log.line_of(f)))
    fix = ("update Ollama / llama.cpp to a release that lists the architecture (the model's release notes name the "
           "version), or convert the model again with the convert_hf_to_gguf.py of the runtime you run; when the "
           "magic or the tensor count is wrong, download the file again and compare its size and sha256")
    return [Finding("gguf_load", "Ollama / llama.cpp could not load the GGUF model", causes, fix + ".", score=78,
                    position=max(x.end() for x in (a, f) if x))]


RECOGNISERS = (recognise_chat_template, recognise_tokenizer, recognise_gguf)
