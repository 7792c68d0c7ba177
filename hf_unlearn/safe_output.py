"""Safe outputs: every artifact hf-unlearn writes goes through a temporary path and a rename.

A user points hf-unlearn at their only copy of a model, so nothing here may destroy or mix outputs:

* :func:`check_output_dir` refuses, *before any work*, an output folder that equals, lies inside or contains an
  input model folder, a non-empty output folder without ``overwrite=True``, and a parent that is not writable.
* :func:`atomic_directory` builds a whole result folder in a temporary sibling and swaps it in only when the
  ``with`` block finished without an exception; on any failure (full disk, read-only folder, an exception in the
  caller's code) the previous output is left exactly as it was and the temporary folder is removed.
* :func:`output_lock` holds an exclusive lock on an output folder (the lock file ``<folder>.lock`` beside it,
  naming the holder's pid, host and start time) while a run writes it: a second process that wants to write the
  same folder is refused before any work with one line naming the holder (:class:`OutputLockedError`).
  :func:`check_output_dir` refuses a folder that another live process holds, and :func:`atomic_directory` holds
  the lock while it builds and swaps. The lock is an ``flock`` on the lock file, so the kernel releases it when
  its process dies; the file of a dead holder is taken over with a warning naming it. Locks are re-entrant
  within a process, and the non-zero ranks of a ``torch.distributed`` launch (environment variable ``RANK``)
  neither take nor check them (their main process does).
* :func:`atomic_write_text`, :func:`atomic_write_bytes` and :func:`atomic_write_json` write one file through a
  temporary file in the same folder, ``fsync`` and ``os.replace``.

Folders created here get the mode an ``os.mkdir`` would give them (``0o777`` less the umask), not the ``0o700``
of a temporary folder, so that a shared model folder stays readable by the group.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "OutputDirError",
    "OutputLockedError",
    "OutputWriteError",
    "atomic_directory",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "check_output_dir",
    "lock_path",
    "lock_holder",
    "output_lock",
]

LOCK_SUFFIX = ".lock"


class OutputDirError(ValueError):
    """An output folder that hf-unlearn refuses to write (raised before any work starts)."""


class OutputWriteError(OSError):
    """Writing a result failed (full disk, read-only folder, ...); the previous output was left unchanged. Its
    message is one line naming the folder and the reason."""


class OutputLockedError(OutputDirError):
    """Another live process holds the output folder's lock (raised before any work starts). Its message is one line
    naming the holder."""


def _resolved(path: str | os.PathLike) -> Path:
    return Path(path).expanduser().resolve()


# ----- folder modes ---------------------------------------------------------------------------------------------

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


def _make_temp_dir(prefix: str, parent: Path) -> Path:
    """``tempfile.mkdtemp`` with the mode ``os.mkdir`` gives (``0o777 & ~umask``) instead of ``0o700``."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(folder, 0o777 & ~_umask())
    return folder


# ----- the output lock ------------------------------------------------------------------------------------------


def lock_path(output_dir: str | os.PathLike) -> Path:
    """The lock file of an output folder: ``<folder>.lock`` beside it."""
    out = _resolved(output_dir)
    return out.parent / f"{out.name}{LOCK_SUFFIX}"


def _is_secondary_rank() -> bool:
    """A non-zero rank of a ``torch.distributed`` launch: its main process (rank 0) locks and checks for it."""
    try:
        return int(os.environ.get("RANK", "0")) != 0
    except ValueError:
        return False


@dataclass
class _Held:
    fd: int
    count: int
    created: list[Path]


_HELD: dict[Path, _Held] = {}
_HELD_LOCK = threading.RLock()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    except OSError:
        return False
    return True


def _read_holder(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
        holder = json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "another process (its lock file is being written)"
    what = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"
    if holder.get("started"):
        what += f" since {holder['started']}"
    if holder.get("command"):
        what += f" ({holder['command']})"
    return what


def _locked_message(path: Path, holder: dict[str, Any]) -> str:
    folder = path.parent / path.name[: -len(LOCK_SUFFIX)]
    return (
        f"Output folder {folder} is in use by {_describe(holder)}; wait for that run to finish or choose another "
        f"output folder (lock file {path})."
    )


def _flock(fd: int) -> bool:
    """Try to take an exclusive, non-blocking ``flock``; ``False`` when another open file description holds it."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (BlockingIOError, PermissionError):
        return False
    return True


def lock_holder(output_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The holder (``pid``, ``host``, ``started``, ``command``) of the lock of ``output_dir`` when a live process
    other than this one holds it, else ``None``. Creates nothing."""
    path = lock_path(output_dir)
    with _HELD_LOCK:
        if path in _HELD:
            return None
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:  # no lock file (or none this process could take: output_lock then says why)
            return None
        try:
            if _flock(fd):
                return None  # a left-over file of a dead holder: free (closing the descriptor releases the flock)
            return _read_holder(path)
        finally:
            os.close(fd)


def _acquire(path: Path) -> _Held:
    created: list[Path] = []
    probe = path.parent
    while not probe.exists():
        created.append(probe)
        probe = probe.parent
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except FileNotFoundError:  # the parent was removed meanwhile: try again
            continue
        except OSError as exc:
            reason = (exc.strerror or str(exc)).replace("\n", " ")
            raise OutputDirError(
                f"Output folder {path.parent / path.name[: -len(LOCK_SUFFIX)]} cannot be written: its lock file "
                f"{path} cannot be created ({reason})."
            ) from exc
        if not _flock(fd):
            holder = _read_holder(path)
            os.close(fd)
            raise OutputLockedError(_locked_message(path, holder))
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder released (and removed) the file between our open and our lock: take the new one
    previous = _read_holder(path)
    if previous.get("pid") is not None:
        alive = previous.get("host") == socket.gethostname() and _pid_alive(int(previous["pid"]))
        state = "is no longer running" if not alive else "no longer holds it"
        warnings.warn(f"Took over the stale lock {path} of {_describe(previous)}, which {state}.", stacklevel=4)
    holder = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(sys.argv)[:200],
    }
    data = (json.dumps(holder) + "\n").encode("utf-8")
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)
    return _Held(fd, 1, created)


def _release(path: Path, held: _Held) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)  # while still holding the flock, so that nobody locks a file that is about to vanish
    os.close(held.fd)
    for folder in held.created:  # parents this lock created, when nothing else was put there
        try:
            folder.rmdir()
        except OSError:
            break


@contextlib.contextmanager
def output_lock(output_dir: str | os.PathLike | None, enabled: bool | None = None) -> Iterator[Path | None]:
    """Hold the exclusive lock of ``output_dir`` for the ``with`` block; yield the lock file's path.

    Raises :class:`OutputLockedError` (one line naming the holder's pid, host, start time and command) when
    another live process holds it. Re-entrant within a process. The lock file ``<output_dir>.lock`` lives beside
    the folder (its parent is created when missing, and removed again on release when the lock put it there) and
    is removed on release; a lock file left by a process that died is taken over with a warning.
    ``output_dir=None`` or ``enabled=False`` does nothing; ``enabled=None`` locks unless this process is a
    non-zero rank of a ``torch.distributed`` launch.
    """
    if output_dir is None or enabled is False or (enabled is None and _is_secondary_rank()):
        yield None
        return
    path = lock_path(output_dir)
    with _HELD_LOCK:
        held = _HELD.get(path)
        if held is not None:
            held.count += 1
        else:
            held = _HELD[path] = _acquire(path)
    try:
        yield path
    finally:
        with _HELD_LOCK:
            held.count -= 1
            if held.count == 0:
                del _HELD[path]
                _release(path, held)


def _folder_state(path: Path) -> tuple[int, int, bool] | None:
    """``(device, inode, non-empty)`` of ``path`` (a non-folder counts as non-empty), ``None`` when missing."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    full = not path.is_dir() or any(path.iterdir())
    return st.st_dev, st.st_ino, full


def _changed_since(before: tuple[int, int, bool] | None, now: tuple[int, int, bool] | None, overwrite: bool) -> bool:
    """Whether swapping a result into a folder now in state ``now`` would destroy something that was not there
    (or not allowed to be replaced) at the start check, in state ``before``."""
    if now is None or not now[2]:
        return False  # missing or empty: nothing to lose
    if before is None or before[:2] != now[:2]:
        return True  # another folder (or file) took its place since the start check
    return not (overwrite or before[2])  # the same folder: filled meanwhile, and overwrite was not asked


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
    * cannot be created/written (its nearest existing ancestor is not writable),
    * or is locked by another live process (:class:`OutputLockedError`, naming the holder; see
      :func:`output_lock`).
    """
    out = _resolved(output_dir)
    holder = None if _is_secondary_rank() else lock_holder(out)
    if holder is not None:
        raise OutputLockedError(_locked_message(lock_path(out), holder))
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
    final_dir: str | os.PathLike, overwrite: bool = False, keep: Iterable[str] = (), lock: bool = True
) -> Iterator[Path]:
    """Build a folder in a temporary sibling and swap it in as ``final_dir`` only on success.

    ``with atomic_directory(out, overwrite=True) as tmp: model.save_pretrained(tmp)``: while the block runs,
    ``out`` keeps its previous content. When the block ends without an exception, the previous folder (if any) is
    renamed aside, the new one renamed into place, and the old one deleted. On an exception the temporary folder
    is removed and ``out`` is untouched. A non-empty ``final_dir`` without ``overwrite`` is refused up front.

    The whole block holds the lock of ``final_dir`` (:func:`output_lock`; ``lock=False`` when the caller holds
    the lock of an enclosing folder, as a training run does for its checkpoints), so another process writing it
    is refused. The swap itself refuses (:class:`OutputDirError`) to replace a folder that changed since the start
    of the block: one that another folder or file took the place of, or, without ``overwrite``, one that was
    missing or empty and is not any more; the new result is then kept beside it (``<final_dir>.new-*``, named in
    the message) and ``final_dir`` is left as it is. The new folder gets the mode of an ``os.mkdir``
    (``0o777`` less the umask).

    ``keep`` lists glob patterns of entries of the previous folder that are not part of the result and move into
    the new folder after the swap (a training run's ``checkpoint-*`` folders when its final model is saved into
    the run folder); an entry the new folder already has is not moved.
    """
    keep = tuple(keep)
    final = _resolved(final_dir)
    with output_lock(final, enabled=None if lock else False):
        before = _folder_state(final)
        if before is not None and before[2] and not overwrite:
            raise OutputDirError(f"Output folder {final} is not empty; pass overwrite=True (CLI: --overwrite).")
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = _make_temp_dir(f".{final.name}.tmp-", final.parent)
        try:
            yield tmp
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if _changed_since(before, _folder_state(final), overwrite):
            kept = Path(tempfile.mkdtemp(prefix=f"{final.name}.new-", dir=final.parent))
            kept.rmdir()
            os.replace(tmp, kept)
            raise OutputDirError(
                f"Output folder {final} changed while the result was being built (another process wrote it); it "
                f"was left as it is, and the new result is in {kept}."
            )
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
    """Write ``data`` to ``path`` through a temporary file in the same folder, ``fsync`` and a rename. The file gets
    the mode ``open`` would give it (``0o666`` less the umask), not ``mkstemp``'s ``0o600``."""
    path = Path(path)
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


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (see :func:`atomic_write_bytes`)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON to ``path`` atomically; NaN and infinity are refused (``allow_nan=False``)."""
    return atomic_write_text(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")
