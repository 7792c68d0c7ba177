"""The output lock: ``<folder>.lock`` beside an output folder, an exclusive ``flock`` held while a run writes it.

:func:`output_lock` takes it (re-entrant within a process; the non-zero ranks of a ``torch.distributed`` launch
neither take nor check it), :func:`lock_holder` names a live holder, :func:`lock_path` is the file's path. The
file names the holder's pid, host, start time and command. The kernel releases the ``flock`` when its process
dies; the file of a dead holder is taken over with a warning, and when it ran on this host, the temporary folders
it left beside the output (``.<folder>.tmp-<its pid>-*``, :func:`hf_unlearn.safe_output.atomic_directory`'s
naming) are removed. The file is opened with ``O_NOFOLLOW``: a lock path that is a link (dangling or not), a
folder, a FIFO, a file with other hard links or a file holding anything but a lock record is refused in one line,
and every retry is bounded. :mod:`hf_unlearn.safe_output` re-exports all of it.

Under a ``torch.distributed`` launch the processes coordinate a shared output folder through three small helpers
(used by :func:`hf_unlearn.safe_output.atomic_directory` with ``all_ranks=True``): rank 0's value on every
process (a broadcast), whether a flag holds on every process, and a barrier.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import socket
import stat
import sys
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOCK_SUFFIX = ".lock"
#: How many times taking a lock is retried when its file vanishes or changes between the open and the ``flock``.
LOCK_TRIES = 20
#: The largest lock file read: a holder record is a few hundred bytes.
_LOCK_MAX_BYTES = 4096


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


def _world_size() -> int:
    """The number of processes of a ``torch.distributed`` launch (``WORLD_SIZE``; 1 outside one)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def _share_from_main(value: Any) -> Any:
    """Rank 0's ``value`` on every process of a ``torch.distributed`` launch (``value`` itself outside one).

    Every process must call it at the same point. The process group is started through accelerate's
    ``PartialState`` when none is running yet (the Trainer later reuses it)."""
    if _world_size() == 1:
        return value
    import torch.distributed as dist

    if not dist.is_initialized():
        from accelerate import PartialState

        PartialState()
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _all_ranks_ok(ok: bool) -> bool:
    """Whether ``ok`` holds on every process of a ``torch.distributed`` launch (one all-reduce of a flag, on CPU
    through ``all_gather_object`` so that any backend serves); ``ok`` itself outside one."""
    if _world_size() == 1:
        return ok
    import torch.distributed as dist

    if not dist.is_initialized():
        return ok
    flags: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(flags, bool(ok))
    return all(flags)


def _wait_for_all_ranks() -> None:
    """A barrier across the processes of a ``torch.distributed`` launch (nothing outside one)."""
    if _world_size() > 1:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()


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


def _read_holder(fd: int) -> dict[str, Any]:
    """The holder record in the open lock file ``fd`` (``{}`` when empty or unreadable); read through the
    descriptor, never by path, so a file swapped in meanwhile (a FIFO, a link) is never opened."""
    try:
        text = os.pread(fd, _LOCK_MAX_BYTES, 0).decode("utf-8")
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
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:  # no lock file (or none this process could take: output_lock then says why)
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None  # not a lock at all: output_lock refuses it
            if _flock(fd):
                return None  # a left-over file of a dead holder: free (closing the descriptor releases the flock)
            return _read_holder(fd)
        finally:
            os.close(fd)


def _folder_of(path: Path) -> Path:
    return path.parent / path.name[: -len(LOCK_SUFFIX)]


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):
        if test(mode):
            return name
    return "not a regular file"


def _lock_refused(path: Path, reason: str) -> OutputDirError:
    return OutputDirError(f"Output folder {_folder_of(path)} cannot be locked: its lock file {path} {reason}.")


def _open_lock(path: Path) -> int:
    """Open (creating when missing) the lock file ``path`` as a regular file of its own, never through a link."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise _lock_refused(path, f"is {_file_kind(st.st_mode)}; remove it (no hf-unlearn lock is one)")
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o666)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        what = _file_kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else "has other hard links"
        raise _lock_refused(path, f"{'is ' if not stat.S_ISREG(st.st_mode) else ''}{what}; remove it")
    return fd


def _foreign_content(fd: int) -> bool:
    """Whether the open lock file holds something other than a holder record (or nothing)."""
    if os.fstat(fd).st_size > _LOCK_MAX_BYTES:
        return True
    text = os.pread(fd, _LOCK_MAX_BYTES, 0)
    if not text.strip():
        return False
    try:
        holder = json.loads(text)
    except ValueError:
        return True
    return not (isinstance(holder, dict) and "pid" in holder)


def _locked_fd(path: Path) -> int:
    """A descriptor of ``path`` holding its ``flock`` (bounded retries when the file is swapped meanwhile)."""
    reason = f"it changed on each of {LOCK_TRIES} tries"
    for _ in range(LOCK_TRIES):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = _open_lock(path)
        except FileNotFoundError as exc:  # the parent was removed meanwhile (or cannot hold files): try again
            reason = (exc.strerror or str(exc)).replace("\n", " ")
            continue
        except OutputDirError:
            raise
        except OSError as exc:
            reason = (exc.strerror or str(exc)).replace("\n", " ")
            raise OutputDirError(
                f"Output folder {_folder_of(path)} cannot be written: its lock file {path} cannot be created "
                f"({reason})."
            ) from exc
        if not _flock(fd):
            holder = _read_holder(fd)
            os.close(fd)
            raise OutputLockedError(_locked_message(path, holder))
        try:
            same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the holder released (and removed) the file between our open and our lock: take the new one
    raise OutputDirError(
        f"Output folder {_folder_of(path)} cannot be written: its lock file {path} cannot be created ({reason})."
    )


def _remove_dead_temps(path: Path, pid: int) -> list[Path]:
    """Remove the temporary folders ``.<folder>.tmp-<pid>-*`` that the dead holder ``pid`` of the lock ``path``
    left beside the folder (:func:`atomic_directory` names them so); only real folders, never through a link."""
    prefix = f".{_folder_of(path).name}.tmp-{pid}-"
    removed = []
    try:
        entries = list(path.parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        try:
            if not stat.S_ISDIR(os.lstat(entry).st_mode):
                continue
            shutil.rmtree(entry)
        except OSError:
            continue
        removed.append(entry)
    return removed


def _acquire(path: Path) -> _Held:
    created: list[Path] = []
    probe = path.parent
    while not probe.exists() and probe != probe.parent:
        created.append(probe)
        probe = probe.parent
    fd = _locked_fd(path)
    if _foreign_content(fd):
        os.close(fd)
        raise _lock_refused(path, "holds something other than an hf-unlearn lock; move it away or choose another "
                                  "output folder")
    previous = _read_holder(fd)
    if previous.get("pid") is not None:
        here = previous.get("host") == socket.gethostname()
        try:
            pid = int(previous["pid"])
        except (TypeError, ValueError):
            pid, here = -1, False
        alive = here and _pid_alive(pid)
        state = "is no longer running" if not alive else "no longer holds it"
        removed = _remove_dead_temps(path, pid) if here and not alive and pid > 0 else []
        if removed:
            state += f"; removed its temporary folder(s) {', '.join(str(p) for p in removed)}"
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
        if os.stat(path, follow_symlinks=False).st_ino == os.fstat(held.fd).st_ino:  # still our file
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
