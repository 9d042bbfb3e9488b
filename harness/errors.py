"""Errors that cross module lines. The CLI turns them into one line and an exit code."""


class HarnessError(Exception):
    """Base class: a problem the user can act on, reported as one line."""

    exit_code = 1


class UsageError(HarnessError):
    """Bad input: an option, a path, a value. Exit code 2."""

    exit_code = 2


class CheckFailed(HarnessError):
    """A check ran and found a problem. Exit code 1."""

    exit_code = 1


class UnsupportedError(UsageError):
    """A combination that cannot run here (e.g. 4-bit without bitsandbytes)."""


def one_line(message: str) -> str:
    """The message with its control characters escaped, so it stays one line: a results file's
    field may hold a carriage return or a newline, and the CLI promises one line per error."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in message)
