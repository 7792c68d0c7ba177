"""Safe outputs: every artifact hf-unlearn writes goes through a temporary path and a rename.

A user points hf-unlearn at their only copy of a model, so nothing here may destroy or mix outputs:

* :func:`check_output_dir` refuses, *before any work*, an output folder that equals, lies inside or contains an
  input model folder, a non-empty output folder without ``overwrite=True``, and a parent that is not writable.
* :func:`atomic_directory` builds a whole result folder in a temporary sibling and swaps it in only when the
  ``with`` block finished without an exception; on any failure (full disk, read-only folder, an exception in the
  caller's code) the previous output is left exactly as it was and the temporary folder is removed.
* :func:`atomic_write_text`, :func:`atomic_write_bytes` and :func:`atomic_write_json` write one file through a
  temporary file in the same folder, ``fsync`` and ``os.replace``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "OutputDirError",
    "OutputWriteError",
    "atomic_directory",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "check_output_dir",
]


class OutputDirError(ValueError):
    """An output folder that hf-unlearn refuses to write (raised before any work starts)."""


class OutputWriteError(OSError):
    """Writing a result failed (full disk, read-only folder, ...); the previous output was left unchanged. Its
    message is one line naming the folder and the reason."""


def _resolved(path: str | os.PathLike) -> Path:
    return Path(path).expanduser().resolve()


def _is_within(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def check_output_dir(
    output_dir: str | os.PathLike,
    inputs: Iterable[str | os.PathLike | None] = (),
    overwrite: bool = False,
) -> Path:
    """Validate ``output_dir`` before any work; return it resolved.

    Raises :class:`OutputDirError` when the folder

    * equals, lies inside, or contains any existing local folder in ``inputs`` (a model or data folder; Hub ids
      that are not local paths are ignored),
    * exists and is not empty while ``overwrite`` is false,
    * exists and is not a folder,
    * or cannot be created/written (its nearest existing ancestor is not writable).
    """
    out = _resolved(output_dir)
    for item in inputs:
        if item is None:
            continue
        src = Path(item).expanduser()
        if not src.exists():
            continue
        src = src.resolve()
        if _is_within(out, src) or _is_within(src, out):
            raise OutputDirError(
                f"Output folder {out} overlaps the input {src}; choose a folder outside the model folder so "
                "the input can never be overwritten."
            )
    if out.exists():
        if not out.is_dir():
            raise OutputDirError(f"Output path {out} exists and is not a folder.")
        if any(out.iterdir()) and not overwrite:
            raise OutputDirError(
                f"Output folder {out} is not empty; pass overwrite=True (CLI: --overwrite) to replace it. "
                "The new result is built beside it and swapped in only when complete."
            )
    probe = out
    while not probe.exists():
        probe = probe.parent
    if not os.access(probe, os.W_OK | os.X_OK):
        raise OutputDirError(f"Output folder {out} cannot be written: {probe} is not writable.")
    if out.exists() and not os.access(out.parent, os.W_OK | os.X_OK):
        raise OutputDirError(f"Output folder {out} cannot be replaced: {out.parent} is not writable.")
    return out


@contextlib.contextmanager
def atomic_directory(
    final_dir: str | os.PathLike, overwrite: bool = False, keep: Iterable[str] = ()
) -> Iterator[Path]:
    """Build a folder in a temporary sibling and swap it in as ``final_dir`` only on success.

    ``with atomic_directory(out, overwrite=True) as tmp: model.save_pretrained(tmp)``: while the block runs,
    ``out`` keeps its previous content. When the block ends without an exception, the previous folder (if any) is
    renamed aside, the new one renamed into place, and the old one deleted. On an exception the temporary folder
    is removed and ``out`` is untouched. A non-empty ``final_dir`` without ``overwrite`` is refused up front.

    ``keep`` lists glob patterns of entries of the previous folder that are not part of the result and move into
    the new folder after the swap (a training run's ``checkpoint-*`` folders when its final model is saved into
    the run folder); an entry the new folder already has is not moved.
    """
    keep = tuple(keep)
    final = _resolved(final_dir)
    if final.exists() and (not final.is_dir() or any(final.iterdir())) and not overwrite:
        raise OutputDirError(f"Output folder {final} is not empty; pass overwrite=True (CLI: --overwrite).")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    try:
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
            old.rmdir()
            os.replace(final, old)
        os.replace(tmp, final)
    except BaseException:
        if old is not None and old.exists() and not final.exists():
            os.replace(old, final)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        for pattern in keep:
            for entry in old.glob(pattern):
                if not (final / entry.name).exists():
                    os.replace(entry, final / entry.name)
        shutil.rmtree(old, ignore_errors=True)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder, ``fsync`` and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (see :func:`atomic_write_bytes`)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON to ``path`` atomically; NaN and infinity are refused (``allow_nan=False``)."""
    return atomic_write_text(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")
