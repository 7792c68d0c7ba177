"""Safe outputs: every path passes the write gate (no symbolic link anywhere), is checked before any work, and is
written through a temporary path and a rename under the folder's lock; on failure the previous output is left as
it was. Created folders and files get the mode ``os.mkdir`` / ``open`` give (less the umask)."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from .locking import (
    LOCK_SUFFIX,
    _all_ranks_ok,
    _is_secondary_rank,
    _locked_message,
    _share_from_main,
    _wait_for_all_ranks,
    _world_size,
    lock_holder,
    lock_path,
    output_lock,
)
from .write_gate import OutputDirError, OutputLockedError, OutputWriteError, gated_path

__all__ = [
    "OutputDirError", "OutputLockedError", "OutputWriteError", "append_text", "atomic_directory",
    "atomic_write_bytes", "atomic_write_json", "atomic_write_text", "check_output_dir", "check_report_path",
    "gated_path", "keep_failed", "lock_path", "lock_holder", "output_lock",
]

#: The suffix of the folder beside an output where the CLI keeps a failed run's work (:func:`keep_failed`).
FAILED_SUFFIX = ".failed"


_UMASK_LOCK = threading.Lock()


def _umask() -> int:
    try:  # Linux reports it without changing it
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:  # elsewhere reading the umask means setting it (briefly to the stricter 0o077)
        mask = os.umask(0o077)
        os.umask(mask)
    return mask


def _folder_state(path: Path) -> tuple[int, int, bool] | None:
    """``(device, inode, non-empty)`` of ``path`` (a non-folder counts as non-empty), ``None`` when missing."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    full = not path.is_dir() or any(path.iterdir())
    return st.st_dev, st.st_ino, full


def _is_within(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def check_output_dir(
    output_dir: str | os.PathLike, inputs: Iterable[str | os.PathLike | None] = (), overwrite: bool = False,
    siblings: Iterable[str] = (),
) -> Path:
    """Validate ``output_dir`` before any work; return it absolute. Refused (:class:`OutputDirError`): a
    path through a link; a folder that equals, lies inside or contains a local ``inputs`` path (so do its ``.lock``
    and ``<folder><suffix>`` for ``siblings``); a non-empty folder without ``overwrite``; a non-folder; no write
    access; another live process's lock (:class:`OutputLockedError`)."""
    out = gated_path(output_dir)
    holder = None if _is_secondary_rank() else lock_holder(out)
    if holder is not None:
        raise OutputLockedError(_locked_message(lock_path(out), holder))
    beside = [out.parent / f"{out.name}{suffix}" for suffix in (LOCK_SUFFIX, *siblings)]
    for src in _local_inputs(inputs):
        if _is_within(out, src) or _is_within(src, out):
            raise OutputDirError(f"Output folder {out} overlaps the input {src}; choose a folder outside the "
                                 "model folder so the input can never be overwritten.")
        for path in beside:
            if _is_within(src, path):
                raise OutputDirError(f"The input {src} lies where the run on output folder {out} writes {path}; "
                                     "rename that input or choose another output folder.")
    if out.exists():
        if not out.is_dir():
            raise OutputDirError(f"Output path {out} exists and is not a folder.")
        if any(out.iterdir()) and not overwrite:
            steps = [int(p.name[len("checkpoint-"):]) for p in out.glob("checkpoint-*")
                     if p.is_dir() and p.name[len("checkpoint-"):].isdigit()]
            if steps:
                raise OutputDirError(f"Output folder {out} holds an interrupted run (its last checkpoint "
                                     f"checkpoint-{max(steps)}); pass --resume (Python: "
                                     "resume_from_checkpoint=True) to continue it, or give another output folder.")
            raise OutputDirError(f"Output folder {out} is not empty; pass overwrite=True (CLI: --overwrite) to "
                                 "replace it. The new result is built beside it and swapped in only when complete.")
    probe = out
    while not probe.exists():
        probe = probe.parent
    if not os.access(probe, os.W_OK | os.X_OK):
        raise OutputDirError(f"Output folder {out} cannot be written: {probe} is not writable.")
    if out.exists() and not os.access(out.parent, os.W_OK | os.X_OK):
        raise OutputDirError(f"Output folder {out} cannot be replaced: {out.parent} is not writable.")
    return out


def _local_inputs(inputs: Iterable[str | os.PathLike | None]) -> list[Path]:
    """The resolved paths of the ``inputs`` that exist locally."""
    paths = [Path(item).expanduser() for item in inputs if item is not None and str(item) != ""]
    return [src.resolve() for src in paths if src.exists()]


def check_report_path(path: str | os.PathLike, inputs: Iterable[str | os.PathLike | None] = (),
                      overwrite: bool = False) -> Path:
    """Validate a report file path before any work; return it absolute. Refused: a path through a link, a
    folder, an existing file without ``overwrite``, a path inside a local ``inputs`` path, no write access."""
    given = Path(path).expanduser()
    if not given.name or given.name in (".", ".."):
        raise OutputDirError(f"Report path {path} names a folder; give a file path for the JSON.")
    target = gated_path(path, "Report path")
    if target.is_dir():
        raise OutputDirError(f"Report path {path} is a folder; give a file path for the JSON.")
    for src in _local_inputs(inputs):
        if _is_within(target, src):
            raise OutputDirError(f"Report path {path} lies inside the input {src}; write the report outside the "
                                 "model folder so none of its files can be replaced.")
    if target.exists() and not overwrite:
        raise OutputDirError(f"Report path {path} exists; pass overwrite=True (CLI: --overwrite) to replace it.")
    probe = target.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise OutputDirError(f"Report path {path} cannot be written: {probe} is not a writable folder.")
    return target


def keep_failed(work: str | os.PathLike, output_dir: str | os.PathLike) -> Path:
    """Move ``work`` (a failed run's temporary folder) to ``<output_dir>.failed`` (or a stamped variant), a name
    claimed by an exclusive ``mkdir`` so that nothing is replaced; return it."""
    out = gated_path(output_dir)
    if _is_secondary_rank():  # the main process of a distributed launch moves the shared work folder
        return Path(work)
    stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S")
    names = [f"{out.name}{FAILED_SUFFIX}"]
    names += [f"{out.name}{FAILED_SUFFIX}-{stamp}-{os.getpid()}" + (f"-{i}" if i else "") for i in range(20)]
    for name in names:
        kept = out.parent / name
        try:
            os.mkdir(kept)
        except FileExistsError:
            continue
        try:
            os.rename(work, kept)  # onto the empty folder this call just made
        except OSError:
            with contextlib.suppress(OSError):
                os.rmdir(kept)
            continue
        return kept
    raise OutputWriteError(f"The failed run's work folder {work} could not be moved beside {out}; it was left as "
                           "it is.")


@contextlib.contextmanager
def atomic_directory(
    final_dir: str | os.PathLike, overwrite: bool = False, keep: Iterable[str] = (), lock: bool = True,
    all_ranks: bool = False,
) -> Iterator[Path]:
    """Build a folder in a temporary sibling and swap it in as ``final_dir`` only when the block ends
    without an exception; on an exception ``final_dir`` is untouched. A non-empty ``final_dir`` without ``overwrite``
    is refused up front. The block holds the folder's lock (``lock=False``: the caller holds one). A folder that
    changed meanwhile is not replaced: the result is kept at ``<final_dir>.new-*`` and :class:`OutputDirError` raised.
    ``keep``: glob patterns of the previous folder's entries moved into the new one. ``all_ranks``: every process of a
    ``torch.distributed`` launch enters; rank 0 swaps the folder in when all finished."""
    if all_ranks and _world_size() > 1:
        with _atomic_directory_all_ranks(final_dir, overwrite, tuple(keep), lock) as tmp:
            yield tmp
        return
    keep = tuple(keep)
    final = gated_path(final_dir)
    with output_lock(final, enabled=None if lock else False):
        before = _folder_state(final)
        if before is not None and before[2] and not overwrite:
            raise OutputDirError(f"Output folder {final} is not empty; pass overwrite=True (CLI: --overwrite).")
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-{os.getpid()}-", dir=final.parent))
        os.chmod(tmp, 0o777 & ~_umask())  # os.mkdir's mode, not mkdtemp's 0o700
        try:
            yield tmp
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        # a non-empty folder that another one replaced since the start check, or that was filled meanwhile
        # without overwrite, holds what the swap must not destroy
        now = _folder_state(final)
        if now is not None and now[2] and (before is None or before[:2] != now[:2] or not (overwrite or before[2])):
            kept = Path(tempfile.mkdtemp(prefix=f"{final.name}.new-", dir=final.parent))
            kept.rmdir()
            os.replace(tmp, kept)
            raise OutputDirError(f"Output folder {final} changed while the result was being built (another "
                                 f"process wrote it); it was left as it is, and the new result is in {kept}.")
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


@contextlib.contextmanager
def _atomic_directory_all_ranks(final_dir: str | os.PathLike, overwrite: bool, keep: tuple[str, ...],
                                lock: bool) -> Iterator[Path]:
    """:func:`atomic_directory` entered by every process of a launch (rank 0 owns the folder)."""
    final = gated_path(final_dir)
    main = not _is_secondary_rank()
    owner = atomic_directory(final, overwrite=overwrite, keep=keep, lock=lock) if main else None
    failure: BaseException | None = None
    tmp: Path | None = None
    if owner is not None:
        try:
            tmp = owner.__enter__()
        except Exception as exc:  # told to the others before it is raised here
            failure = exc
    shared = _share_from_main(str(tmp) if tmp is not None else None)
    if failure is not None:
        raise failure
    if shared is None:
        raise OutputDirError(f"The main process of this launch could not prepare the output folder {final}; see "
                             "its error.")
    tmp = Path(shared)
    try:
        yield tmp
    except BaseException as exc:
        _all_ranks_ok(False)
        if owner is not None:
            owner.__exit__(type(exc), exc, exc.__traceback__)  # removes the temporary folder
        raise
    if not _all_ranks_ok(True):
        if owner is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            with contextlib.suppress(BaseException):
                owner.__exit__(OutputWriteError, OutputWriteError("another process failed"), None)
        raise OutputWriteError(f"Another process of this launch failed while the result for {final} was being "
                               f"built; {final} was left as it was.")
    error = None
    if owner is not None:
        try:
            owner.__exit__(None, None, None)  # the swap
        except Exception as exc:
            failure, error = exc, str(exc).replace("\n", " ")
    error = _share_from_main(error)
    if failure is not None:
        raise failure
    if error is not None:
        raise OutputWriteError(f"The main process of this launch could not swap in {final}: {error}")
    _wait_for_all_ranks()


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file, ``fsync`` and a rename."""
    path = gated_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def append_text(path: str | os.PathLike, text: str) -> Path:
    """Append ``text`` (UTF-8) to the log ``path``, never through a link."""
    path = gated_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        fh.write(text)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON atomically; NaN and infinity are refused."""
    return atomic_write_text(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")
