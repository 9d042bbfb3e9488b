"""Diagnostics and benchmarks for fine-tuning and serving LLMs on small GPUs.

The library is importable without pytest; ``harness.plugin`` is the only pytest-aware module.
"""

__version__ = "0.1.0"
