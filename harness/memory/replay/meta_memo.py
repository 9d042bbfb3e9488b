"""Meta-device kernels remembered by what they were given (harness.memory.replay.step_trace's speed).

A traced step runs the same ops on the same shapes over and over (every layer, every step), and on
the meta device an op's outputs are a function of its inputs' metadata alone: their shapes,
strides, offsets and dtypes and the op's other arguments. Torch computes that in Python for most
ops (its meta registrations and reference decompositions), which is most of a trace's time. So the
first call of an op on given metadata runs the kernel and notes its outputs' metadata; a later call
on the same metadata makes fresh meta tensors of that metadata instead.

Only ops whose schema neither mutates nor aliases anything are remembered (no views, no in-place,
no out=), and only when their outputs are plain strided meta tensors with storages of their own:
then a fresh tensor is all the kernel would have returned, and the recorder sees the same storage
sizes in the same order (tests/test_step_trace_speed.py holds traces equal with and without it).
"""

from __future__ import annotations

from collections.abc import Callable

_NOT = object()  # an op and metadata whose outputs are not remembered: the kernel runs each time


def _key_of(x, tensor_type):
    if isinstance(x, tensor_type):
        return (x.shape, x.stride(), x.storage_offset(), x.dtype, x.device.type)
    if isinstance(x, (list, tuple)):
        return (type(x), tuple(_key_of(v, tensor_type) for v in x))
    return (type(x), x)  # the type too: True and 1 are equal keys, not equal arguments


class MetaMemo:
    """call(func, args, kwargs) == func(*args, **kwargs) for meta tensors, faster on a repeat."""

    def __init__(self):
        import torch
        from torch.utils._pytree import tree_flatten, tree_unflatten

        self._torch, self._flatten, self._unflatten = torch, tree_flatten, tree_unflatten
        self._pure: dict = {}
        self._seen: dict = {}
        self.hits = self.misses = 0

    def _is_pure(self, func) -> bool:
        pure = self._pure.get(func)
        if pure is None:
            s = func._schema
            pure = self._pure[func] = (not s.is_mutable and all(a.alias_info is None for a in s.arguments)
                                       and all(r.alias_info is None for r in s.returns))
        return pure

    def call(self, func, args, kwargs: dict, run: Callable | None = None):
        """func's outputs on args; `run` (default func) runs the kernel when it must."""
        run = run or func
        if not self._is_pure(func):
            return run(*args, **kwargs)
        T = self._torch.Tensor
        try:
            key = (func, tuple(_key_of(a, T) for a in args), tuple((k, _key_of(v, T)) for k, v in kwargs.items()))
            seen = self._seen.get(key)
        except TypeError:  # an unhashable argument
            return run(*args, **kwargs)
        if seen is _NOT:
            return run(*args, **kwargs)
        if seen is not None:
            self.hits += 1
            return self._made(*seen)
        self.misses += 1
        out = run(*args, **kwargs)
        self._seen[key] = self._described(out, args, kwargs)
        return out

    def _made(self, leaves: list, spec):
        torch = self._torch
        out = []
        for leaf in leaves:
            if type(leaf) is tuple:
                shape, stride, offset, dtype, nbytes = leaf
                t = torch.empty((), dtype=dtype, device="meta")
                t.set_(torch.UntypedStorage(nbytes, device="meta"), offset, shape, stride)
                out.append(t)
            else:
                out.append(leaf)
        return self._unflatten(out, spec)

    def _described(self, out, args, kwargs):
        """(leaves, spec) to make out again, or _NOT where a fresh tensor would not be the same."""
        torch = self._torch
        leaves, spec = self._flatten(out)
        inputs = {t.untyped_storage()._cdata for t in self._flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        desc, storages = [], set()
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                if (type(leaf) is not torch.Tensor or leaf.device.type != "meta" or leaf.layout != torch.strided
                        or leaf.requires_grad or leaf.is_conj() or leaf.is_neg()):
                    return _NOT
                storage = leaf.untyped_storage()
                if storage._cdata in inputs or storage._cdata in storages:
                    return _NOT
                storages.add(storage._cdata)
                desc.append((tuple(leaf.shape), leaf.stride(), leaf.storage_offset(), leaf.dtype, storage.nbytes()))
            elif leaf is None or type(leaf) in (int, float, bool):
                desc.append(leaf)
            else:
                return _NOT
        return desc, spec
