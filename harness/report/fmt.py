"""Plain text for values in a report: no Python reprs, a unit on every measured number.

Tests record figures under names that carry their unit (`*_bytes`, `*_s`, `*_ms`, `*_hz`, error
fractions); the report turns them into "2.38 GiB", "15.2 s", "0.43 %". Lists become comma lists,
mappings "key: value" pairs, None a dash.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

from ..units import format_bytes

DASH = "–"
# Record keys whose bare numbers are bytes although the name has no _bytes suffix.
BYTE_KEYS = {"measured", "predicted", "peak", "first_call_peak", "bytes_read", "footprint", "reserved",
             "allocated", "free", "total", "context", "budget", "fragmentation"}
# Keys whose float values in [-10, 10] are fractions shown as percent.
FRACTION_WORDS = ("error", "agreement", "hit_rate", "fraction", "utilization", "usage", "share", "ratio_pct")


def words(key: str) -> str:
    """`median_abs_error` -> `median abs error` (a record key as a label)."""
    return str(key).replace("_", " ").strip()


def size(n: float) -> str:
    """Bytes for a budget: '6 GiB' when whole, else harness.units.format_bytes."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale and float(n) % scale == 0:
            return f"{int(n // scale)} {unit}"
    return format_bytes(n)


def tokens(n: int) -> str:
    """512 -> '512 tokens', 16384 -> '16k tokens'."""
    n = int(n)
    return f"{n // 1024}k tokens" if n >= 1024 and n % 1024 == 0 else f"{n:,} tokens"


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 check', '2 checks'."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def duration(seconds: float | None) -> str:
    """0.004 s -> '4 ms', 15.2 -> '15.2 s', 123 -> '2 min 03 s', 3725 -> '1 h 02 min'."""
    if seconds is None or (isinstance(seconds, float) and not math.isfinite(seconds)):
        return DASH
    s = float(seconds)
    if s < 1:
        return f"{s * 1000:.0f} ms" if s >= 0.001 else f"{s * 1e6:.0f} µs"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


def clock(epoch: float | None) -> str:
    """Local time of an epoch, 'YYYY-MM-DD HH:MM'."""
    if not epoch:
        return DASH
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(float(epoch)))


def number(value: float, digits: int = 4) -> str:
    """Up to `digits` significant digits, thousands separated, no exponent for everyday sizes."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    if abs(value) >= 10 ** digits:
        return f"{value:,.0f}"
    text = f"{value:.{digits}g}"
    if "e" in text:
        return f"{value:.2e}"
    return text


def percent(fraction: float, signed: bool = False) -> str:
    pct = 100 * fraction
    digits = 2 if abs(pct) < 10 else 1
    return f"{pct:+.{digits}f} %" if signed else f"{pct:.{digits}f} %"


def _unit_of(key: str) -> str | None:
    k = str(key).lower().replace(" ", "_").replace("_%", "_pct")
    if k.endswith("_bytes") or k == "bytes" or k in BYTE_KEYS or k.endswith("_peak"):
        return "bytes"
    if k.endswith("_ms"):
        return "ms"
    if k.endswith(("_s", "_seconds")) or "_s_" in k or k in ("seconds", "duration"):
        return "s"
    if k.endswith("_hz"):
        return "Hz"
    if k.endswith("_pct") or k.endswith(" %"):
        return "%"
    if any(w in k for w in FRACTION_WORDS):
        return "fraction"
    return None


def value(v: Any, key: str | None = None) -> str:
    """A value as plain text, its unit taken from the key name."""
    if v is None:
        return DASH
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, str):
        return v
    if isinstance(v, dict):
        return "; ".join(f"{words(k)}: {value(x, k)}" for k, x in v.items()) or DASH
    if isinstance(v, (list, tuple, set)):
        items = [value(x, key) for x in v]
        return ", ".join(items) if items else DASH
    if isinstance(v, (int, float)):
        unit = _unit_of(key) if key else None
        if unit == "bytes" and isinstance(v, (int, float)) and abs(v) >= 1:
            return format_bytes(v)
        if unit == "ms":
            return f"{number(float(v))} ms"
        if unit == "s":
            return duration(float(v))
        if unit == "Hz":
            return f"{number(float(v))} Hz"
        if unit == "%":
            return f"{float(v):+.1f} %" if "change" in str(key).lower() else f"{number(float(v))} %"
        if unit == "fraction" and -10 <= v <= 10:
            return percent(v, signed="error" in str(key).lower() and "abs" not in str(key).lower())
        return number(v)
    return str(v)


_REPR = re.compile(r"^\(?'[^']*', \d+, '(.*)'\)?$")


def skip_reason(text: str | None) -> str | None:
    """pytest's skip longrepr tuple as text -> its message (older results files kept the tuple)."""
    if not text:
        return text
    match = _REPR.match(text.strip())
    text = match.group(1) if match else text
    return text.removeprefix("Skipped: ")
