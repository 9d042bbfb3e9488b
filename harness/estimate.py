"""Moved to :mod:`harness.memory.estimate`; this alias keeps old imports working."""

import sys

from .memory import estimate as _estimate

sys.modules[__name__] = _estimate
