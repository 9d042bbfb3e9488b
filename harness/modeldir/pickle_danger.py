"""Name and explain what a global would do, with maintained analysers instead of a list of our own.

fickling (Trail of Bits) judges one import at a time: its UnsafeImports / UnsafeImportsML analyses
flag modules and functions that run code, touch files or the network; its ML allow-list
(fickling.ml.ML_ALLOWLIST) explains the classes it knows are harmless (transformers'
TrainingArguments, numpy's dtype ...). picklescan's list of dangerous globals is consulted too.
Both are optional at run time: without them every global outside torch's allow-list is still
refused, only less well explained.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    dangerous: bool
    known_safe: bool  # fickling's ML allow-list explains it as harmless
    reason: str  # the analyser's words, or "" when it has none


@functools.lru_cache(maxsize=4096)
def judge(module: str, name: str) -> Verdict:
    """Verdict on `from module import name` (name may be dotted)."""
    reasons: list[str] = []
    dangerous = False
    fickling_reason = _fickling(module, name)
    if fickling_reason:
        dangerous = True
        reasons.append(f"fickling: {fickling_reason}")
    if _picklescan_dangerous(module, name):
        dangerous = True
        if not reasons:
            reasons.append("picklescan lists it as dangerous")
    safe_reason = None if dangerous else _ml_allowlist(module, name)
    return Verdict(dangerous, safe_reason is not None, reasons[0] if reasons else (safe_reason or ""))


def _fickling(module: str, name: str) -> str | None:
    try:
        from fickling.analysis import Severity, check_safety
        from fickling.fickle import Pickled
    except Exception:  # noqa: BLE001 - not installed
        return None
    if "\n" in module or "\n" in name:
        return "a global name with a newline"
    try:
        results = check_safety(Pickled.load(f"c{module}\n{name}\n.".encode("utf-8")))
    except Exception:  # noqa: BLE001 - fickling could not parse what we built: say nothing
        return None
    worst = [r for r in results.results if r.severity >= Severity.LIKELY_OVERTLY_MALICIOUS]
    if not worst:
        return None
    message = str(worst[0].message)
    return message if len(message) <= 200 else message[:197] + "..."


def _picklescan_dangerous(module: str, name: str) -> bool:
    try:
        from picklescan.scanner import _unsafe_globals
    except Exception:  # noqa: BLE001 - not installed
        return False
    for mod in (module, module.split(".")[0]):
        listed = _unsafe_globals.get(mod)
        if listed is None:
            continue
        if listed == "*" or name in listed or name.split(".")[0] in listed:
            return True
    return False


def _ml_allowlist(module: str, name: str) -> str | None:
    try:
        from fickling.ml import ML_ALLOWLIST
    except Exception:  # noqa: BLE001 - not installed
        return None
    entry = ML_ALLOWLIST.get(module)
    if isinstance(entry, dict) and name in entry:
        return f"fickling's ML allow-list: {entry[name]}"
    return None
