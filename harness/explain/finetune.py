"""Fine-tuning set-up errors: the PEFT configuration, the trainer API between releases, and the
quantization config a loader looks for.

Messages (from the libraries' own raise sites, see the catalog): peft's "Target modules {...} not
found in the base model. Please check the target modules and try again.", "Please specify
`target_modules` in `peft_config`", "Cannot merge ia3 layers when the model is loaded in 4-bit
mode", lora/bnb's "Merge lora module to 4-bit linear may get different generations due to rounding
errors."; Python's "SFTTrainer.__init__() got an unexpected keyword argument 'tokenizer'" when an
argument was renamed or moved between TRL/transformers releases; transformers' "The model's
quantization config from the arguments has no `quant_method` attribute", vLLM's "Cannot find the
config file for gptq" (quantize_config.json / quant_config.json missing).
"""

from __future__ import annotations

import re

from .kinds import declare
from .model import Cause, Context, Finding
from .text import Log

declare("peft_config", "PEFT configuration",
        "name target_modules that exist in this base model (print([n for n, _ in model.named_modules()]) shows "
        "them), and merge adapters into a bf16/fp16 copy of the base, not a 4-bit one")
declare("trainer_api", "trainer/TRL API",
        "pass the argument under the name the installed release uses (inspect.signature(SFTConfig) / "
        "TrainingArguments shows them), or pin the release the script was written for")
declare("quant_config", "quantization config",
        "give the loader the quantization config it expects: quantization_config (with quant_method) in "
        "config.json, or the quantize_config.json / quant_config.json the quantizer wrote beside the weights")

_TARGETS = (r"Target modules? \{?\[?([^}\]\n]*?)\]?\}? (?:not found in the base model|is not found in the base model)|"
            r"Please specify `target_modules`(?: or `target_parameters`)? ?in `peft_config`|"
            r"Target module (\S+) is not supported")
_MERGE_4BIT = (r"Cannot merge \w+ layers when the model is loaded in (?:4|8)-bit mode|Merge lora module to (4|8)-bit "
               r"linear may get different generations|merge_and_unload.{0,80}(?:4-?bit|Params4bit|quantized)|"
               r"(?:4-?bit|quantized) (?:model|base).{0,60}merg\w*.{0,40}(?:not supported|cannot|error)")
_UNEXPECTED = r"(\w*(?:Trainer|Config|Arguments))\.__init__\(\) got an unexpected keyword argument '(\w+)'"
# Renamed or moved arguments: (argument) -> what the current releases take. Checked against the
# installed signatures (transformers 5.25.0: TrainingArguments has eval_strategy and no
# evaluation_strategy, Trainer has processing_class and no tokenizer; trl 1.16.0: SFTConfig has
# max_length, dataset_text_field and packing, no max_seq_length); an argument not listed gets the
# general fix.
RENAMED = {
    "tokenizer": "processing_class (transformers' Trainer from 4.46 and TRL's trainers from 0.12 renamed it; the "
                 "old name was removed later)",
    "evaluation_strategy": "eval_strategy (TrainingArguments, renamed in transformers 4.41; the old name was removed)",
    "max_seq_length": "max_length on SFTConfig (recent TRL releases); in older ones max_seq_length belonged to "
                      "SFTConfig, not to SFTTrainer",
    "dataset_text_field": "SFTConfig(dataset_text_field=...) (TRL moved it off SFTTrainer)",
    "packing": "SFTConfig(packing=...) (TRL moved it off SFTTrainer)",
    "use_auth_token": "token (transformers and huggingface_hub renamed it)",
}
_QUANT = (r"has no `quant_method` attribute|Cannot find the config file for (\w+)|quantize_config\.json|"
          r"quant_config\.json.{0,40}(?:not found|missing|no such)|(?:not|no) (?:find|found).{0,40}"
          r"quantization[_ ]config|Unknown quantization type|quant_method.{0,40}(?:not supported|unknown|missing)")


def recognise_peft(log: Log, ctx: Context) -> list[Finding]:
    out = []
    m = log.search(_TARGETS)
    if m:
        named = (m.group(1) or m.group(2) or "").strip()
        out.append(Finding(
            "peft_config", "the LoRA target modules are not in this base model",
            [Cause(f"target_modules{' ' + named if named else ''} name modules this architecture does not have "
                   "(names differ per family: q_proj/v_proj in Llama-likes, query_key_value in Falcon/GPT-NeoX, "
                   "c_attn in GPT-2, Wqkv in others)", log.line_of(m))],
            "list the model's Linear modules (print({n.split('.')[-1] for n, m in model.named_modules() if "
            "isinstance(m, torch.nn.Linear)})) and use those names, or target_modules='all-linear'.",
            score=85, position=m.end(), figures_from_log={"target_modules": named} if named else {}))
    m = log.search(_MERGE_4BIT)
    if m:
        warning = "may get different generations" in m.group(0)
        out.append(Finding(
            "peft_config", "the adapter is being merged into a quantized (4/8-bit) base",
            [Cause("merging adds the LoRA delta to weights that are then re-quantized (rounding errors), or the "
                   "quantized layer cannot take a merge at all", log.line_of(m))],
            "load the base again in bf16/fp16 (no quantization_config), PeftModel.from_pretrained(base, adapter), "
            "merge_and_unload(), save; quantize the merged model afterwards if it must be small.",
            score=60 if warning else 85, position=m.end()))
    return out


def recognise_trainer_api(log: Log, ctx: Context) -> list[Finding]:
    m = log.search(_UNEXPECTED)
    if not m or not re.search(r"Trainer|TrainingArguments|SFT|DPO|GRPO|PPO|ORPO|KTO|Reward|trl", m.group(1) + log.text):
        return []
    cls, arg = m.group(1), m.group(2)
    renamed = RENAMED.get(arg)
    cause = (f"{cls} of the installed release has no argument {arg!r}: "
             + (f"it is now {renamed}" if renamed else "it was renamed, moved to the config class, or removed "
                "between releases (the script was written for another version)"))
    fix = (f"use {renamed.split(' (')[0]} instead of {arg}" if renamed else
           f"look up the installed signature (python -c \"import inspect, trl, transformers; "
           f"print(inspect.signature(...{cls}))\") and pass {arg} under its current name or on the config class")
    packages = "lightning" if log.has(r"lightning") else "trl transformers"
    fix += f"; or pin the {packages.replace(' ', '/')} versions the script was written for (pip show {packages})."
    return [Finding("trainer_api", f"{cls} does not take {arg!r} in the installed release", [Cause(cause, log.line_of(m))],
                    fix, score=85, position=m.end(), figures_from_log={"class": cls, "argument": arg})]


def recognise_quant_config(log: Log, ctx: Context) -> list[Finding]:
    m = log.search(_QUANT)
    if not m:
        return []
    method = m.group(1) if m.lastindex and m.group(1) else None
    return [Finding("quant_config", "the loader did not find the quantization config it needs",
                    [Cause("the directory's quantization metadata is missing or incomplete: config.json lacks "
                           "quantization_config/quant_method, or the quantizer's quantize_config.json "
                           f"{'(for ' + method + ') ' if method else ''}was not copied with the weights",
                           log.line_of(m))],
                    "copy quantize_config.json (GPTQ/AWQ) or the quantization_config block of config.json from the "
                    "quantized checkpoint's source; do not pass a quantization method the directory was not made "
                    "with (vLLM: drop --quantization to let it read the config).", score=80, position=m.end(),
                    figures_from_log={"method": method} if method else {})]


RECOGNISERS = (recognise_peft, recognise_trainer_api, recognise_quant_config)
