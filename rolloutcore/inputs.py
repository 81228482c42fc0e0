"""How every command words an input it cannot read: the path first, then one of a few
fixed phrases, so that a user (or a script) sees the same line for the same cause
whichever command met it. Checks that are about an input's content (not a journal, not
JSON) stay with the reader of that content and name the line (``path:line: ...``)."""

from __future__ import annotations

import os
from pathlib import Path

StrPath = str | os.PathLike[str]


def unreadable(path: StrPath, err: OSError | UnicodeDecodeError) -> str:
    """The line for an input that could not be opened or decoded."""
    if isinstance(err, UnicodeDecodeError):
        return f"{path}: not UTF-8 text"
    if isinstance(err, FileNotFoundError):
        return f"{path}: no such file"
    if isinstance(err, IsADirectoryError):
        return f"{path}: is a directory"
    return f"{path}: cannot read: {err.strerror or err}"


def file_problem(path: StrPath) -> str | None:
    """Why ``path`` cannot be read as an input file (checked before any work), or None."""
    p = Path(path)
    if p.is_dir():
        return f"{path}: is a directory"
    if not p.is_file():
        return f"{path}: {'not a regular file' if p.exists() else 'no such file'}"
    return None


def directory_problem(path: StrPath) -> str | None:
    """Why ``path`` cannot be read as an input directory, or None."""
    p = Path(path)
    if p.is_dir():
        return None
    return f"{path}: {'not a directory' if p.exists() else 'no such directory'}"
