"""Files the loaders parse (not unpickle), read by those loaders' own parsers in the reading child.

- every `*.safetensors` file, and any file shaped like one (8-byte length, a header that fits):
  `safetensors.safe_open`, the Rust parser transformers and vLLM use. Python's json accepts what
  it refuses (a header not starting with '{', `__metadata__` twice, a non-string metadata value,
  NaN); its own sentence is the finding. safe_open maps the file and reads the header only, so a
  100 GiB (sparse) tensor costs nothing; the address-space cap of the child is lifted for that
  call only (a mapping is not memory: the parent still watches the child's resident size).
- `tokenizer.json`: `tokenizers.Tokenizer.from_file` (merges naming unknown tokens, bad JSON).
- `tokenizer.model` and other sentencepiece models: `sentencepiece` when installed, else the
  ModelProto transformers' converter parses (protobuf); with neither, it cannot be verified.

Each returns (finding code, message) pairs; nothing here raises.
"""

from __future__ import annotations

import os
import struct

SPM_NAMES = ("tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "sentencepiece.model")
MAX_HEADER = 100 * 1024 * 1024


def judge(path: str, rel: str, head: bytes, size: int) -> list[tuple[str, str]]:
    name = rel.rsplit("/", 1)[-1]
    if rel.endswith(".safetensors") or looks_safetensors(head, size):
        return _safetensors(path)
    if name == "tokenizer.json":
        return _tokenizer_json(path)
    if name in SPM_NAMES:
        return _sentencepiece(path)
    return []


def looks_safetensors(head: bytes, size: int) -> bool:
    """An 8-byte little-endian length whose header fits the file and begins like JSON text."""
    if len(head) < 9:
        return False
    n = struct.unpack("<Q", head[:8])[0]
    return 2 <= n <= MAX_HEADER and 8 + n <= size and head[8:9] in (b"{", b" ", b"\t", b"\n", b"\r")


def _safetensors(path: str) -> list[tuple[str, str]]:
    try:
        import safetensors
        from safetensors import safe_open
    except ImportError:
        return [("safetensors.header_invalid", "cannot be verified: the safetensors library is not installed")]
    try:
        with _unlimited_address_space():
            with safe_open(path, framework="numpy") as handle:
                handle.keys()
                handle.metadata()
    except Exception as exc:  # noqa: BLE001 - the library's refusal is the verdict
        return [("safetensors.header_invalid",
                 f"safetensors {safetensors.__version__} (what transformers and vLLM load with) refuses it: "
                 f"{_sentence(exc)}; the weights cannot be loaded: save them again")]
    return []


class _unlimited_address_space:
    """RLIMIT_AS's soft limit raised to the hard one around a mapping, then restored."""

    def __enter__(self):
        import resource

        self.saved = resource.getrlimit(resource.RLIMIT_AS)
        try:
            resource.setrlimit(resource.RLIMIT_AS, (self.saved[1], self.saved[1]))
        except (ValueError, OSError):
            pass

    def __exit__(self, *exc):
        import resource

        try:
            resource.setrlimit(resource.RLIMIT_AS, self.saved)
        except (ValueError, OSError):
            pass


def _tokenizer_json(path: str) -> list[tuple[str, str]]:
    try:
        import tokenizers
    except ImportError:
        return [("tokenizer.invalid", "cannot be verified: the tokenizers library is not installed")]
    try:
        tokenizers.Tokenizer.from_file(path)
    except Exception as exc:  # noqa: BLE001 - the library's refusal is the verdict
        return [("tokenizer.invalid", f"tokenizers {tokenizers.__version__} (transformers' fast tokenizer) cannot "
                 f"load it: {_sentence(exc)}; save the tokenizer again")]
    return []


def _sentencepiece(path: str) -> list[tuple[str, str]]:
    try:
        import sentencepiece
    except ImportError:
        return _spm_proto(path)
    try:
        processor = sentencepiece.SentencePieceProcessor(model_file=path)
        if processor.get_piece_size() <= 0:
            raise ValueError("no pieces")
    except Exception as exc:  # noqa: BLE001
        return [("tokenizer.invalid", f"sentencepiece {sentencepiece.__version__} cannot load it: {_sentence(exc)}; "
                 "copy tokenizer.model from the base model")]
    return []


def _spm_proto(path: str) -> list[tuple[str, str]]:
    """sentencepiece is not installed: parse the ModelProto transformers' converter reads."""
    try:
        from transformers.utils import sentencepiece_model_pb2_new as model_pb2
    except Exception:  # noqa: BLE001 - protobuf missing too
        return [("tokenizer.invalid", "cannot be verified: neither sentencepiece nor protobuf is installed to read "
                 "it as transformers does (pip install sentencepiece)")]
    try:
        with open(path, "rb") as fh:
            data = fh.read(64 * 1024 * 1024 + 1)
        if len(data) > 64 * 1024 * 1024:
            raise ValueError("larger than 64 MiB")
        model = model_pb2.ModelProto()
        model.ParseFromString(data)
        if not model.pieces:
            raise ValueError("the model holds no pieces")
        if not all(piece.piece for piece in model.pieces[:8]):
            raise ValueError("pieces without text")
    except Exception as exc:  # noqa: BLE001
        return [("tokenizer.invalid", f"not a sentencepiece model (its ModelProto, as transformers' converter "
                 f"parses it: {_sentence(exc)}); copy tokenizer.model from the base model")]
    return []


def _sentence(exc: Exception) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:240]}"


def hole_from(fd: int, offset: int, end: int) -> bool:
    """[offset, end) is one hole of a sparse file (SEEK_DATA finds no data before `end`)."""
    if end <= offset:
        return False
    import errno

    try:
        return os.lseek(fd, offset, os.SEEK_DATA) >= end
    except OSError as exc:
        return exc.errno == errno.ENXIO  # no data after offset at all; other errors: not known
    except AttributeError:  # no SEEK_DATA on this platform
        return False
