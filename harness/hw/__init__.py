"""Is this machine ready: driver, CUDA, torch, bitsandbytes, vLLM, NVML health, bandwidth.

One module per concern; every check returns a :class:`CheckResult`. Modules that need torch
import it inside their functions, so importing this package stays cheap.
"""

from .result import VERDICTS, CheckResult

__all__ = ["CheckResult", "VERDICTS"]
