"""Reading the text `explain` is given, whatever it is: a bounded read and a tolerant decode.

- A cap: at most MAX_BYTES (8 MiB) of text is kept, the tail (the failure is at the end of a log);
  a regular file is read from size - MAX_BYTES, so a 200 MB log costs an 8 MiB read.
- A stream or device (stdin, a pipe, /dev/zero, a FIFO) is read in chunks, keeping only the last
  MAX_BYTES, and never past STREAM_LIMIT: a stream that has not ended by then is cut there.
- Decoding: UTF-8 (with or without a BOM), UTF-16 LE/BE with a BOM or without (as PowerShell's
  `>` and Out-File save), else refused as binary or not text. CRLF and ANSI colours are the
  normaliser's (text.normalise).
"""

from __future__ import annotations

import os
import stat
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError

MAX_BYTES = 8 * 1024**2
STREAM_LIMIT = 8 * MAX_BYTES
_CHUNK = 1024**2


@dataclass
class Input:
    text: str
    bytes_read: int  # how many bytes of the source were kept
    bytes_total: int | None  # the source's size (None: a stream that was cut before it ended)
    encoding: str
    cut: str = ""  # why only part was read (empty: all of it)

    def as_dict(self) -> dict:
        return {"bytes_kept": self.bytes_read, "bytes_total": self.bytes_total, "encoding": self.encoding,
                "cut": self.cut or None}


def _mib(n: int) -> str:
    return f"{n / 1024**2:.0f} MiB" if n >= 1024**2 else f"{n} bytes"


def _utf16_without_bom(sample: bytes) -> str | None:
    """PowerShell 5's `>` writes UTF-16 LE, sometimes without a BOM: every other byte is NUL."""
    pairs = len(sample) // 2
    if pairs < 4:
        return None
    even = sum(1 for i in range(0, 2 * pairs, 2) if sample[i] == 0)
    odd = sum(1 for i in range(1, 2 * pairs, 2) if sample[i] == 0)
    if odd > 0.6 * pairs and even < 0.05 * pairs:
        return "utf-16-le"
    if even > 0.6 * pairs and odd < 0.05 * pairs:
        return "utf-16-be"
    return None


def decode(data: bytes, where: str, head: bytes | None = None) -> tuple[str, str]:
    """(text, encoding); `head` is the source's first bytes when `data` is a tail (for the BOM)."""
    head = data[:4] if head is None else head
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        encoding = "utf-16-le" if head.startswith(b"\xff\xfe") else "utf-16-be"
        if data.startswith((b"\xff\xfe", b"\xfe\xff")):
            data = data[2:]
    elif head.startswith(b"\xef\xbb\xbf"):
        encoding, data = "utf-8-sig", data[3:] if data.startswith(b"\xef\xbb\xbf") else data
    else:
        encoding = _utf16_without_bom(data[:65536]) or "utf-8"
    if encoding.startswith("utf-16"):
        data = data[: len(data) - len(data) % 2]
        text = data.decode(encoding, errors="replace")
    else:
        if b"\x00" in data[:65536]:
            raise UsageError(f"{where}: looks binary (NUL bytes), not a log or error text")
        text = data.decode("utf-8", errors="replace")
    if text.count("\ufffd") > max(16, len(text) // 20):
        raise UsageError(f"{where}: not text (mostly bytes that are not UTF-8 or UTF-16)")
    if not text.strip():
        raise UsageError(f"{where}: empty: nothing to explain")
    return text.lstrip("\ufeff"), encoding


def _read_stream(handle, where: str) -> tuple[bytes, int | None, str]:
    """The last MAX_BYTES of a stream, reading at most STREAM_LIMIT bytes."""
    kept: deque[bytes] = deque()
    size = total = 0
    ended = False
    while total < STREAM_LIMIT:
        chunk = handle.read(min(_CHUNK, STREAM_LIMIT - total))
        if not chunk:
            ended = True
            break
        kept.append(chunk)
        size += len(chunk)
        total += len(chunk)
        while size - len(kept[0]) >= MAX_BYTES:
            size -= len(kept.popleft())
    data = b"".join(kept)[-MAX_BYTES:]
    if not ended:
        return data, None, (f"{where} did not end after {_mib(STREAM_LIMIT)}: explained its last {_mib(len(data))} "
                            f"up to there")
    cut = f"{where} is {_mib(total)}: explained its last {_mib(MAX_BYTES)}" if total > MAX_BYTES else ""
    return data, total, cut


def _trim_to_line(data: bytes, encoding_guess: str) -> bytes:
    """A tail starts mid-line: drop the partial first line (and keep UTF-16 code units aligned)."""
    if encoding_guess.startswith("utf-16"):
        return data[len(data) % 2:]
    cut = data.find(b"\n", 0, 65536)
    return data[cut + 1:] if cut >= 0 else data


def read_input(spec: str) -> Input:
    if spec == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise UsageError("no input: give a FILE, or pipe the error text on stdin (FILE -)")
        data, total, cut = _read_stream(sys.stdin.buffer, "stdin")
        text, encoding = decode(data, "stdin")
        return Input(text, len(data), total, encoding, cut)
    path = Path(spec)
    try:
        info = path.stat()
        if stat.S_ISDIR(info.st_mode):
            raise UsageError(f"{spec}: is a directory, not a log file")
        with path.open("rb") as handle:
            if not stat.S_ISREG(info.st_mode):  # a device, a FIFO, /proc: no size to seek by
                data, total, cut = _read_stream(handle, spec)
                head = None
            else:
                total = info.st_size
                head = handle.read(4)
                cut = ""
                if total > MAX_BYTES:
                    handle.seek(total - MAX_BYTES)
                    cut = f"{spec} is {_mib(total)}: explained its last {_mib(MAX_BYTES)}"
                else:
                    handle.seek(0)
                data = handle.read(MAX_BYTES)
                if cut:
                    data = _trim_to_line(data, "utf-16" if head.startswith((b"\xff\xfe", b"\xfe\xff")) else "")
    except FileNotFoundError:
        raise UsageError(f"{spec}: no such file") from None
    except PermissionError:
        raise UsageError(f"{spec}: cannot read it (permission denied)") from None
    except IsADirectoryError:
        raise UsageError(f"{spec}: is a directory, not a log file") from None
    except OSError as exc:
        raise UsageError(f"{spec}: cannot read it ({exc.strerror or exc})") from None
    text, encoding = decode(data, spec, head)
    return Input(text, len(data), total, encoding, cut)


def read_text_file(path: str | os.PathLike) -> str:
    """For library callers: the same bounded, tolerant read as the CLI's."""
    return read_input(str(path)).text
