"""Parsing and printing what users type: byte sizes ("6GiB", "8GB", "6144MiB") and comma lists.

Sizes are parsed one way everywhere: a number and a unit, decimal (KB, MB, GB, TB: powers of
1000, as disk and card vendors count) or binary (KiB, MiB, GiB, TiB: powers of 1024, as nvidia-smi
and torch count), case-insensitive, or B for bytes. A bare number is refused (6 what?), and so are
the one-letter units K, M, G and T: "6G" is 6 GiB to some tools and 6 GB to others, and the two
differ by 7 %. Every error names the option the value came from.
"""

from __future__ import annotations

import re

from .errors import UsageError

_UNITS = {
    "b": 1,
    "kib": 1024, "kb": 1000,
    "mib": 1024**2, "mb": 1000**2,
    "gib": 1024**3, "gb": 1000**3,
    "tib": 1024**4, "tb": 1000**4,
}
_AMBIGUOUS = ("k", "m", "g", "t")
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str, what: str = "size") -> int:
    """'6GiB' -> 6442450944, '6GB' -> 6000000000; `what` (the option) leads every error."""
    match = _SIZE.match(str(text))
    unit = match.group(2).lower() if match else ""
    if match and not unit:
        number = match.group(1)
        raise UsageError(f"{what}: {str(text).strip()!r} has no unit: {number}GiB or {number}GB?")
    if match and unit in _AMBIGUOUS:
        number, letter = match.group(1), match.group(2).upper()
        raise UsageError(f"{what}: {str(text).strip()!r} is ambiguous: {number}{letter}iB or {number}{letter}B?")
    if not match or unit not in _UNITS:
        raise UsageError(f"{what}: {text!r} is not a size (examples: 6GiB, 8GB, 6144MiB)")
    value = float(match.group(1)) * _UNITS[unit]
    if value <= 0:
        raise UsageError(f"{what}: {text!r} must be larger than zero")
    return int(value)


def format_bytes(n: float | int | None) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def format_size(n: int) -> str:
    """A size as the user would have typed it: '6 GiB', '512 MiB', '6 GB (5.59 GiB)' (a whole
    number of decimal units shows its binary value too); anything else as format_bytes."""
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    for unit, scale in (("TB", 1000**4), ("GB", 1000**3), ("MB", 1000**2)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit} ({format_bytes(n)})"
    return format_bytes(n)


def comma_list(text: str | None, what: str, *, choices: tuple[str, ...] | None = None,
               lower: bool = False, allow_empty: bool = False) -> tuple[str, ...]:
    """'a, b,,c' -> ('a', 'b', 'c'): items stripped, empty ones dropped. `choices` refuses any other
    item; an empty list is refused unless `allow_empty`."""
    items = tuple(t.strip().lower() if lower else t.strip() for t in str(text or "").split(","))
    items = tuple(t for t in items if t)
    bad = [t for t in items if choices is not None and t not in choices]
    if bad:
        raise UsageError(f"{what}: unknown value {', '.join(bad)} (choose from {', '.join(choices)})")
    if not items and not allow_empty:
        raise UsageError(f"{what}: no value given" + (f" (choose from {', '.join(choices)})" if choices else ""))
    return items


def int_list(text: str | None, what: str, minimum: int = 1) -> tuple[int, ...]:
    """'512, 2048' -> (512, 2048); every item an integer >= `minimum` ('_' separators allowed)."""
    out = []
    for item in comma_list(text, what):
        try:
            value = int(item)
        except ValueError:
            raise UsageError(f"{what}: {item!r} is not an integer") from None
        if value < minimum:
            raise UsageError(f"{what}: {value} must be an integer >= {minimum}")
        out.append(value)
    return tuple(out)
