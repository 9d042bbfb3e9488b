"""From an error text to its cause and the fix: which failure a log, traceback or pasted message
shows (CUDA or host out-of-memory, driver/CUDA/torch mismatch, bitsandbytes set-up, NaN loss, vLLM
start-up, model directory, GPU hardware, NCCL), the ranked causes with the lines that show them,
and the fix, computed with the harness's planners where the log gives figures.

    from harness.explain import explain
    result = explain(log_text)             # an Explanation (plain dataclass)
    result.recognised, result.kind, result.fix, result.computed

Recognisers match the libraries' real message formats (see docs/explain.md), after removing ANSI
colours, progress-bar carriage returns and the line prefixes vLLM, Ray, torchrun, docker and the
kernel log add. Text no recogniser knows is reported as not recognised, never guessed at.
"""

from .core import KINDS, explain, explain_short
from .model import Cause, Explanation, Finding

__all__ = ["KINDS", "explain", "explain_short", "Cause", "Explanation", "Finding"]
