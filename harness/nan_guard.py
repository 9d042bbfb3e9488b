"""Moved to :mod:`harness.nan.guard`; this alias keeps old imports working."""

import sys

from .nan import guard as _guard

sys.modules[__name__] = _guard
