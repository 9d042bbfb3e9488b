"""The training guard as a real `transformers.TrainerCallback` subclass.

`harness.nan.NanGuardCallback` is duck-typed (the Trainer calls its event methods; importing
harness.nan does not import transformers). `NanGuardTrainerCallback` is the same guard with
TrainerCallback among its bases, for code that checks isinstance (callback lists built by other
libraries, `trainer.pop_callback(TrainerCallback subclass)`); importing it imports transformers.
One line in a Trainer script::

    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[NanGuardTrainerCallback("runs/guard")])
"""

from __future__ import annotations

from transformers import TrainerCallback

from .guard import NanGuardCallback


class NanGuardTrainerCallback(NanGuardCallback, TrainerCallback):
    """Stops trainer.train() with NonFiniteError at the first non-finite loss, gradient or update,
    names it, and leaves the last good adapter and optimizer state on disk (load_last_good)."""
