"""Model-directory checker: complete, consistent, safe to load. Headers only by default.

Public API: check_dir(path, deep=False, allow_remote_code=False, allow_pickle=False) -> DirReport,
Finding, DirReport, CODES (every finding code with its default severity and meaning).
Nothing in the directory is ever unpickled, imported or followed out of it.
"""

from .check import check_dir
from .findings import CODES, DirReport, Finding, codes_table_markdown

__all__ = ["check_dir", "CODES", "DirReport", "Finding", "codes_table_markdown"]
