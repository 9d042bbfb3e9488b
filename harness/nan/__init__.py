"""Where did the NaN come from: locate non-finite values, guard training, inject faults.

Exports first_nonfinite, nonfinite_in_cache, nonfinite_tensors, check_labels (locate), TrainingGuard
and NanGuardCallback (guard), NanGuardTrainerCallback (the guard as a transformers.TrainerCallback
subclass, imported on first use); modules inject, twomodels (two models on one GPU) and lora hold the rest.
"""

from .guard import GuardConfig, NanGuardCallback, TrainingGuard, load_last_good
from .locate import (
    IGNORE_INDEX,
    BadLabelsError,
    CacheFinding,
    LabelProblem,
    NonFinite,
    NonFiniteError,
    check_labels,
    count_targets,
    first_nonfinite,
    nonfinite_in_cache,
    nonfinite_tensors,
    require_labels_ok,
    tensor_stats,
)

__all__ = [
    "IGNORE_INDEX", "NonFinite", "CacheFinding", "LabelProblem", "NonFiniteError", "BadLabelsError",
    "first_nonfinite", "nonfinite_in_cache", "nonfinite_tensors", "check_labels", "require_labels_ok",
    "tensor_stats", "count_targets", "GuardConfig", "TrainingGuard", "NanGuardCallback", "load_last_good",
    "NanGuardTrainerCallback",
]


def __getattr__(name: str):
    """NanGuardTrainerCallback (a transformers.TrainerCallback subclass) imports transformers:
    only when asked for."""
    if name == "NanGuardTrainerCallback":
        from .hf_callback import NanGuardTrainerCallback

        return NanGuardTrainerCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
