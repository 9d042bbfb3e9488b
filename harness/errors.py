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


def error_code(exc: BaseException) -> str:
    """The machine-readable kind of an error, the `error_code` of a command's JSON error object."""
    if isinstance(exc, UnsupportedError):
        return "unsupported"
    if isinstance(exc, UsageError):
        return "bad_usage"
    if isinstance(exc, CheckFailed):
        return "check_failed"
    if isinstance(exc, OSError):
        return "file_error"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    return "failed"


def os_error_line(exc: OSError) -> str:
    """'PATH: why' for an OSError about a file (permission denied, a part of the path is a file...)."""
    import re
    from pathlib import PurePath

    why = exc.strerror or type(exc).__name__
    if isinstance(exc, (NotADirectoryError, FileExistsError)):
        why += " (a part of the path is a file, not a folder?)"
    if exc.filename is None:
        return why
    path = PurePath(str(exc.filename))
    if re.fullmatch(r"\..+\.[^.]+\.tmp", path.name):  # harness.atomic's temporary file: the folder is the problem
        return f"cannot write into the folder {str(path.parent)!r} ({why})"
    return f"{exc.filename}: {why}"
