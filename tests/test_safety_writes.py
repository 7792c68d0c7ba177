"""hf-unlearn writes only inside the output it was given and its own temporary and lock files beside it, and never
follows a link out of them.

Through the real CLI entry point (:func:`hf_unlearn.cli.main`, in process, the tiny target copied into the test's
folder, the synthetic set), each input folder is hashed before and after: a failed run never replaces an input
named ``<out>.failed`` nor an unrelated ``<out>.failed``; a planted lock link never has its target written; a report
path inside the evaluated model is refused before the model loads. The lock refuses every lock path that is not a
regular file of its own (in one line, with bounded retries: ``/proc/x`` and a dangling link run in a child process
with a time limit), and a dead run's temporary folder is removed by the next run on the same output.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hf_unlearn.cli import main
from hf_unlearn.safe_output import (
    OutputDirError,
    atomic_directory,
    atomic_write_json,
    check_output_dir,
    lock_path,
    output_lock,
)


def folder_digest(folder: Path) -> str:
    """SHA-256 over every entry of ``folder`` (relative path, kind, bytes); links are hashed as their target text."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        if path.is_symlink():
            digest.update(b"L" + os.readlink(path).encode())
        elif path.is_file():
            digest.update(b"F" + path.read_bytes())
        else:
            digest.update(b"D")
    return digest.hexdigest()


@pytest.fixture()
def failing_runner(monkeypatch):
    """The method runner fails (as a run with a bad setting or a crash would) once the work folder exists."""
    import hf_unlearn.run as registry

    calls = []

    def runner(inputs, options=None):
        calls.append(inputs.output_dir)
        (inputs.output_dir / "partial.txt").write_text("written by the failed run")
        raise RuntimeError("stand-in runner: the run failed")

    monkeypatch.setattr(registry, "fit_or_train", runner)
    return calls


def _model_copy(tiny_pair, folder: Path) -> Path:
    shutil.copytree(tiny_pair.target, folder)
    return folder


def _unlearn(model: Path, out: Path, *extra: str) -> list[str]:
    return ["unlearn", "--method", "grad_diff", "--model", str(model), "--output", str(out), "--data", "synthetic",
            "--max_steps", "1", *extra]


def _one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "Traceback" not in captured.err + captured.out
    assert err.startswith("hf-unlearn: error: ") and "\n" not in err, err
    return err


# ------------------------------------------------------------------------------------ the failure folder
def test_an_input_model_named_out_failed_is_refused_before_any_work(tiny_pair, tmp_path, capsys, failing_runner):
    model = _model_copy(tiny_pair, tmp_path / "m.failed")
    before = folder_digest(model)
    code = main(_unlearn(model, tmp_path / "m"))
    err = _one_line_error(capsys)
    assert code == 2 and str(model) in err and "rename that input" in err
    assert folder_digest(model) == before and not failing_runner  # refused before the run started
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("interrupt", [False, True])
def test_a_failed_run_never_replaces_an_unrelated_out_failed(tiny_pair, tmp_path, capsys, monkeypatch, interrupt):
    import hf_unlearn.run as registry

    def runner(inputs, options=None):
        (inputs.output_dir / "partial.txt").write_text("written by the failed run")
        raise KeyboardInterrupt if interrupt else RuntimeError("stand-in runner: the run failed")

    monkeypatch.setattr(registry, "fit_or_train", runner)
    model = _model_copy(tiny_pair, tmp_path / "model")
    out = tmp_path / "out"
    unrelated = tmp_path / "out.failed"
    unrelated.mkdir()
    (unrelated / "notes.txt").write_text("someone else's folder")
    before = {p: folder_digest(p) for p in (model, unrelated)}
    code = main(_unlearn(model, out))
    capsys.readouterr()
    assert code == (130 if interrupt else 1)
    assert {p: folder_digest(p) for p in (model, unrelated)} == before
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("out.failed-")]
    assert len(kept) == 1 and (kept[0] / "partial.txt").read_text() == "written by the failed run"
    assert not out.exists() and not lock_path(out).exists()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_a_failed_run_keeps_its_work_in_out_failed_when_that_name_is_free(tiny_pair, tmp_path, capsys,
                                                                          failing_runner):
    model = _model_copy(tiny_pair, tmp_path / "model")
    out = tmp_path / "out"
    assert main(_unlearn(model, out)) == 1
    captured = capsys.readouterr()
    assert str(tmp_path / "out.failed" / "logs" / "grad_diff.jsonl") in captured.out + captured.err
    assert (tmp_path / "out.failed" / "partial.txt").is_file() and not out.exists()


# ------------------------------------------------------------------------------------ the lock file
def test_a_planted_lock_link_never_writes_its_target(tiny_pair, tmp_path, capsys, failing_runner):
    model = _model_copy(tiny_pair, tmp_path / "model")
    out = tmp_path / "out"
    lock_path(out).symlink_to(model / "model.safetensors")
    before = folder_digest(model)
    code = main(_unlearn(model, out))
    err = _one_line_error(capsys)
    assert code == 2 and "is a symbolic link" in err and str(lock_path(out)) in err
    assert folder_digest(model) == before and not failing_runner
    assert lock_path(out).is_symlink() and not out.exists()


def _plant(kind: str, path: Path, victim: Path) -> None:
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "hard link":
        os.link(victim, path)
    elif kind == "foreign file":
        path.write_text('{"question": "not a lock", "answer": "a rows file"}\n')
    else:
        path.symlink_to(victim)


@pytest.mark.parametrize("kind, fragment", [
    ("link", "is a symbolic link"), ("folder", "is a folder"), ("fifo", "is a FIFO"),
    ("hard link", "has other hard links"), ("foreign file", "holds something other than an hf-unlearn lock"),
])
def test_a_lock_path_that_is_not_our_regular_file_is_refused(tmp_path, kind, fragment):
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"precious weights")
    out = tmp_path / "out"
    _plant(kind, lock_path(out), victim)
    planted = lock_path(out).read_bytes() if kind == "foreign file" else None
    check_output_dir(out)  # reads no planted file by its path (a FIFO would block)
    with pytest.raises(OutputDirError) as err, output_lock(out):
        pass
    message = str(err.value)
    assert "\n" not in message and fragment in message and str(lock_path(out)) in message
    assert victim.read_bytes() == b"precious weights"
    assert os.path.lexists(lock_path(out))  # left as it was, not removed
    if planted is not None:
        assert lock_path(out).read_bytes() == planted


LOCKER = textwrap.dedent(
    """
    import sys
    from hf_unlearn.safe_output import OutputDirError, output_lock

    try:
        with output_lock(sys.argv[1]):
            pass
    except OutputDirError as err:
        print(err)
        sys.exit(2)
    """
)


def _run_child(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{args[-1]!r}: no answer in {timeout} s (a retry loop without a bound)")


def test_a_dangling_lock_link_is_refused_in_one_line_without_spinning(tmp_path):
    out = tmp_path / "out"
    lock_path(out).symlink_to(tmp_path / "missing" / "target.lock")
    done = _run_child([sys.executable, "-c", LOCKER, str(out)])
    assert done.returncode == 2, done
    line = done.stdout.strip()
    assert "\n" not in line and "is a symbolic link" in line
    assert not (tmp_path / "missing").exists()


def test_an_output_whose_lock_cannot_be_created_is_one_line(tiny_pair, tmp_path):
    done = _run_child([sys.executable, "-m", "hf_unlearn.cli", *_unlearn(Path(tiny_pair.target), Path("/proc/x"))])
    err = done.stderr.strip()
    assert done.returncode == 2, done
    assert err.startswith("hf-unlearn: error: ") and "\n" not in err and "/proc/x" in err, err
    assert "cannot be" in err and "in use" not in err, err


# ------------------------------------------------------------------------------------ a dead run's leftovers
HOLDER = textwrap.dedent(
    """
    import sys
    from hf_unlearn.safe_output import atomic_directory

    with atomic_directory(sys.argv[1]) as tmp:
        (tmp / "half.bin").write_bytes(b"half a model")
        print(tmp, flush=True)
        sys.stdin.read()  # killed here
    """
)


def test_the_next_run_removes_a_killed_runs_temporary_folder_and_lock(tmp_path, caplog):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env=env)
    tmp = Path(child.stdout.readline().strip())
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    child.stdin.close()
    child.stdout.close()
    assert tmp.is_dir() and tmp.parent == tmp_path and lock_path(out).is_file()
    # what is not that run's own stays: another pid's folder, another output's folder, a link, a user folder
    others = [tmp_path / f".out.tmp-{os.getpid()}-live", tmp_path / f".other.tmp-{child.pid}-x",
              tmp_path / "mine"]
    for folder in others:
        folder.mkdir()
        (folder / "keep.txt").write_text("keep")
    link = tmp_path / f".out.tmp-{child.pid}-link"
    link.symlink_to(tmp_path / "mine")
    with atomic_directory(out) as new:
        (new / "model.bin").write_bytes(b"whole")
    assert f"pid {child.pid} " in caplog.text and "no longer running; removed its temporary folder" in caplog.text
    assert not tmp.exists() and (out / "model.bin").read_bytes() == b"whole" and not lock_path(out).exists()
    assert all((folder / "keep.txt").read_text() == "keep" for folder in others)
    assert link.is_symlink() and (tmp_path / "mine" / "keep.txt").is_file()


# ------------------------------------------------------------------------------------ reports
def test_eval_refuses_report_paths_inside_the_model_folder(tiny_pair, tmp_path, capsys, monkeypatch):
    import hf_unlearn.cli.eval as eval_command

    loads = []

    def load_model(*args, **kwargs):
        loads.append(args)
        raise AssertionError("the model was loaded before the report path was checked")

    monkeypatch.setattr(eval_command, "load_model", load_model)
    model = _model_copy(tiny_pair, tmp_path / "model")
    (tmp_path / "into-model").symlink_to(model)
    link = tmp_path / "report-link.json"
    link.symlink_to(model / "model.safetensors")
    before = folder_digest(model)
    base = ["eval", "--model", str(model), "--data", "synthetic", "--max-examples", "2"]
    for extra, fragment in (
        (["--output", str(model / "model.safetensors")], "lies inside the input"),
        (["--save-truth-ratios", str(model / "config.json")], "lies inside the input"),
        (["--output", str(tmp_path / "into-model" / "report.json")], "goes through the symbolic link"),
        (["--output", str(link)], "goes through the symbolic link"),
        (["--output", str(tmp_path / "r.json"), "--save-truth-ratios", str(tmp_path / "r.json")], "the same file"),
    ):
        assert main(base + extra) == 2, extra
        err = _one_line_error(capsys)
        assert fragment in err, (extra, err)
    assert folder_digest(model) == before and not loads  # refused before the model loaded
    assert link.is_symlink() and not (model / "report.json").exists()


def test_evaluate_tofu_refuses_an_output_path_inside_the_model_before_any_work(tiny_pair, tmp_path, monkeypatch):
    from hf_unlearn.demo import load_tiny
    from hf_unlearn.evaluation import evaluate_tofu
    from hf_unlearn.evaluation import tofu as tofu_module

    model_dir = _model_copy(tiny_pair, tmp_path / "model")
    model, tokenizer = load_tiny(model_dir)
    loads = []
    monkeypatch.setattr(tofu_module, "load_tofu_rows", lambda *a, **k: loads.append(a))
    before = folder_digest(model_dir)
    with pytest.raises(OutputDirError, match="lies inside the input"):
        evaluate_tofu(model, tokenizer, source="synthetic", output_path=model_dir / "model.safetensors",
                      progress=False)
    assert folder_digest(model_dir) == before and not loads


def test_atomic_writes_refuse_a_link_anywhere_in_the_path(tmp_path):
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"precious")
    (tmp_path / "elsewhere").mkdir()
    link = tmp_path / "report.json"
    link.symlink_to(victim)
    (tmp_path / "plink").symlink_to(tmp_path / "elsewhere")
    for path in (link, tmp_path / "plink" / "report.json"):
        with pytest.raises(OutputDirError, match="symbolic link"):
            atomic_write_json(path, {"ok": True})
    assert victim.read_bytes() == b"precious" and link.is_symlink()
    assert not any((tmp_path / "elsewhere").iterdir())
