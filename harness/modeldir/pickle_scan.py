"""The pickle verdict of one file: torch's weights-only rule, with what breaks it named.

A file is acceptable (under --allow-pickle) only when every pickle its loader would unpickle keeps
torch's rule (harness.modeldir.torch_rule): the globals it reaches are in the installed torch's
weights-only allow-list, calls and BUILDs only target those, persistent ids are storages. What
breaks the rule is sorted for the message: dangerous globals (named and explained by fickling /
picklescan, harness.modeldir.pickle_danger), globals nobody can know without running the pickle,
globals the analysers know as harmless (transformers' TrainingArguments: a warning), and the rest.
Nothing is ever unpickled: pickle_sources finds the pickles, pickle_vm replays their opcodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .pickle_danger import judge
from .pickle_sources import MAX_PICKLE_BYTES, FileScan, PickleSource, scan_file
from .pickle_vm import PickleRun
from .torch_rule import LazyAllowList, torch_allow_list, with_loader_globals

__all__ = ["MAX_PICKLE_BYTES", "PickleScan", "scan_pickle_file"]


@dataclass
class PickleScan:
    kind: str | None = None  # None: the file holds no pickle
    pickles: list[str] = field(default_factory=list)  # where each pickle is ("archive/data.pkl" ...)
    globals_seen: list[str] = field(default_factory=list)
    dangerous: list[str] = field(default_factory=list)  # "os.system (fickling: ...)"
    unresolved: list[str] = field(default_factory=list)  # globals computed at load time
    refused: list[str] = field(default_factory=list)  # other breaches of torch's rule
    known_safe: list[str] = field(default_factory=list)  # outside torch's list, harmless per fickling
    unreadable: list[str] = field(default_factory=list)  # pickles that cannot be read to their end
    problems: list[str] = field(default_factory=list)  # damaged, flagged or oversized containers
    torch_refuses: str | None = None  # the container format itself is refused (legacy tar, TorchScript)
    unscanned: str | None = None
    unverifiable: list[str] = field(default_factory=list)  # the loaders' own readers disagree or fail
    framed_only: str | None = None  # torch's weights-only unpickler refuses only its FRAMEs (protocol 4/5)
    allow_list: str = ""

    @property
    def is_pickle(self) -> bool:
        return self.kind is not None and (bool(self.pickles) or self.torch_refuses is not None
                                          or bool(self.problems) or self.unscanned is not None
                                          or bool(self.unverifiable))

    @property
    def accepted(self) -> bool:
        """torch.load(weights_only=True)'s rule holds for every pickle (warnings aside)."""
        return not (self.dangerous or self.unresolved or self.refused or self.known_safe or self.unreadable
                    or self.problems or self.torch_refuses or self.unverifiable)

    @property
    def error(self) -> str | None:  # kept for callers of the first version
        return "; ".join(self.unreadable + self.problems) or None


def scan_pickle_file(fh, size: int) -> PickleScan:
    """Scan an open binary file: which pickles its loader reads and whether torch's rule holds."""
    allow = LazyAllowList()  # torch is imported only once a pickle reaches a global
    found = scan_file(fh, size, allow)
    if _breaches(found):
        wider = with_loader_globals()
        if wider is not torch_allow_list():
            allow = wider
            found = scan_file(fh, size, allow)
    return _verdict(found, allow.source if found.kind is not None else "")


def _breaches(found: FileScan) -> bool:
    return any(source.run.violations for source in found.pickles)


def _verdict(found: FileScan, source: str) -> PickleScan:
    scan = PickleScan(kind=found.kind, problems=list(found.problems), torch_refuses=found.torch_refuses,
                      unscanned=found.unscanned, allow_list=source)
    for item in found.pickles:
        scan.pickles.append(item.where)
        _judge_run(item, scan)
    for name in ("globals_seen", "dangerous", "unresolved", "refused", "known_safe", "unreadable"):
        setattr(scan, name, list(dict.fromkeys(getattr(scan, name))))
    return scan


def _judge_run(source: PickleSource, scan: PickleScan) -> None:
    run: PickleRun = source.run
    scan.globals_seen += [imp.full for imp in run.imports]
    for violation in run.violations:
        if violation.kind == "unresolved":
            scan.unresolved.append(f"{violation.detail} in {source.where}")
            continue
        if violation.global_name is not None:
            imp = next((i for i in run.imports if i.full == violation.global_name), None)
            if imp is None or not imp.resolved:
                continue
            verdict = judge(imp.module, imp.name)
            if verdict.dangerous:
                scan.dangerous.append(f"{imp.full} ({verdict.reason})")
            elif verdict.known_safe:
                scan.known_safe.append(f"{imp.full} ({verdict.reason})")
            else:
                scan.refused.append(f"imports {imp.full}, outside torch's allow-list")
            continue
        scan.refused.append(f"{violation.detail} in {source.where}")
    if run.error is not None:
        if run.imports:
            scan.unreadable.append(f"{source.where}: stops at '{run.error}' after importing "
                                   f"{', '.join(dict.fromkeys(i.full for i in run.imports[:3]))}")
        else:
            scan.unreadable.append(f"{source.where}: {run.error}")
