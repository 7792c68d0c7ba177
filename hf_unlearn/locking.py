"""The output lock: ``<folder>.lock`` beside an output folder, a ``filelock.UnixFileLock`` held while a run writes
it, naming its holder. A dead holder's lock is taken over with a warning (its temporary folders on this host
removed); a lock file that is a link, folder, FIFO, hard link or holds anything but a lock record is refused.
Also the ``torch.distributed`` helpers a shared output folder needs."""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import shutil
import socket
import stat
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import filelock

from .write_gate import OutputDirError, OutputLockedError, gated_path

LOCK_SUFFIX = ".lock"
#: The largest lock file read: a holder record is a few hundred bytes.
_LOCK_MAX_BYTES = 4096

logger = logging.getLogger(__name__)


def lock_path(output_dir: str | os.PathLike) -> Path:
    """``<folder>.lock`` beside an output folder."""
    out = gated_path(output_dir)
    return out.parent / f"{out.name}{LOCK_SUFFIX}"


def _is_secondary_rank() -> bool:
    """A non-zero rank of a ``torch.distributed`` launch."""
    try:
        return int(os.environ.get("RANK", "0")) != 0
    except ValueError:
        return False


def _world_size() -> int:
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def _share_from_main(value: Any) -> Any:
    """Rank 0's ``value`` on every process of a launch (every process calls it at the same point)."""
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
    """Whether ``ok`` holds on every process of a launch."""
    if _world_size() == 1:
        return ok
    import torch.distributed as dist

    if not dist.is_initialized():
        return ok
    flags: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(flags, bool(ok))
    return all(flags)


def _wait_for_all_ranks() -> None:
    """A barrier across the processes of a launch."""
    if _world_size() > 1:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()


@dataclass
class _Held:
    created: list[Path]
    lock: filelock.UnixFileLock | None = None
    count: int = 1
    inode: tuple[int, int] | None = None
    previous: dict[str, Any] = field(default_factory=dict)


_HELD: dict[Path, _Held] = {}
_HELD_LOCK = threading.RLock()


def _read_record(fd: int) -> Any:
    """The JSON in the open lock file ``fd`` (``{}`` when empty, ``None`` when not JSON), read by descriptor."""
    try:
        text = os.pread(fd, _LOCK_MAX_BYTES + 1, 0).decode("utf-8")
        return json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
        return None


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "another process (its lock file is being written)"
    return (f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"
            + (f" since {holder['started']}" if holder.get("started") else "")
            + (f" ({holder['command']})" if holder.get("command") else ""))


def _folder_of(path: Path) -> Path:
    return path.parent / path.name[: -len(LOCK_SUFFIX)]


def _locked_message(path: Path, holder: dict[str, Any]) -> str:
    return (f"Output folder {_folder_of(path)} is in use by {_describe(holder)}; wait for that run to finish or "
            f"choose another output folder (lock file {path}).")


def _lock_refused(path: Path, reason: str) -> OutputDirError:
    return OutputDirError(f"Output folder {_folder_of(path)} cannot be locked: its lock file {path} {reason}.")


def _file_kind(mode: int) -> str | None:
    """What a non-regular file is, in words (``None`` for a regular file)."""
    for test, name in ((stat.S_ISREG, None), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a device"


def lock_holder(output_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The holder record of ``output_dir``'s lock when another live process holds it, else ``None``."""
    path = lock_path(output_dir)
    with _HELD_LOCK:
        if path in _HELD:
            return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:  # no lock file (or none this process could take: output_lock then says why)
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode) or filelock.lock_descriptor(fd, blocking=False):
                return None  # not a lock (output_lock refuses it), or a dead holder's file (closing releases it)
            record = _read_record(fd)
            return record if isinstance(record, dict) else {}
        finally:
            os.close(fd)


def _claim(path: Path, held: _Held, fd: int) -> None:
    """``filelock``'s ``on_acquired``: refuse a lock file that is not a lock of its own, then write our record."""
    st = os.fstat(fd)
    kind = _file_kind(st.st_mode)
    if kind is not None or st.st_nlink > 1:
        raise _lock_refused(path, f"is {kind}; remove it" if kind else "has other hard links; remove it")
    record = _read_record(fd)
    if st.st_size > _LOCK_MAX_BYTES or not isinstance(record, dict) or (record and "pid" not in record):
        raise _lock_refused(path, "holds something other than an hf-unlearn lock; move it away or choose another "
                                  "output folder")
    held.previous, held.inode = record, (st.st_dev, st.st_ino)
    holder = {"pid": os.getpid(), "host": socket.gethostname(),
              "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
              "command": " ".join(sys.argv)[:200]}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder) + "\n").encode("utf-8"), 0)


def _warn_stale(path: Path, previous: dict[str, Any]) -> None:
    """Log the take-over of a dead holder's lock, removing its temporary folders on this host (real folders
    only)."""
    try:
        pid = int(previous["pid"])
    except (TypeError, ValueError):
        pid = -1
    removed = []
    if previous.get("host") == socket.gethostname() and pid > 0:
        prefix = f".{_folder_of(path).name}.tmp-{pid}-"
        with contextlib.suppress(OSError):
            for entry in path.parent.iterdir():
                if entry.name.startswith(prefix) and stat.S_ISDIR(os.lstat(entry).st_mode):
                    shutil.rmtree(entry, ignore_errors=True)
                    removed.append(entry)
    state = "is no longer running" + (f"; removed its temporary folder(s) {', '.join(map(str, removed))}"
                                      if removed else "")
    logger.warning("Took over the stale lock %s of %s, which %s.", path, _describe(previous), state)


def _acquire(path: Path) -> _Held:
    """Take the lock file ``path`` (its missing parents created, and removed on release)."""
    created = []
    probe = path.parent
    while not os.path.lexists(probe) and probe != probe.parent:
        created.append(probe)
        probe = probe.parent
    with contextlib.suppress(FileNotFoundError):
        if (kind := _file_kind(os.lstat(path).st_mode)) is not None:
            raise _lock_refused(path, f"is {kind}; remove it (no hf-unlearn lock is one)")
    held = _Held(created)
    held.lock = filelock.UnixFileLock(path, timeout=0, thread_local=False, fallback_to_soft=False,
                                      on_acquired=lambda fd: _claim(path, held, fd))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        held.lock.acquire()
    except filelock.Timeout:
        _remove_created(created)
        if not os.path.lexists(path):  # filelock retries a file the system will not create until its timeout
            raise _lock_refused(path, "cannot be created there") from None
        raise OutputLockedError(_locked_message(path, lock_holder(_folder_of(path)) or {})) from None
    except OutputDirError:
        _remove_created(created)
        raise
    except OSError as exc:
        _remove_created(created)
        reason = "is a symbolic link" if os.path.islink(path) else f"cannot be created ({exc.strerror or exc})"
        raise _lock_refused(path, reason) from None
    if held.previous.get("pid") is not None:
        _warn_stale(path, held.previous)
    return held


def _remove_created(folders: list[Path]) -> None:
    for folder in folders:  # parents a lock created, innermost first, when nothing else was put there
        try:
            folder.rmdir()
        except OSError:
            break


@contextlib.contextmanager
def output_lock(output_dir: str | os.PathLike | None, enabled: bool | None = None) -> Iterator[Path | None]:
    """Hold the exclusive lock of ``output_dir`` for the block (re-entrant); yield the lock file's path.
    :class:`OutputLockedError` when another live process holds it. ``None`` or ``enabled=False``: nothing;
    ``enabled=None`` locks unless this is a non-zero rank."""
    if output_dir is None or enabled is False or (enabled is None and _is_secondary_rank()):
        yield None
        return
    path = lock_path(output_dir)
    with _HELD_LOCK:
        if (held := _HELD.get(path)) is not None:
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
                with contextlib.suppress(OSError):
                    st = os.lstat(path)
                    if (st.st_dev, st.st_ino) == held.inode:  # still ours: removed while held, none locks it after
                        os.unlink(path)
                held.lock.release()
                _remove_created(held.created)
