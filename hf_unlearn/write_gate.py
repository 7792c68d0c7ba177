"""The write gate: the one check every path hf-unlearn writes passes first, and the errors it raises.

:func:`gated_path` walks a path component by component and refuses a symbolic link anywhere in it (a dangling one
too), so that nothing the package writes (an output folder, a report, a log, a lock file, a temporary or failed-run
folder beside an output) can land anywhere but where the path's own folders say. :mod:`hf_unlearn.safe_output`
builds its checks and writers on it, and :mod:`hf_unlearn.locking` its lock files.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["OutputDirError", "OutputLockedError", "OutputWriteError", "gated_path"]


class OutputDirError(ValueError):
    """An output path that hf-unlearn refuses to write (raised before any work starts)."""


class OutputWriteError(OSError):
    """Writing a result failed (full disk, read-only folder, ...); the previous output was left unchanged. Its
    message is one line naming the folder and the reason."""


class OutputLockedError(OutputDirError):
    """Another live process holds the output folder's lock (raised before any work starts). Its message is one line
    naming the holder."""


def gated_path(path: str | os.PathLike, what: str = "Output path") -> Path:
    """``path`` made absolute after checking each component: :class:`OutputDirError` (naming the link and its
    target) when any is a symbolic link, dangling or not; ``..`` steps to the parent of the checked components."""
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
            raise OutputDirError(
                f"{what} {path} goes through the symbolic link {current} (to {os.readlink(current)}); hf-unlearn "
                f"never writes through a link: give the real path ({Path(current).resolve()} for that part)."
            )
    return current
