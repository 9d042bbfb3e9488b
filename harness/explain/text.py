"""Log text as the recognisers read it: colours, progress-bar redraws and line prefixes removed.

A pasted log carries decoration that is not the message: ANSI colour codes (also in caret
notation, ``^[[0;36m``, when copied from a terminal dump), tqdm's carriage-return redraws glued to
the next message (``0/2 [00:00<?, ?it/s]Killed``), and per-line prefixes from vLLM
(``(EngineCore_DP0 pid=1234) ERROR 09-16 17:46:22 [core.py:718]``), Ray actors, torchrun
(``[rank0]:``), docker compose (``vllm-1  |``), journald, dmesg timestamps, CI timestamps and rich
tracebacks (``│ ... │``). Each is stripped, repeatedly, from the start of every line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\^\[\[[0-9;]*m")
_PREFIXES = [re.compile(p) for p in (
    r"^\s*\[?\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?Z?\]?\s*",  # ISO / CI timestamps
    r"^\s*\((?:[A-Za-z_][\w.-]*\s+)?(?:\w+=[^\s),]+[\s,]*)*pid=\d+(?:[\s,]+\w+=[^\s)]+)*\)\s*",  # (EngineCore pid=1)
    r"^\s*(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL)\s+\d{2}-\d{2}\s+\d{2}:\d{2}:\d{2}(?:\.\d+)?\s+"
    r"(?:\[[^\]]*\]\s*|[\w./-]+:\d+\]\s*)",  # vLLM: INFO 12-02 10:11:12 [file.py:123]
    r"^\s*\[rank\d+\]:\s*",  # torchrun
    r"^\s*\[[IWEF]\d{3,4}\s+[\d:.]+\s+[^\]]*\]\s*",  # glog/c10: [W409 11:42:27.77 File.cpp:12]
    r"^\s*\|\s*(?:INFO|ERROR|WARNING|DEBUG)\s*\|\s*[\w.]+\s*\|\s*",  # | ERROR | stderr |
    r"^\s*[\w.-]+-\d+\s+\|\s",  # docker compose: vllm-1  |
    r"^[A-Z][a-z]{2}\s+\d{1,2}\s+\d{2}:\d{2}:\d{2}\s+\S+\s+[\w.@/-]+(?:\[\d+\])?:\s*",  # journald
    r"^\s*\[\s*\d+\.\d+\]\s*",  # dmesg [ 1843.308145]
    r"^\s*(?:│|\||❱|>)\s?",  # rich traceback box, markdown quote
    r"^\s*\d+:\d+:\d+\s+(?:INFO|ERROR|WARNING)\s+",
)]
_BOX_TAIL = re.compile(r"\s*│\s*$")
# tqdm draws "desc: 38%|███ | 3/8 [00:02<00:03, 1.28it/s]" and the next message follows on the same line
_PROGRESS_TAIL = re.compile(r"(\d+/\d+\s*\[[^\]]*\])(?=\S)")
_TUPLE_JOIN = re.compile(r"'\s*,\s*'")  # ('Quantization scheme is not supported for ', 'the current GPU...')


def strip_prefixes(line: str) -> str:
    for _ in range(6):
        before = line
        for pattern in _PREFIXES:
            line = pattern.sub("", line, count=1)
        if line == before:
            break
    return _BOX_TAIL.sub("", line)


def normalise(raw: str) -> str:
    text = _ANSI.sub("", raw).replace("\r\n", "\n").replace("\r", "\n")
    text = _PROGRESS_TAIL.sub(r"\1\n", text)
    text = _TUPLE_JOIN.sub("", text)
    return "\n".join(strip_prefixes(line).rstrip() for line in text.split("\n"))


@dataclass
class Log:
    """The normalised text, with helpers that return the evidence line of a match."""

    text: str
    raw: str = ""  # before normalising: the stripped prefixes still say who wrote a line (vLLM's EngineCore)

    @classmethod
    def of(cls, raw: str) -> "Log":
        return cls(normalise(raw), raw)

    def from_vllm(self) -> bool:
        return re.search(r"vllm|EngineCore|gpu_model_runner|VllmWorker|LLM engine", self.raw or self.text,
                         re.IGNORECASE) is not None

    def search(self, pattern: str | re.Pattern, flags: int = re.IGNORECASE) -> re.Match | None:
        """The last match: in a log, the failure is nearer the end than its echoes in a banner."""
        found = None
        compiled = pattern if isinstance(pattern, re.Pattern) else re.compile(pattern, flags)
        for found in compiled.finditer(self.text):
            pass
        return found

    def first(self, pattern: str | re.Pattern, flags: int = re.IGNORECASE) -> re.Match | None:
        return re.search(pattern, self.text, flags)

    def has(self, pattern: str, flags: int = re.IGNORECASE) -> bool:
        return re.search(pattern, self.text, flags) is not None

    def line_of(self, match: re.Match, limit: int = 300) -> str:
        start = self.text.rfind("\n", 0, match.start()) + 1
        end = self.text.find("\n", match.end())
        line = self.text[start:end if end >= 0 else len(self.text)].strip()
        return line if len(line) <= limit else line[:limit - 3] + "..."

    def evidence(self, pattern: str, flags: int = re.IGNORECASE) -> str | None:
        m = self.search(pattern, flags)
        return self.line_of(m) if m else None


_UNIT = {"b": 1, "bytes": 1, "byte": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
         "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}
GiB = 1024**3


def size_bytes(number: str, unit: str, *, gb_is_gib: bool = False) -> int:
    """'20.00', 'MiB' -> bytes. vLLM prints GiB figures with the label 'GB' (gb_is_gib)."""
    unit = unit.lower()
    factor = 1024**3 if (gb_is_gib and unit == "gb") else _UNIT[unit]
    return int(round(float(number) * factor))


SIZE = r"([\d.]+)\s*(bytes|byte|[KMGT]i?B|B)"


def gib(n: int | float | None) -> str:
    if n is None:
        return "?"
    if abs(n) < 1024**3:
        return f"{n / 1024**2:.0f} MiB"
    return f"{n / 1024**3:.2f} GiB"


WHOLE_TAIL = 256 * 1024  # a long log's last 256 KiB is read whole; before it, only lines that can matter
KEPT_HEAD = 1024**2  # and of those, the last 1 MiB
_KEEP = ("error", "warn", "fail", "exception", "traceback", "raise", "abort", "assert", "fatal", "critical", "kill",
         "oom", "memory", "cuda", "nccl", "xid", "nvrm", "gpu", "nan", ": inf", "=inf", "= inf", "fault", "denied", "refused", "cannot",
         "can't", "unable", "invalid", "mismatch", "missing", "not found", "not supported", "not compatible",
         "unsupported", "no such", "no module", "no kernel", "no available", "version", "driver", "capacity",
         "allocate", "utiliz", "max_model_len", "max seq", "batch_size", "seq_len", "max_length", "dtype", "fp16",
         "bf16", "float16", "quantiz", "tokenizer", "template", "lora", "peft", "target_modules", "gguf", "llama",
         "ollama", "vllm", "engine", "timeout", "timed out", "signal", "exit")


def condense(raw: str) -> str:
    """A long log (> 1 MiB) without its routine lines: the last WHOLE_TAIL characters whole, and
    before them only the lines a recogniser could read (an error word, a figure it uses), the last
    KEPT_HEAD of them. A 200 MB training log is mostly progress and loss lines; this keeps
    explain's time bounded."""
    if len(raw) <= 1024**2:
        return raw
    head, tail = raw[:-WHOLE_TAIL], raw[-WHOLE_TAIL:]
    lower = head.lower()  # str.find per keyword: much faster than one case-insensitive alternation
    starts: set[int] = set()
    for word in _KEEP:
        at = lower.find(word)
        while at >= 0:
            start = lower.rfind("\n", 0, at) + 1
            starts.add(start)
            end = lower.find("\n", at)
            if end < 0:
                break
            at = lower.find(word, end)
    kept, size = [], 0
    for start in sorted(starts, reverse=True):  # the last KEPT_HEAD of them: a log of nothing but warnings stays bounded
        end = head.find("\n", start)
        kept.append(head[start:end if end >= 0 else len(head)])
        size += len(kept[-1]) + 1
        if size > KEPT_HEAD:
            break
    return "\n".join(reversed(kept)) + "\n" + tail
