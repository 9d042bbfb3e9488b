"""Parsing and printing byte sizes ("6GiB", "8GB", "6144MiB", "512M")."""

from __future__ import annotations

import re

from .errors import UsageError

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024, "kib": 1024, "kb": 1000,
    "m": 1024**2, "mib": 1024**2, "mb": 1000**2,
    "g": 1024**3, "gib": 1024**3, "gb": 1000**3,
    "t": 1024**4, "tib": 1024**4, "tb": 1000**4,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str, what: str = "size") -> int:
    """'6GiB' -> 6442450944. Decimal units (GB) are powers of 1000, binary (GiB, G) of 1024."""
    match = _SIZE.match(str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise UsageError(f"{what}: {text!r} is not a size (examples: 6GiB, 8GB, 6144MiB)")
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value <= 0:
        raise UsageError(f"{what}: {text!r} must be larger than zero")
    return int(value)


def format_bytes(n: float | int | None) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
