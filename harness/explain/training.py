"""Non-finite losses and gradients in training logs, and model directories that do not load.

NaN: HF Trainer's log dicts ({'loss': 0.0, 'grad_norm': nan, ...}), "loss: nan", progress-bar
postfixes (avr_loss=nan), autograd's anomaly mode ("returned nan values"), peft's safe_merge.
Model directories: vLLM's "There is no module or parameter named 'base_model'" (leftover adapter
keys), torch's "size mismatch for X: copying a param with shape ... from checkpoint", missing and
unexpected keys, safetensors' "Error while deserializing header: HeaderTooLarge" / "header too
large" / "incomplete metadata", and files transformers cannot find.
"""

from __future__ import annotations

import re

from .model import Cause, Context, Finding
from .text import Log
from .kinds import declare

declare("nan_loss", "NaN loss",
        "train in bf16 (or fp32) instead of fp16, lower the learning rate and clip gradients, mask padding "
        "with -100")
declare("model_dir", "model directory",
        "copy the complete model directory (config, every shard, tokenizer files); python -m harness check-"
        "dir DIR lists what is wrong")


_NAN = (r"['\"]?(?:train_)?(?:loss|grad_norm|avr_loss|train_loss|eval_loss)['\"]?\s*[:=]\s*['\"]?(?:nan|-?inf)\b|"
        r"\bloss (?:is|became|=) ?(?:nan|inf)\b|returned nan values in its \d+\w* output|"
        r"grad_norm\s+is\s+nan|grad_norm.{0,60}\bnan\b|(?:adapter|weights|loss) (?:is|are|became) (?:entirely |all )?NaN|\bNaN (?:loss|detected)|non-finite (?:loss|value)|"
        r"Loss is NaN|NaNs detected in the merged weights")
_BF16_OLD_CARD = (r"Tesla T4|Tesla V100|\bT4\b|\bV100\b|P100|RTX 20\d0|GTX 1\d{3}|compute capability:? \(?[3-7]\.\d|"
                  r"sm_[3-7]\d\b|Your setup doesn't support bf16|bf16.{0,40}(?:requires|only supported).{0,60}(?:Ampere|8\.0)")
_HUGE_GRAD = r"grad_norm['\"]?\s*[:=]\s*([\d.]+e\+?\d+|\d{5,}(?:\.\d+)?)|grad_norm.{0,30}(\d(?:\.\d)?)\s*million"


def recognise_nan(log: Log, ctx: Context) -> list[Finding]:
    m = log.search(_NAN)
    if not m:
        return []
    evidence = log.line_of(m)
    causes = []
    fp16 = log.search(r"--fp16(?:\s+True)?\b|fp16\s*=\s*True|\bfloat16\b|torch\.float16|\bhalf\b")
    if fp16:
        causes.append(Cause("fp16 overflows (max 65504): activations or gradients become inf, then NaN; bf16 has "
                            "fp32's range", log.line_of(fp16)))
    old_card = log.search(_BF16_OLD_CARD)
    if old_card and log.has(r"bf16|bfloat16"):
        causes.insert(0, Cause("bf16 on a card older than Ampere (compute capability < 8.0: T4, V100, RTX 20xx): "
                               "it has no bf16 units, so bf16 runs emulated or falls back, and the loss goes NaN",
                               log.line_of(old_card)))
    huge = log.search(_HUGE_GRAD)
    if huge:
        causes.append(Cause("the gradient norm exploded before the NaN: the learning rate is too high or gradients "
                            "are not clipped", log.line_of(huge)))
    if log.has(r"'loss':\s*0\.0\b.*grad_norm['\"]?:\s*nan|grad_norm['\"]?:\s*nan.*'loss':\s*0\.0\b"):
        causes.append(Cause("loss 0.0 with a NaN gradient norm: the weights already hold NaN (the step after the "
                            "first non-finite update) or every label is masked", log.evidence(r"'loss':\s*0\.0") or evidence))
    if log.has(r"pad|-100|label"):
        causes.append(Cause("labels: padding not masked with -100, or every label masked (0/0 in the mean loss)",
                            log.evidence(r"pad\w*|-100|label\w*") or evidence))
    if not causes:
        causes.append(Cause("a non-finite loss: overflow in fp16, too high a learning rate, bad labels or inputs",
                            evidence))
    fix = ("train in bf16 instead of fp16 where the card supports it (compute capability >= 8.0; for 4-bit bases "
           "set bnb_4bit_compute_dtype=bfloat16), or fp32; lower the learning rate and clip gradients "
           "(max_grad_norm=1.0); mask padding with -100 and check no batch has every label masked; run the "
           "harness's NaN suite (pytest suites/nan) to find the first module that goes non-finite")
    if old_card and log.has(r"bf16|bfloat16"):
        fix = ("on this pre-Ampere card train in fp16 with loss scaling (--fp16, bnb_4bit_compute_dtype=float16) or "
               "fp32, not bf16; " + fix)
    # a NaN loss with bf16 on an old card is the NaN's cause, not a driver problem: it outranks the
    # "bf16 needs Ampere" line the stack recogniser reads as driver_cuda_mismatch (75)
    return [Finding("nan_loss", "the training loss or gradient norm became NaN/Inf", causes, fix + ".",
                    score=78 if old_card and log.has(r"bf16|bfloat16") else 60,
                    position=m.end(), figures_from_log={"line": evidence})]


_SIZE_MISMATCH = (r"size mismatch for ([\w.]+): copying a param with shape torch\.Size\(\[([\d, ]*)\]\) from "
                  r"checkpoint,\s*the shape in\s*current model is torch\.Size\(\[([\d, ]*)\]\)")
_HEADER = r"HeaderTooLarge|header too large|MetadataIncompleteBuffer|incomplete metadata|Error while deserializing header"
_BASE_MODEL = r"There is no module or parameter named '(base_model|[\w.]*lora_[AB][\w.]*|[\w.]*base_layer[\w.]*)'"
_ARCH_UNKNOWN = r"has model type `(\w+)` but Transformers does not recognize this architecture"
_MISSING = (r"Missing key\(s\) in state_dict|Unexpected key\(s\) in state_dict|does not appear to have a file named "
            r"(config\.json|pytorch_model\.bin|model\.safetensors)|Error no file named (pytorch_model\.bin|model\.safetensors)")


def _shapes(text: str) -> list[int]:
    return [int(x) for x in text.replace(" ", "").split(",") if x]


def _size_mismatch(log: Log, m: re.Match) -> Finding:
    name, ckpt, model = m.group(1), _shapes(m.group(2)), _shapes(m.group(3))
    evidence = log.line_of(m)
    if "lora_" in name and ckpt == [0]:
        cause = Cause("the adapter file holds empty tensors (shape [0]): it was saved from a sharded run "
                      "(DeepSpeed ZeRO-3 or FSDP) without gathering the parameters", evidence)
        fix = ("save again with the parameters gathered: with ZeRO-3 set stage3_gather_16bit_weights_on_model_save "
               "(or save accelerator.get_state_dict(model)); with FSDP use a FULL_STATE_DICT before save_pretrained")
    elif "lora_" in name:
        rank_ckpt, rank_model = min(ckpt) if ckpt else None, min(model) if model else None
        cause = Cause(f"the adapter and the model disagree: LoRA rank {rank_ckpt} in the checkpoint, {rank_model} in "
                      f"the model built to receive it (or a different base model)", evidence)
        fix = ("load the adapter with its own adapter_config.json (PeftModel.from_pretrained(base, adapter_dir), no "
               "new LoraConfig), on the same base model it was trained on")
    elif re.search(r"embed_tokens|lm_head|wte|word_embeddings", name):
        cause = Cause(f"the vocabulary size differs ({ckpt[0] if ckpt else '?'} rows in the checkpoint, "
                      f"{model[0] if model else '?'} in the model): tokens were added", evidence)
        fix = "call model.resize_token_embeddings(len(tokenizer)) before loading, with the tokenizer saved with it"
    else:
        cause = Cause(f"{name} has shape {ckpt} in the checkpoint and {model} in the model: a config that does not "
                      "match the weights", evidence)
        fix = "load with the config.json saved beside these weights (same architecture and sizes)"
    return Finding("model_dir", "the weights do not fit the model they are loaded into (size mismatch)", [cause],
                   fix + ".", score=80, position=m.end(),
                   figures_from_log={"parameter": name, "checkpoint_shape": ckpt, "model_shape": model})


def recognise_model_dir(log: Log, ctx: Context) -> list[Finding]:
    out = []
    m = log.search(_SIZE_MISMATCH)
    if m:
        out.append(_size_mismatch(log, m))
    m = log.search(_BASE_MODEL)
    if m:
        out.append(Finding("model_dir", "the directory still holds PEFT adapter keys vLLM cannot map",
                           [Cause(f"'{m.group(1)}' is a PEFT wrapper/adapter name: the adapter was saved instead of "
                                  "the merged model (merge_and_unload's result not kept)", log.line_of(m))],
                           "merged = peft_model.merge_and_unload(); merged.save_pretrained(DIR) (the returned model, "
                           "not the PeftModel); or serve the adapter with --enable-lora --lora-modules; "
                           "python -m harness check-dir DIR finds leftover adapter keys.", score=85, position=m.end()))
    m = log.search(_HEADER)
    if m:
        out.append(Finding("model_dir", "a .safetensors file could not be read",
                           [Cause("the file is not safetensors: a git-lfs pointer (a ~130-byte text file) or an HTML "
                                  "error page saved under the weight's name, or a download cut short", log.line_of(m)),
                            Cause("rarely: a genuine header over safetensors' 100 MB limit (millions of tensors), or "
                                  "an old safetensors release misreading the file", log.line_of(m))],
                           "download the weights again (git lfs pull, or huggingface-cli download; compare the file "
                           "size with the hub's), then python -m harness check-dir DIR --deep; if the file is whole, "
                           "upgrade safetensors.", score=80, position=m.end()))
    m = log.search(_ARCH_UNKNOWN)
    if m:
        out.append(Finding("model_dir", f"this transformers does not know the model type `{m.group(1)}`",
                           [Cause("the checkpoint is newer than the installed transformers (or its config.json names a "
                                  "wrong model_type)", log.line_of(m))],
                           "pip install --upgrade transformers (a model newer than the last release needs the "
                           "version its model card names); check config.json's model_type.", score=80, position=m.end()))
    m = log.search(_MISSING)
    if m:
        out.append(Finding("model_dir", "the model directory is missing files or tensors the loader expects",
                           [Cause("weights saved from a different model class or an incomplete copy of the directory",
                                  log.line_of(m))],
                           "copy the complete directory (config.json, every shard the index names, tokenizer files); "
                           "python -m harness check-dir DIR lists what is missing.", score=70, position=m.end()))
    return out


RECOGNISERS = (recognise_nan, recognise_model_dir)
