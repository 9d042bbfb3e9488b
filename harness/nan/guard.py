"""The training guard: stop at the first non-finite value, name it, keep the last good state.

Two faces over one core:

- ``TrainingGuard``: a context manager for plain loops::

      with TrainingGuard(model, optimizer, "runs/guard") as guard:
          for batch in batches:
              loss = model(**batch).loss     # a forward hook checks the loss
              loss.backward()                # gradient hooks name the first non-finite gradient
              guard.before_step()            # raises NonFiniteError before the optimizer writes
              optimizer.step()
              guard.after_step()             # undoes and raises on a non-finite or runaway update
              optimizer.zero_grad()

- ``NanGuardCallback``: the same checks as an HF Trainer callback. The Trainer's
  ``logging_nan_inf_filter`` replaces a NaN loss by the running mean in its logs; the callback
  reads the loss from the model's own output (a forward hook), so the filter cannot hide it.

Checks: the loss (forward hook on the model), every trainable gradient as it is accumulated
(post-accumulate-grad hooks: the first parameter whose gradient goes non-finite is named, even
if clipping later smears the NaN over every gradient), the gradient norm against the median of
earlier steps, and the update itself (weights finite, ||delta|| / ||weights|| bounded) -- a bad
update is undone from an in-memory snapshot before the guard stops.

The last good trainable weights (the adapter) and optimizer state are written to disk atomically
(a temporary directory renamed into place, then a LAST_GOOD pointer replaced), every
``save_every`` steps and always when the guard trips, so nothing is lost.
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import atomic
from ..errors import UsageError
from .locate import NonFinite, NonFiniteError, tensor_stats

LAST_GOOD = "LAST_GOOD"
FINDING = "finding.json"


@dataclass
class GuardConfig:
    # stop when one step moves the trainable weights by more than this fraction of their norm
    max_update_ratio: float | None = 1.0
    # stop when the gradient norm exceeds this multiple of the median of the earlier steps
    grad_norm_spike: float | None = 1e3
    spike_warmup: int = 3  # steps of history before the spike check applies
    save_every: int = 1  # steps between saves of the last good state; 0: only when tripping
    keep: int = 1  # saved states kept on disk
    snapshot: bool = True  # in-memory copy before each step, so a bad update can be undone


def _model_of(model):
    return getattr(model, "module", model)  # DDP / accelerate wrappers


class _GuardCore:
    def __init__(self, save_dir: str | Path | None, config: GuardConfig | None = None):
        self.save_dir = Path(save_dir) if save_dir is not None else None
        self.config = config or GuardConfig()
        self.model = None
        self.optimizer = None
        self.params: list[tuple[str, Any]] = []
        self.handles: list[Any] = []
        self.step = 0  # optimizer steps completed and accepted
        self.pending = None  # the first NonFinite seen since the last accepted step
        self.grad_norms: list[float] = []
        self.last_loss: float | None = None
        self.snapshot: dict[str, Any] | None = None
        self.saved_step: int | None = None
        self.finding = None
        self.history: list[dict[str, Any]] = []

    # -- hooks ----------------------------------------------------------------------------
    def attach(self, model, optimizer) -> None:
        if self.model is not None:
            return
        self.model, self.optimizer = _model_of(model), optimizer
        self.params = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        if not self.params:
            raise UsageError("the training guard found no trainable parameter (requires_grad) in the model")
        self.handles.append(self.model.register_forward_hook(self._on_forward))
        for name, param in self.params:
            self.handles.append(param.register_post_accumulate_grad_hook(self._grad_hook(name)))

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def _note(self, finding) -> None:
        if self.pending is None:
            finding.step = self.step + 1
            self.pending = finding

    def _on_forward(self, module, args, output) -> None:
        if not module.training:
            return
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if loss is not None:
            self.check_loss(loss)

    def _grad_hook(self, name: str):

        module, _, leaf = name.rpartition(".")

        def hook(param) -> None:
            if self.pending is None and param.grad is not None:
                stats = tensor_stats(param.grad)
                if stats:
                    self._note(NonFinite(phase="backward", module=module, tensor=f"{leaf}.grad", **stats))

        return hook

    # -- checks ---------------------------------------------------------------------------
    def check_loss(self, loss) -> None:

        stats = tensor_stats(loss)
        if stats:
            self._note(NonFinite(phase="loss", module="", tensor="loss", **stats))
        else:
            self.last_loss = float(loss.detach().float().mean())

    def before_step(self) -> None:
        """Between backward (and clipping) and optimizer.step: raise on any pending fault."""
        import torch

        if self.pending is not None:
            self.trip(self.pending)

        for name, param in self.params:  # non-finite gradients the hooks could not see (set by hand)
            stats = tensor_stats(param.grad) if param.grad is not None else None
            if stats:
                module, _, leaf = name.rpartition(".")
                self.trip(NonFinite(phase="backward", module=module, tensor=f"{leaf}.grad", step=self.step + 1, **stats))
        grads = [p.grad for _, p in self.params if p.grad is not None]
        if grads:
            norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))
            spike = self.config.grad_norm_spike
            if spike and len(self.grad_norms) >= self.config.spike_warmup:
                median = statistics.median(self.grad_norms)
                if median > 0 and norm > spike * median:
                    self.trip(NonFinite(phase="backward", module="", tensor="grad_norm", step=self.step + 1,
                                        note=f"divergence: gradient norm {norm:.3g} is {norm / median:.0f}x "
                                             f"the median {median:.3g} of earlier steps"))
            self.grad_norms.append(norm)
        if self.config.snapshot:
            self.snapshot = {
                "params": {n: p.detach().clone() for n, p in self.params},
                "optimizer": copy.deepcopy(self.optimizer.state_dict()) if self.optimizer is not None else None,
            }

    def _restore_snapshot(self) -> None:
        import torch

        if self.snapshot is None:
            return
        with torch.no_grad():
            for name, param in self.params:
                param.copy_(self.snapshot["params"][name])
        if self.snapshot["optimizer"] is not None and self.optimizer is not None:
            self.optimizer.load_state_dict(self.snapshot["optimizer"])

    def after_step(self) -> None:
        """After optimizer.step: weights finite and the update bounded, else undo and raise."""
        import torch

        for name, param in self.params:
            stats = tensor_stats(param)
            if stats:
                self._restore_snapshot()
                module, _, leaf = name.rpartition(".")
                self.trip(NonFinite(phase="update", module=module, tensor=leaf, step=self.step + 1,
                                    note="the optimizer wrote non-finite weights (undone)", **stats))
        ratio = None
        if self.snapshot is not None:
            delta = base = 0.0
            with torch.no_grad():
                for name, param in self.params:
                    before = self.snapshot["params"][name]
                    delta += float(torch.linalg.vector_norm((param - before).float())) ** 2
                    base += float(torch.linalg.vector_norm(before.float())) ** 2
            ratio = math.sqrt(delta) / max(math.sqrt(base), 1e-12)
            limit = self.config.max_update_ratio
            if limit is not None and ratio > limit:
                self._restore_snapshot()
                self.trip(NonFinite(phase="update", module="", tensor="trainable weights", step=self.step + 1,
                                    note=f"divergence: the update moved the weights by {ratio:.3g}x their norm "
                                         f"(limit {limit:g}); undone"))
        self.step += 1
        self.snapshot = None
        self.history.append({"step": self.step, "loss": self.last_loss, "update_ratio": ratio,
                             "grad_norm": self.grad_norms[-1] if self.grad_norms else None})
        if self.config.save_every and self.step % self.config.save_every == 0:
            self.save()

    # -- state on disk --------------------------------------------------------------------
    def save(self) -> Path | None:
        """Write the current trainable weights and optimizer state as the last good state."""
        if self.save_dir is None or self.model is None:
            return None
        if self.saved_step == self.step and (self.save_dir / LAST_GOOD).is_file():
            return self.save_dir / (self.save_dir / LAST_GOOD).read_text().strip()
        return self._write_state()

    def _write_state(self) -> Path:
        import torch
        from safetensors.torch import save_file

        self.save_dir.mkdir(parents=True, exist_ok=True)
        name = f"step-{self.step:06d}"
        final = self.save_dir / name
        tmp = self.save_dir / f".{name}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        tensors = {n: p.detach().to("cpu").contiguous().clone() for n, p in self.params}
        save_file(tensors, str(tmp / "trainable.safetensors"))
        if self.optimizer is not None:
            torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
        if hasattr(self.model, "peft_config") and hasattr(self.model, "save_pretrained"):
            self.model.save_pretrained(tmp / "adapter")  # loadable with PeftModel.from_pretrained
        meta = {"step": self.step, "loss": self.last_loss, "time": time.time(),
                "parameters": len(tensors), "optimizer": self.optimizer is not None}
        (tmp / "state.json").write_text(json.dumps(meta, indent=2) + "\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        atomic.write_text(self.save_dir / LAST_GOOD, name + "\n")
        self.saved_step = self.step
        for old in sorted(self.save_dir.glob("step-*"))[:-max(self.config.keep, 1)]:
            if old.name != name:
                shutil.rmtree(old, ignore_errors=True)
        return final

    def trip(self, finding) -> None:

        if finding.step is None:
            finding.step = self.step + 1
        self.finding = finding
        saved = self.save()
        if self.save_dir is not None:
            self.save_dir.mkdir(parents=True, exist_ok=True)
            atomic.write_text(self.save_dir / FINDING, json.dumps(finding.to_dict(), indent=2) + "\n")
        print(f"[harness] training guard: stopped at {finding.describe()}"
              + (f"; last good state (step {self.step}) in {saved}" if saved else ""), file=sys.stderr, flush=True)
        raise NonFiniteError(finding, saved)


class _GuardFront:
    """What both front ends share: a _GuardCore built from a config plus keyword overrides."""

    def __init__(self, save_dir: str | Path | None, config: GuardConfig | None, overrides: dict[str, Any]):
        if overrides:
            config = GuardConfig(**{**(config or GuardConfig()).__dict__, **overrides})
        self.core = _GuardCore(save_dir, config)

    @property
    def finding(self):
        return self.core.finding

    @property
    def history(self) -> list[dict[str, Any]]:
        return self.core.history


class TrainingGuard(_GuardFront):
    """Context manager for plain training loops (see the module docstring)."""

    def __init__(self, model, optimizer=None, save_dir: str | Path | None = None,
                 config: GuardConfig | None = None, **overrides: Any):
        super().__init__(save_dir, config, overrides)
        self._model, self._optimizer = model, optimizer

    def __enter__(self) -> "TrainingGuard":
        self.core.attach(self._model, self._optimizer)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.core.detach()
        if exc_type is KeyboardInterrupt:
            self.core.save()  # an interrupted run keeps its last accepted step
        return False

    def check_loss(self, loss) -> None:
        self.core.check_loss(loss)

    def before_step(self) -> None:
        self.core.before_step()

    def after_step(self) -> None:
        self.core.after_step()

    def train_step(self, batch: dict, max_grad_norm: float | None = None) -> float:
        """forward, backward, (clip), checks, optimizer step, checks, zero_grad; returns the loss."""
        import torch

        model, optimizer = self.core.model, self.core.optimizer
        loss = model(**batch).loss
        self.core.check_loss(loss)
        if self.core.pending is None:
            loss.backward()
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_([p for _, p in self.core.params], max_grad_norm)
        self.core.before_step()
        optimizer.step()
        self.core.after_step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    @property
    def step(self) -> int:
        return self.core.step

    def save(self) -> Path | None:
        return self.core.save()


class NanGuardCallback(_GuardFront):
    """HF Trainer callback (duck-typed TrainerCallback: importing transformers is not needed).

    On a fault it saves the last good state and raises NonFiniteError out of trainer.train();
    the optimizer step that would have written the bad values never runs (or is undone).
    """

    def __init__(self, save_dir: str | Path | None = None, config: GuardConfig | None = None, **overrides: Any):
        super().__init__(save_dir, config, overrides)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if model is None:
            raise UsageError("NanGuardCallback needs the Trainer's model (on_train_begin got none)")
        self.core.attach(model, optimizer)
        self.core.step = state.global_step

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        if optimizer is not None and self.core.optimizer is None:
            self.core.optimizer = optimizer
        self.core.before_step()

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.core.after_step()

    def on_train_end(self, args, state, control, **kwargs):
        self.core.detach()


def _noop(self, args, state, control, **kwargs):
    return None


for _event in ("on_init_end", "on_epoch_begin", "on_epoch_end", "on_step_begin", "on_substep_end",
               "on_step_end", "on_evaluate", "on_predict", "on_save", "on_log", "on_prediction_step",
               "on_push_begin"):
    setattr(NanGuardCallback, _event, _noop)


def load_last_good(save_dir: str | Path, model, optimizer=None) -> dict[str, Any]:
    """Load the guard's last good trainable weights (and optimizer state) into `model`
    (and `optimizer`), built the same way as the guarded run. Returns state.json's content."""
    import torch
    from safetensors.torch import load_file

    save_dir = Path(save_dir)
    pointer = save_dir / LAST_GOOD
    if not pointer.is_file():
        raise UsageError(f"{save_dir} holds no saved state ({LAST_GOOD} is missing)")
    state_dir = save_dir / pointer.read_text().strip()
    tensors = load_file(str(state_dir / "trainable.safetensors"))
    params = dict(_model_of(model).named_parameters())
    missing = [n for n in tensors if n not in params]
    if missing:
        raise UsageError(f"the saved state names parameters the model lacks: {', '.join(missing[:3])}")
    with torch.no_grad():
        for name, tensor in tensors.items():
            params[name].copy_(tensor.to(params[name].device, params[name].dtype))
    if optimizer is not None:
        path = state_dir / "optimizer.pt"
        if not path.is_file():
            raise UsageError(f"{state_dir} has no optimizer state")
        optimizer.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    meta = json.loads((state_dir / "state.json").read_text())
    meta["path"] = str(state_dir)
    return meta
