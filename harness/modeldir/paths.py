"""A read-only view of a model directory that never leaves it.

Every entry is listed with lstat (symlinks are not followed while walking); a path is opened
only after it was resolved and found inside the directory and to be a regular file. Escapes are
reported, never opened. Byte counts of everything read are kept, so a caller can prove that a
header-only check read no tensor data.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ..errors import UsageError

MAX_JSON_BYTES = 64 * 1024 * 1024  # config/tokenizer/index files larger than this are not read
MAX_DEPTH = 200  # folders nested deeper than this are reported, not walked


class PathEscape(Exception):
    """A path that resolves outside the directory."""


class NotAFile(Exception):
    """A path that is not a regular file (FIFO, socket, device, directory)."""


@dataclass
class Entry:
    rel: str  # posix path relative to the root
    kind: str  # "file" | "dir" | "symlink" | "special"
    size: int = 0
    target: str | None = None  # for symlinks: the resolved absolute target
    inside: bool = True  # for symlinks: does the target stay inside the root?


@dataclass
class DirView:
    root: Path
    entries: dict[str, Entry] = field(default_factory=dict)
    bytes_read: int = 0
    blobs: Path | None = None  # a Hugging Face cache snapshot's own blobs/ folder: links into it stay inside
    _json: dict = field(default_factory=dict, repr=False)  # rel -> parsed JSON (or the ValueError), read once

    @classmethod
    def open(cls, path: str | os.PathLike) -> "DirView":
        """Validate DIR (UsageError: missing, not a directory, unreadable, empty) and list it."""
        if not str(path).strip():
            raise UsageError("DIR is empty: give the model directory to check (use . for the current one)")
        raw = Path(path).expanduser()
        if not os.path.lexists(raw):
            raise UsageError(f"{raw}: no such directory")
        if not raw.is_dir():
            kind = "a file, not a directory" if raw.is_file() else "not a directory"
            raise UsageError(f"{raw}: {kind}: give the model folder (the one that holds config.json)")
        try:
            names = os.listdir(raw)
        except PermissionError:
            raise UsageError(f"{raw}: permission denied (cannot list the directory)") from None
        except OSError as exc:
            raise UsageError(f"{raw}: cannot list the directory ({exc.strerror})") from None
        if not names:
            raise UsageError(f"{raw}: the directory is empty")
        view = cls(root=raw.resolve())
        view.blobs = hf_cache_blobs(view.root)
        view._walk(view.root, "")
        return view

    def _walk(self, directory: Path, prefix: str, depth: int = 0) -> None:
        try:
            items = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            self.entries[prefix or "."] = Entry(prefix or ".", "unreadable_dir")
            return
        for item in items:
            rel = f"{prefix}{item.name}"
            st = item.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                target = os.path.realpath(item.path)
                inside = self._inside(Path(target))
                self.entries[rel] = Entry(rel, "symlink", 0, target, inside)
            elif stat.S_ISDIR(st.st_mode):
                self.entries[rel] = Entry(rel, "dir")
                # any depth (a pickle 10 folders down is still a pickle); symlinks are never
                # followed, so the walk cannot loop, and the depth only guards the stack
                if depth < MAX_DEPTH:
                    self._walk(Path(item.path), rel + "/", depth + 1)
                else:
                    self.entries[rel] = Entry(rel, "too_deep")
            elif stat.S_ISREG(st.st_mode):
                self.entries[rel] = Entry(rel, "file", st.st_size)
            else:
                self.entries[rel] = Entry(rel, "special")

    def _inside(self, real: Path) -> bool:
        """Inside the directory, or a file in the cache's own blobs/ when DIR is a cache snapshot."""
        if _is_inside(real, self.root):
            return True
        return self.blobs is not None and real.parent == self.blobs

    # -- queries ----------------------------------------------------------------------------

    def top_level(self) -> list[str]:
        return [rel for rel in self.entries if "/" not in rel]

    def exists(self, rel: str) -> bool:
        """A regular file (or an inside symlink to one) at `rel`."""
        entry = self.entries.get(rel)
        if entry is None:
            return False
        if entry.kind == "file":
            return True
        if entry.kind == "symlink" and entry.inside:
            return os.path.isfile(entry.target)
        return False

    def resolve(self, rel: str) -> Path:
        """The real path of `rel` (an index entry or a listed name); PathEscape if it leaves."""
        pure = PurePosixPath(rel)
        if pure.is_absolute() or rel.startswith("\\") or (len(rel) > 1 and rel[1] == ":"):
            raise PathEscape(f"{rel!r} is an absolute path")
        real = Path(os.path.realpath(self.root / rel))
        if not self._inside(real):
            raise PathEscape(f"{rel!r} resolves to {real}, outside the directory")
        return real

    def size(self, rel: str) -> int:
        real = self.resolve(rel)
        return os.stat(real).st_size

    def open_binary(self, rel: str):
        real = self.resolve(rel)
        st = os.stat(real)
        if not stat.S_ISREG(st.st_mode):
            raise NotAFile(f"{rel} is not a regular file")
        return _CountingFile(open(real, "rb"), self)

    def read_bytes(self, rel: str, limit: int) -> bytes:
        with self.open_binary(rel) as fh:
            return fh.read(limit)

    def read_json(self, rel: str):
        """Parse a JSON file inside the directory; ValueError with a short reason if it is not."""
        if rel not in self._json:
            try:
                self._json[rel] = self._parse_json(rel)
            except ValueError as exc:
                self._json[rel] = exc
        if isinstance(self._json[rel], ValueError):
            raise self._json[rel]
        return self._json[rel]

    def _parse_json(self, rel: str):
        if self.size(rel) > MAX_JSON_BYTES:
            raise ValueError(f"larger than {MAX_JSON_BYTES // 2**20} MiB")
        data = self.read_bytes(rel, MAX_JSON_BYTES + 1)
        try:
            return json.loads(data.decode("utf-8"))
        except UnicodeDecodeError:
            raise ValueError("not UTF-8 text") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None


class _CountingFile:
    """A binary file wrapper that adds what it reads to the view's byte count."""

    def __init__(self, fh, view: DirView):
        self._fh = fh
        self._view = view

    def read(self, n: int = -1) -> bytes:
        data = self._fh.read(n)
        self._view.bytes_read += len(data)
        return data

    def readline(self, limit: int = -1) -> bytes:
        data = self._fh.readline(limit)
        self._view.bytes_read += len(data)
        return data

    def readinto(self, buffer) -> int:
        n = self._fh.readinto(buffer)
        self._view.bytes_read += n or 0
        return n

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._fh.seek(offset, whence)

    def tell(self) -> int:
        return self._fh.tell()

    def seekable(self) -> bool:
        return True

    def close(self) -> None:
        self._fh.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def hf_cache_blobs(root: Path) -> Path | None:
    """huggingface_hub's cache layout: <cache>/models--org--name/snapshots/<revision>/<file> are
    symlinks to ../../blobs/<hash>. For such a snapshot, that blobs/ folder (which the cache alone
    writes); None otherwise."""
    snapshots = root.parent
    repo = snapshots.parent
    if snapshots.name != "snapshots" or not repo.name.startswith(("models--", "datasets--", "spaces--")):
        return None
    blobs = repo / "blobs"
    return blobs if blobs.is_dir() and not blobs.is_symlink() else None


def _is_inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False
