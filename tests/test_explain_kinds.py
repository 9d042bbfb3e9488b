"""The kinds registry (each kind declared once, by its recogniser) and the families added to it:
PEFT configuration, trainer/TRL API, CUDA under multiprocessing, quantization config, chat template,
tokenizer, GGUF loading. The messages are the libraries' own raise-site strings (peft, transformers,
torch, vLLM at the installed versions) or llama.cpp's log lines, filled in as a user would see them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.explain import KINDS, explain
from harness.explain.kinds import REGISTRY, declare
from harness.explain.model import Cause, Finding

DESIGN_KINDS = ("cuda_oom", "host_oom", "driver_cuda_mismatch", "bnb_setup", "nan_loss", "vllm_startup", "model_dir",
                "gpu_hardware", "nccl")
DOCS = Path(__file__).resolve().parents[1] / "docs" / "explain.md"


def test_the_contract_kinds_keep_their_names_and_new_ones_are_declared_once():
    assert set(DESIGN_KINDS) <= set(KINDS) and len(KINDS) == len(set(KINDS)) == len(REGISTRY)
    with pytest.raises(ValueError, match="declared twice"):
        declare("cuda_oom", "again", "x")
    with pytest.raises(ValueError, match="not declared"):
        Finding("no_such_kind", "x", [Cause("c", "e")], "fix")


def test_docs_table_lists_exactly_the_registry():
    rows = set(re.findall(r"^\| `(\w+)` \|", DOCS.read_text(), re.M))
    assert rows == set(KINDS)


@pytest.mark.parametrize("text, kind, must", [
    ("ValueError: Target modules {'q_proj', 'v_proj'} not found in the base model. Please check the target modules "
     "and try again.", "peft_config", "all-linear"),
    ("UserWarning: Merge lora module to 4-bit linear may get different generations due to rounding errors.",
     "peft_config", "bf16"),
    ("ValueError: Cannot merge ia3 layers when the model is loaded in 4-bit mode", "peft_config", "bf16"),
    ("TypeError: SFTTrainer.__init__() got an unexpected keyword argument 'tokenizer'", "trainer_api",
     "processing_class"),
    ("TypeError: TrainingArguments.__init__() got an unexpected keyword argument 'evaluation_strategy'",
     "trainer_api", "eval_strategy"),
    ('  File "/opt/conda/lib/python3.10/site-packages/pytorch_lightning/trainer/trainer.py", line 9\n'
     "TypeError: Trainer.__init__() got an unexpected keyword argument 'gpus'", "trainer_api", "pip show lightning"),
    ("RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use "
     "the 'spawn' start method", "cuda_multiprocessing", "spawn"),
    ("WARNING 01-02 [system_utils.py:154] We must use the `spawn` multiprocessing start method. Overriding "
     "VLLM_WORKER_MULTIPROC_METHOD to 'spawn'. Reasons: CUDA was previously initialized. We must use the `spawn` "
     "multiprocessing start method.", "cuda_multiprocessing", "VLLM_WORKER_MULTIPROC_METHOD"),
    ("ValueError: Cannot find the config file for gptq", "quant_config", "quantize_config.json"),
    ("ValueError: The model's quantization config from the arguments has no `quant_method` attribute. Make sure "
     "that the model has been correctly quantized", "quant_config", "quantization_config"),
    ("ValueError: Cannot use chat template functions because tokenizer.chat_template is not set and no template "
     "argument was passed! For information about writing templates and setting the tokenizer.chat_template "
     "attribute, please see the documentation", "chat_template", "--chat-template"),
    ("jinja2.exceptions.TemplateError: Conversation roles must alternate user/assistant/user/assistant/...",
     "chat_template", "alternate"),
    ("ValueError: Asking to pad but the tokenizer does not have a padding token. Please select a token to use as "
     "`pad_token` `(tokenizer.pad_token = tokenizer.eos_token e.g.)`", "tokenizer", "eos_token"),
    ("llama_model_load: error loading model: error loading model architecture: unknown model architecture: "
     "'qwen3'\nllama_load_model_from_file: failed to load model", "gguf_load", "convert_hf_to_gguf"),
    ("Error: llama runner process has terminated: error loading model: done_getting_tensors: wrong number of "
     "tensors; expected 292, got 291", "gguf_load", "convert"),
])
def test_new_families(text, kind, must):
    result = explain(text)
    assert result.recognised and result.kind == kind, result.what_happened
    assert must.lower() in result.fix.lower(), result.fix


@pytest.mark.parametrize("where", ["capture_model", "profile_run"])
def test_vllm_start_up_oom_is_vllm_startup_and_names_cuda_oom(where):
    text = ("(EngineCore_DP0 pid=1) INFO 01-02 10:00:00 [core.py:1] gpu_memory_utilization=0.9\n"
            f'  File "vllm/v1/worker/gpu_model_runner.py", line 2000, in {where}\n'
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity "
            "of 15.77 GiB of which 10.19 MiB is free.")
    result = explain(text)
    assert result.kind == "vllm_startup" and [a["kind"] for a in result.also] == ["cuda_oom"]
    assert "cuda_oom" in result.causes[0].cause
    if where == "capture_model":
        assert result.computed["gpu_memory_utilization"] == 0.85 and "--enforce-eager" in result.fix
    else:
        assert "--max-num-batched-tokens" in result.fix and "does not help" in result.fix


@pytest.mark.parametrize("text", [
    "TypeError: Foo.__init__() got an unexpected keyword argument 'bar'",  # not a trainer
    "error: failed to load model: database connection refused",  # not llama.cpp
    "INFO: applying chat template to 12 conversations",
])
def test_lookalikes_are_not_the_new_kinds(text):
    assert not explain(text).recognised
