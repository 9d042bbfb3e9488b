"""Fold what the loaders' own readers saw (harness.modeldir.loader_views, read in the child) into a
file's PickleScan, so one verdict holds both: the opcode replay's named dangers and the real
unpicklers' globals, torch.load(weights_only=True)'s own refusal, and every "cannot be verified".

Fail closed: a global any real unpickler asked for that torch's allow-list lacks breaks the rule;
a real unpickler that stopped after importing something cannot be read to its end; a refusal by
torch.load(weights_only=True) is one unless the only globals outside the list are ones fickling
knows as harmless (training_args.bin: a warning, as before).
"""

from __future__ import annotations

from .loader_views import LoaderRead
from .pickle_danger import judge
from .pickle_scan import PickleScan
from .read_child import ReadFailure
from .torch_rule import with_loader_globals


def merge(scan: PickleScan, read: LoaderRead | ReadFailure | None) -> PickleScan:
    if read is None:
        return scan
    if isinstance(read, ReadFailure):
        scan.unverifiable.append(read.reason)
        scan.kind = scan.kind or "unread"
        return scan
    scan.unverifiable += read.unverifiable
    _globals(scan, read)
    for stream in read.streams:
        run = stream.read
        if not run.complete and run.globals:
            scan.unreadable.append(f"{stream.where}: the {run.reader} stops at '{run.error}' after importing "
                                   f"{', '.join(dict.fromkeys(run.full_names[:3]))}")
    only_harmless = scan.known_safe and not (scan.dangerous or scan.refused or scan.unresolved)
    if read.torch_reads and read.weights_only and not only_harmless and not scan.torch_refuses:
        if read.weights_only.startswith("Unsupported operand 149") and _clean(scan):
            # torch.save(pickle_protocol=4/5): the only thing torch's weights-only unpickler lacks is
            # FRAME; the C unpickler (what weights_only=False uses) and the replay saw torch's rule kept
            scan.framed_only = read.weights_only
        else:
            scan.torch_refuses = f"torch.load(weights_only=True) refuses it: {read.weights_only}"
    found = [s.where for s in read.streams if s.read.globals or s.read.complete]
    if found or read.unverifiable:
        scan.kind = scan.kind or (read.formats[-1] if read.formats else "pickle")
        scan.pickles += [w for w in found if w not in scan.pickles][: max(0, 8 - len(scan.pickles))]
    for name in ("dangerous", "refused", "known_safe", "unreadable", "unverifiable"):
        setattr(scan, name, list(dict.fromkeys(getattr(scan, name))))
    return scan


def _clean(scan: PickleScan) -> bool:
    return not (scan.dangerous or scan.refused or scan.unresolved or scan.known_safe or scan.unreadable
                or scan.problems or scan.unverifiable)


def _globals(scan: PickleScan, read: LoaderRead) -> None:
    if not read.globals:
        return  # no global to judge: torch's list (and its import) is not needed
    allow = with_loader_globals()
    for module, name, where in read.globals:
        full = f"{module}.{name}"
        if allow.allowed(full):
            continue
        verdict = judge(module, name)
        if verdict.dangerous:
            scan.dangerous.append(f"{full} ({verdict.reason})")
        elif verdict.known_safe:
            scan.known_safe.append(f"{full} ({verdict.reason})")
        else:
            scan.refused.append(f"imports {full}, outside torch's allow-list")


def inert_text(read: LoaderRead | ReadFailure | None, head: bytes) -> bool:
    """A text file (UTF-8, no NUL) that every real unpickler stops on before anything could run:
    each stream fails, and its first import names no importable module (`class Handler:` read as
    GLOBAL 'lass Handler:'): find_class fails there, and a pickle calls nothing it has not imported.
    handler.py or a README is not a pickle; a protocol-0 pickle that imports `os` still is."""
    # (readers that "disagree" on such a file only disagree on where they fail: ignored here)
    if not isinstance(read, LoaderRead) or read.format_errors or not read.streams or b"\x00" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:  # a character cut at the end of the sample is still text
            return False
    return all(not s.read.complete and (not s.read.globals or not _importable(*s.read.globals[0]))
               for s in read.streams)


def _importable(module: str, name: str) -> bool:
    return all(part.isidentifier() for part in module.split(".")) and \
        all(part.isidentifier() for part in name.split("."))
