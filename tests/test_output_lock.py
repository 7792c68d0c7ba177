"""Output folders are locked while written, swaps refuse a folder that changed, and folder modes follow the umask.

Another process holding an output folder's lock is simulated by a real child process; the trainer and CLI tests use
the tiny TOFU target.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hf_unlearn.safe_output import (
    OutputDirError,
    OutputLockedError,
    atomic_directory,
    check_output_dir,
    lock_holder,
    lock_path,
    output_lock,
)

HOLDER = textwrap.dedent(
    """
    import sys
    from hf_unlearn.safe_output import output_lock

    with output_lock(sys.argv[1]):
        print("locked", flush=True)
        sys.stdin.read()  # hold the lock until the test closes stdin (or kills this process)
    """
)


class _Holder:
    """A child process holding the lock of ``folder`` until :meth:`release` or :meth:`kill`."""

    def __init__(self, folder: Path):
        env = {k: v for k, v in os.environ.items() if k != "RANK"}
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline()
        assert line.strip() == "locked", line

    @property
    def pid(self) -> int:
        return self.proc.pid

    def release(self) -> None:
        self.proc.stdin.close()
        assert self.proc.wait(timeout=30) == 0

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.proc.stdin.close()


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_a_folder_locked_by_another_process_is_refused_naming_the_holder(tmp_path):
    out = tmp_path / "out"
    holder = _Holder(out)
    try:
        info = lock_holder(out)
        assert info["pid"] == holder.pid and info["host"] == os.uname().nodename
        for attempt in (lambda: check_output_dir(out), lambda: output_lock(out).__enter__(),
                        lambda: atomic_directory(out).__enter__()):
            with pytest.raises(OutputLockedError) as err:
                attempt()
            message = str(err.value)
            assert "\n" not in message and f"pid {holder.pid}" in message and str(out) in message
            assert "in use by" in message and str(lock_path(out)) in message
        assert not out.exists()  # nothing was written
        assert isinstance(err.value, OutputDirError)  # callers that refuse OutputDirError refuse this too
    finally:
        holder.release()
    # released: the lock file is gone and the folder can be written
    assert not lock_path(out).exists() and lock_holder(out) is None
    with atomic_directory(out) as tmp:
        (tmp / "result.txt").write_text("mine")
    assert (out / "result.txt").read_text() == "mine" and not lock_path(out).exists()


def test_the_lock_of_a_killed_process_is_taken_over_with_a_message(tmp_path, caplog):
    out = tmp_path / "out"
    holder = _Holder(out)
    holder.kill()  # no chance to release: the lock file stays, naming a dead pid
    assert lock_path(out).is_file() and lock_holder(out) is None  # the kernel released its flock
    with output_lock(out):
        assert lock_holder(out) is None  # held by this process, which is not "another" holder
        assert f'"pid": {os.getpid()}' in lock_path(out).read_text()
    assert not lock_path(out).exists()
    [record] = [r for r in caplog.records if "stale lock" in r.getMessage()]
    assert record.levelname == "WARNING" and f"pid {holder.pid} " in record.getMessage()
    assert "no longer running" in record.getMessage()


def test_the_lock_is_reentrant_and_leaves_no_folder_behind(tmp_path):
    out = tmp_path / "a" / "b" / "out"
    with output_lock(out) as path:
        assert path == lock_path(out) and path.is_file()
        with output_lock(out), atomic_directory(out) as tmp:  # the same process: re-entrant
            (tmp / "x").write_text("1")
        assert path.is_file()  # still held by the outer block
    assert (out / "x").read_text() == "1" and not lock_path(out).exists()
    # a refused run leaves no parent folder it created for its lock file
    other = tmp_path / "c" / "d" / "out"
    with pytest.raises(RuntimeError), output_lock(other):
        raise RuntimeError("refused")
    assert not (tmp_path / "c").exists()
    # a secondary rank of a distributed launch neither takes nor checks the lock (rank 0 does)
    holder = _Holder(tmp_path / "ranked")
    try:
        os.environ["RANK"] = "1"
        check_output_dir(tmp_path / "ranked")
        with output_lock(tmp_path / "ranked") as path:
            assert path is None
    finally:
        os.environ.pop("RANK")
        holder.release()


def test_the_swap_refuses_a_folder_that_changed_since_the_start(tmp_path):
    out = tmp_path / "out"
    # missing at the start, filled by someone else meanwhile: left as it is, the new result kept beside it
    with pytest.raises(OutputDirError, match="changed while the result was being built") as err:
        with atomic_directory(out) as tmp:
            (tmp / "mine.txt").write_text("mine")
            out.mkdir()
            (out / "theirs.txt").write_text("theirs")
    assert _listing(out) == ["theirs.txt"]
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("out.new-")]
    assert len(kept) == 1 and str(kept[0]) in str(err.value) and (kept[0] / "mine.txt").read_text() == "mine"
    # an empty folder at the start that was filled: refused without overwrite
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(OutputDirError, match="changed while"), atomic_directory(empty) as tmp:
        (empty / "theirs.txt").write_text("theirs")
    assert _listing(empty) == ["theirs.txt"]
    # with overwrite: another folder put in place of the checked one is refused ...
    with pytest.raises(OutputDirError, match="changed while"), atomic_directory(out, overwrite=True) as tmp:
        os.rename(out, tmp_path / "moved")
        out.mkdir()
        (out / "third.txt").write_text("third")
    assert _listing(out) == ["third.txt"]
    # ... while the checked folder itself is replaced as asked, and a vanished one simply written
    with atomic_directory(out, overwrite=True) as tmp:
        (out / "more.txt").write_text("more")
        (tmp / "new.txt").write_text("new")
    assert _listing(out) == ["new.txt"]
    with atomic_directory(out, overwrite=True) as tmp:
        (tmp / "newer.txt").write_text("newer")
        os.rename(out, tmp_path / "gone")
    assert _listing(out) == ["newer.txt"]


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o027])
def test_output_folders_follow_the_umask(umask, tmp_path):
    previous = os.umask(umask)
    try:
        with atomic_directory(tmp_path / "out") as tmp:
            (tmp / "weights.bin").write_bytes(b"w")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o777 & ~umask


def test_a_trainer_run_is_refused_while_another_process_writes_its_folder(tiny_target, synthetic, tmp_path):
    from hf_unlearn.methods.baselines import GradDiffConfig, GradDiffTrainer

    model, tok = tiny_target
    forget, retain = list(synthetic["forget10"][:4]), list(synthetic["retain90"][:8])
    out = tmp_path / "out"

    def config(**overrides):
        values = dict(output_dir=str(out), report_to="none", save_strategy="steps", save_steps=1, max_steps=2,
                      gradient_checkpointing=False, disable_tqdm=True, per_device_train_batch_size=4, seed=0)
        return GradDiffConfig(**{**values, **overrides})

    # both runs were set up while the folder was empty; run A holds it now (another process)
    late = GradDiffTrainer(model, config(), train_dataset=forget, retain_dataset=retain, processing_class=tok)
    holder = _Holder(out)
    try:
        with pytest.raises(OutputLockedError, match=f"in use by pid {holder.pid}"):
            GradDiffTrainer(model, config(), train_dataset=forget, retain_dataset=retain, processing_class=tok)
        with pytest.raises(OutputLockedError, match=f"in use by pid {holder.pid}"):
            late.train()
        assert not any(out.glob("checkpoint-*"))  # no checkpoint of the refused run
        (out / "model.safetensors").write_bytes(b"run A's result")  # run A finishes and saves
    finally:
        holder.release()
    # run A left its result: the late run, set up before it, does not overwrite it
    with pytest.raises(OutputDirError, match="not empty"):
        late.train()
    assert _listing(out) == ["model.safetensors"] and (out / "model.safetensors").read_bytes() == b"run A's result"

    # a run of its own folder saves checkpoints and the model with the umask's mode, and leaves no lock file
    previous = os.umask(0o022)
    try:
        mine = GradDiffTrainer(model, config(output_dir=str(tmp_path / "mine")), train_dataset=forget,
                               retain_dataset=retain, processing_class=tok)
        mine.train()
        mine.save_model()
    finally:
        os.umask(previous)
    for folder in (tmp_path / "mine", tmp_path / "mine" / "checkpoint-2"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755, folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "out"]


def test_the_cli_refuses_an_output_in_use_in_one_line(tiny_pair, tmp_path, capsys):
    from hf_unlearn.cli import main

    out = tmp_path / "out"
    holder = _Holder(out)
    try:
        started = time.monotonic()
        status = main(["unlearn", "--method", "grad_diff", "--model", str(tiny_pair.target), "--output", str(out),
                       "--data", str(tmp_path / "no-data")])
        err = capsys.readouterr().err.strip()
    finally:
        holder.release()
    assert status == 2 and "\n" not in err and f"in use by pid {holder.pid}" in err and str(out) in err
    assert time.monotonic() - started < 30 and not out.exists()  # refused before loading anything


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_atomically_written_files_follow_the_umask(umask, tmp_path):
    """Result files (JSON, tables, plots) get the mode ``open`` gives, not ``mkstemp``'s owner-only 0o600."""
    from hf_unlearn.safe_output import atomic_write_bytes, atomic_write_json

    previous = os.umask(umask)
    try:
        atomic_write_bytes(tmp_path / "plot.png", b"png")
        atomic_write_json(tmp_path / "results.json", {"a": 1})
    finally:
        os.umask(previous)
    for name in ("plot.png", "results.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~umask, name
