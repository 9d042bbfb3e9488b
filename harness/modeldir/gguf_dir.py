"""check-dir for llama.cpp's deliverable: a directory whose weights are one GGUF file.

The tokenizer and the architecture live in the file's metadata, so there is no config.json or
tokenizer.json to ask for. The header is parsed whole with the `gguf` package's reader (every
key-value field and every tensor info; no tensor data is read), then each tensor is checked the
way llama.cpp will map it:

- its type is a GGML type the reader knows and its first dimension a whole number of blocks;
- its data extent [offset, offset + bytes) is aligned (general.alignment) and lies inside the
  file, and no two extents overlap (bytes per block from gguf's GGML_QUANT_SIZES: Q4_1 is 20
  bytes per 32 weights, a fp16 scale, a fp16 min and 16 bytes of nibbles);
- its name and shape agree with the architecture in the metadata ({arch}.block_count,
  embedding_length, feed_forward_length, attention.head_count(_kv), key_length, vocabulary),
  for the llama-style families; 1-D tensors (norms, biases) are float.

A file cut short (an interrupted download) is `gguf.truncated`; a tensor whose offset points past
the end or into another tensor is `gguf.bad_offsets`; a tensor whose shape or type disagrees is
`gguf.arch_mismatch`. Anything the reader cannot parse is `gguf.header_invalid` (fail closed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .findings import WARNING, Collector
from .paths import DirView, NotAFile, PathEscape

WEIGHT_NAMES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3", "smollm3", "granite")
_FLOAT_TYPES = ("F32", "F16", "BF16", "F64")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_name: str  # GGML type name, e.g. Q4_1
    dims: tuple[int, ...]  # GGML order: ne0 (the row length) first
    start: int  # absolute offset in the file
    n_bytes: int
    block_size: int


@dataclass
class GgufHeader:
    size: int  # the file's bytes
    data_offset: int
    alignment: int
    metadata: dict
    tensors: list[TensorInfo]


def gguf_files(view: DirView) -> list[str]:
    return sorted(rel for rel in view.top_level() if rel.lower().endswith(".gguf") and view.exists(rel))


def is_gguf_dir(view: DirView) -> bool:
    """Weights as GGUF only: a .gguf file and none of transformers' weight files."""
    return bool(gguf_files(view)) and not any(view.exists(name) for name in WEIGHT_NAMES)


def check_gguf_dir(view: DirView, out: Collector, deep: bool = False) -> None:
    files = gguf_files(view)
    if len(files) > 1:
        out.add("gguf.several_files", ".", f"{len(files)} GGUF files ({', '.join(files[:3])}): llama.cpp loads one; "
                "keep the one you mean to ship (split files are not checked)")
    for rel in files:
        header = _read(view, rel, out)
        if header is None:
            continue
        _check_extents(rel, header, out)
        _check_architecture(rel, header, out)
        if not header.metadata.get("tokenizer.ggml.tokens"):
            out.add("gguf.tokenizer_missing", rel, "no tokenizer.ggml.tokens in the metadata: llama.cpp cannot tokenize; "
                    "convert again with convert_hf_to_gguf.py from a directory with its tokenizer")
        if deep and not out.has("gguf.truncated") and not out.has("gguf.bad_offsets"):
            _deep(view, rel, header, out)


# -- the header -----------------------------------------------------------------------------------

def _reader_class():
    from gguf import GGUFReader

    class HeaderReader(GGUFReader):
        """The package's reader, stopping before it maps tensor data: a tensor past the end of
        the file is then a finding with its name, not a reshape error."""

        def _build_tensors(self, start_offs, fields):
            from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

            infos, names = [], set()
            for f in fields:
                _, name_data, _, dims, raw_dtype, offset = f.parts
                name = str(bytes(name_data), encoding="utf-8")
                if name in names:
                    raise ValueError(f"tensor {name} appears twice")
                names.add(name)
                try:
                    qtype = GGMLQuantizationType(int(raw_dtype[0]))
                except ValueError:
                    raise ValueError(f"tensor {name} has unknown GGML type {int(raw_dtype[0])}") from None
                block, type_size = GGML_QUANT_SIZES[qtype]
                shape = tuple(int(d) for d in dims.tolist())
                n = math.prod(shape)
                infos.append(TensorInfo(name, qtype.name, shape, int(start_offs + int(offset[0])),
                                        n * type_size // block, block))
            self.tensor_infos = infos
            self.tensors = []

    return HeaderReader


def _read(view: DirView, rel: str, out: Collector) -> GgufHeader | None:
    try:
        path = view.resolve(rel)
        size = view.size(rel)
        with view.open_binary(rel) as fh:
            magic = fh.read(4)
    except (OSError, NotAFile, PathEscape) as exc:
        out.add("file.unreadable", rel, f"cannot read: {exc}")
        return None
    if magic != b"GGUF":
        out.add("gguf.header_invalid", rel, f"no GGUF magic (starts with {magic!r}): not a GGUF file "
                "(a git-lfs pointer or an HTML page from a failed download?)")
        return None
    try:
        reader = _reader_class()(path, "r")
        metadata = {}
        for key, f in reader.fields.items():
            try:
                metadata[key] = f.contents()
            except (IndexError, ValueError):
                metadata[key] = None
    except ImportError:
        out.add("gguf.header_invalid", rel, "reading GGUF needs the gguf package (pip install gguf): not checked")
        return None
    except Exception as exc:  # noqa: BLE001 - a damaged header raises anything from struct to numpy
        out.add("gguf.header_invalid", rel, f"the header cannot be parsed whole ({type(exc).__name__}: "
                f"{str(exc)[:160]}): cut short or corrupt; download it again")
        return None
    view.bytes_read += int(reader.data_offset)
    return GgufHeader(size, int(reader.data_offset), int(reader.alignment), metadata, reader.tensor_infos)


# -- data extents ---------------------------------------------------------------------------------

def _check_extents(rel: str, header: GgufHeader, out: Collector) -> None:
    ordered = sorted(header.tensors, key=lambda t: t.start)
    prev_end, expected_next, straddles, past = header.data_offset, header.data_offset, [], []
    for t in ordered:
        if t.dims and t.dims[0] % t.block_size:
            out.add("gguf.arch_mismatch", rel, f"{t.name}: rows of {t.dims[0]} are not whole {t.type_name} blocks "
                    f"of {t.block_size}")
        if (t.start - header.data_offset) % header.alignment:
            out.add("gguf.bad_offsets", rel, f"{t.name}: offset {t.start} is not aligned to {header.alignment}")
        if t.start < prev_end:
            out.add("gguf.bad_offsets", rel, f"{t.name}: data at {t.start} overlaps the tensor before it "
                    f"(which ends at {prev_end}): a wrong offset or type")
        end = t.start + t.n_bytes
        if t.start >= header.size and t.start != expected_next:
            past.append(t)
        elif end > header.size:
            straddles.append(t)
        prev_end = max(prev_end, end)
        expected_next = _align(end, header.alignment)
    for t in past:
        out.add("gguf.bad_offsets", rel, f"{t.name}: offset {t.start} is past the end of the file ({header.size} bytes)"
                " and not where the tensor before it ends: a corrupt tensor info")
    need = max((t.start + t.n_bytes for t in ordered if t not in past), default=header.data_offset)
    if straddles or need > header.size:
        first = straddles[0].name if straddles else ordered[-1].name
        out.add("gguf.truncated", rel, f"the file is {header.size} bytes but its tensors need {need} (from {first} on): "
                "cut short (an interrupted download or copy): download it again")


def _align(n: int, alignment: int) -> int:
    return n + (-n) % alignment


# -- architecture ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Dims:
    layers: int
    hidden: int
    ff: int | None
    q_out: int
    kv_out: int
    vocab: int | None


def _dims(rel: str, header: GgufHeader, out: Collector) -> tuple[str, _Dims] | None:
    meta = header.metadata
    arch = str(meta.get("general.architecture") or "")
    if not arch:
        out.add("gguf.metadata_missing", rel, "no general.architecture in the metadata: llama.cpp cannot load it")
        return None
    if arch not in LLAMA_LIKE:
        out.add("gguf.arch_unknown", rel, f"architecture {arch!r}: tensor shapes not checked (extents were)")
        return None

    def key(name):
        return meta.get(f"{arch}.{name}")

    needed = {"block_count": key("block_count"), "embedding_length": key("embedding_length"),
              "attention.head_count": key("attention.head_count")}
    missing = [k for k, v in needed.items() if not isinstance(v, int) or v <= 0]
    if missing:
        out.add("gguf.metadata_missing", rel, f"{arch}: {', '.join(f'{arch}.{k}' for k in missing)} missing or not a "
                "positive integer: llama.cpp cannot build the model")
        return None
    hidden, heads = needed["embedding_length"], needed["attention.head_count"]
    kv_heads = key("attention.head_count_kv") or heads
    head_dim = key("attention.key_length") or hidden // heads
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = key("vocab_size") or (len(tokens) if tokens else None)
    return arch, _Dims(needed["block_count"], hidden, key("feed_forward_length"), heads * head_dim,
                       kv_heads * head_dim, vocab)


def _expected(d: _Dims) -> dict[str, tuple[int | None, ...]]:
    """Tensor name -> GGML dims (ne0 first; None: any) for a llama-style model."""
    shapes: dict[str, tuple[int | None, ...]] = {
        "token_embd.weight": (d.hidden, d.vocab), "output_norm.weight": (d.hidden,)}
    for i in range(d.layers):
        b = f"blk.{i}."
        shapes.update({
            b + "attn_norm.weight": (d.hidden,), b + "ffn_norm.weight": (d.hidden,),
            b + "attn_q.weight": (d.hidden, d.q_out), b + "attn_k.weight": (d.hidden, d.kv_out),
            b + "attn_v.weight": (d.hidden, d.kv_out), b + "attn_output.weight": (d.q_out, d.hidden),
            b + "ffn_gate.weight": (d.hidden, d.ff), b + "ffn_up.weight": (d.hidden, d.ff),
            b + "ffn_down.weight": (d.ff, d.hidden)})
    return shapes


_OPTIONAL = {"output.weight": "lm_head (absent: tied to token_embd)", "rope_freqs.weight": "rope scaling factors"}


def _optional_shape(name: str, d: _Dims) -> tuple[int | None, ...] | None:
    if name == "output.weight":
        return (d.hidden, d.vocab)
    if name == "rope_freqs.weight":
        return (None,)
    for part, n in (("attn_q", d.q_out), ("attn_k", d.kv_out), ("attn_v", d.kv_out)):  # qwen2's biases
        if name.startswith("blk.") and name.endswith(f".{part}.bias"):
            layer = name.split(".")[1]
            if layer.isdigit() and int(layer) < d.layers:
                return (n,)
    if name.startswith("blk.") and name.endswith((".attn_q_norm.weight", ".attn_k_norm.weight")):
        return (None,)
    return None


def _check_architecture(rel: str, header: GgufHeader, out: Collector) -> None:
    found = _dims(rel, header, out)
    if found is None:
        return
    arch, d = found
    expected = _expected(d)
    stored = {t.name: t for t in header.tensors}
    missing = [n for n in expected if n not in stored]
    if missing:
        out.add("gguf.missing_tensor", rel, f"{len(missing)} tensor(s) {arch} with {d.layers} blocks needs are not "
                f"stored, such as {missing[0]}")
    for t in header.tensors:
        want = expected.get(t.name) or _optional_shape(t.name, d)
        if want is None:
            out.add("gguf.unexpected_tensor", rel, f"{t.name}: not a tensor of {arch} with {d.layers} blocks",
                    severity=WARNING if not t.name.startswith("blk.") else None)
            continue
        if len(want) != len(t.dims) or any(w is not None and w != g for w, g in zip(want, t.dims)):
            out.add("gguf.arch_mismatch", rel, f"{t.name}: shape {list(t.dims)} but the metadata ({arch}: "
                    f"{d.layers} blocks, hidden {d.hidden}, vocab {d.vocab}) says {[w or '*' for w in want]}")
        elif len(t.dims) == 1 and t.type_name not in _FLOAT_TYPES:
            out.add("gguf.arch_mismatch", rel, f"{t.name}: a 1-D tensor stored as {t.type_name}; llama.cpp keeps "
                    "norms and biases in float")


# -- --deep ---------------------------------------------------------------------------------------

def _deep(view: DirView, rel: str, header: GgufHeader, out: Collector) -> None:
    """Dequantize every tensor (one at a time, from the memory map) and look for NaN and Inf."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    data = np.memmap(view.resolve(rel), mode="r")
    bad = {"nan": [], "inf": []}
    for t in header.tensors:
        raw = data[t.start:t.start + t.n_bytes]
        try:
            values = dequantize(np.asarray(raw), GGMLQuantizationType[t.type_name])
        except NotImplementedError:
            continue
        view.bytes_read += t.n_bytes
        if np.isnan(values).any():
            bad["nan"].append(t.name)
        elif np.isinf(values).any():
            bad["inf"].append(t.name)
    for kind, names in bad.items():
        if names:
            out.add(f"tensor.{kind}", rel, f"{kind.upper()} in {len(names)} tensor(s) such as {names[0]} (--deep)")
