"""torch's weights-only rule, read from the installed torch: which globals a pickle may reach.

The allow-list is torch's own: torch._weights_only_unpickler._get_allowed_globals() (tensor
rebuild functions, storages, dtypes, OrderedDict, Size, device ...) plus what
torch.serialization.add_safe_globals registered (torch.serialization.get_safe_globals()).
`with_loader_globals()` adds what a loader itself registers before calling
torch.load(weights_only=True): transformers' Trainer allows numpy's array and dtype types when it
reloads rng_state.pth (transformers.trainer_pt_utils.safe_globals).

torch's blocklist (os, posix, nt, sys) wins over any allow-list, as in torch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

# Allowed constructors whose result torch's unpickler refuses as a BUILD target (bytes, a layout).
_NOT_BUILDABLE = {"_codecs.encode", "torch.serialization._get_layout"}


@dataclass(frozen=True)
class TorchAllowList:
    names: frozenset[str]
    blocked_modules: frozenset[str]
    source: str  # e.g. "torch 2.13.0 weights-only allow-list (142 globals)"

    def allowed(self, full_name: str) -> bool:
        module = full_name.rpartition(".")[0]
        return full_name in self.names and module not in self.blocked_modules

    def buildable(self, full_name: str) -> bool:
        return self.allowed(full_name) and full_name not in _NOT_BUILDABLE


def _name_of(entry) -> str:
    if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], str):
        return entry[1]
    return f"{entry.__module__}.{entry.__qualname__}"


@functools.lru_cache(maxsize=1)
def torch_allow_list() -> TorchAllowList:
    import torch
    from torch import _weights_only_unpickler as wou

    names = set(wou._get_allowed_globals())
    names.update(_name_of(g) for g in torch.serialization.get_safe_globals())
    blocked = frozenset(getattr(wou, "_blocklisted_modules", ("sys", "os", "posix", "nt")))
    return TorchAllowList(frozenset(names), blocked,
                          f"torch {torch.__version__} weights-only allow-list ({len(names)} globals)")


class LazyAllowList:
    """torch's allow-list (or with_loader_globals' when wider=True), built on the first question:
    a file on which no unpickler reaches a global (config.json, a safetensors file) imports no torch."""

    def __init__(self, wider: bool = False) -> None:
        self.wider = wider

    def resolved(self) -> TorchAllowList:
        return with_loader_globals() if self.wider else torch_allow_list()

    def allowed(self, full_name: str) -> bool:
        return self.resolved().allowed(full_name)

    def buildable(self, full_name: str) -> bool:
        return self.resolved().buildable(full_name)

    @property
    def names(self) -> frozenset[str]:
        return self.resolved().names

    @property
    def blocked_modules(self) -> frozenset[str]:
        return self.resolved().blocked_modules

    @property
    def source(self) -> str:
        return self.resolved().source


@functools.lru_cache(maxsize=1)
def with_loader_globals() -> TorchAllowList:
    """torch's list plus the globals transformers' Trainer allows when it reloads its checkpoints."""
    base = torch_allow_list()
    extra: set[str] = set()
    try:
        import torch
        from transformers.trainer_pt_utils import safe_globals
    except Exception:  # noqa: BLE001 - transformers missing or broken: torch's list alone
        return base
    with safe_globals():
        extra.update(_name_of(g) for g in torch.serialization.get_safe_globals())
    if not extra - base.names:
        return base
    return TorchAllowList(base.names | frozenset(extra), base.blocked_modules,
                          base.source + " + transformers Trainer's safe_globals")
