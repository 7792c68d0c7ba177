"""The write gate: :func:`gated_path` refuses a symbolic link anywhere in a path hf-unlearn writes (a dangling one
too), so that nothing can land anywhere but where the path's own folders say."""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["OutputDirError", "OutputLockedError", "OutputWriteError", "gated_path"]


class OutputDirError(ValueError):
    """An output path that hf-unlearn refuses to write (raised before any work starts)."""


class OutputWriteError(OSError):
    """Writing a result failed; the previous output was left unchanged."""


class OutputLockedError(OutputDirError):
    """Another live process holds the output folder's lock (raised before any work starts)."""


def gated_path(path: str | os.PathLike, what: str = "Output path") -> Path:
    """``path`` made absolute, each component checked: :class:`OutputDirError` (naming the link and its target)
    when any is a symbolic link."""
    given = Path(path).expanduser()
    current = Path(given.anchor) if given.is_absolute() else Path.cwd()
    for part in given.parts[1:] if given.is_absolute() else given.parts:
        if part in ("", "."):
            continue
        current = current.parent if part == ".." else current / part
        try:
            is_link = stat.S_ISLNK(os.lstat(current).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            continue
        if is_link:
            raise OutputDirError(f"{what} {path} goes through the symbolic link {current} (to "
                                 f"{os.readlink(current)}); hf-unlearn never writes through a link: give the real "
                                 f"path ({Path(current).resolve()} for that part).")
    return current
