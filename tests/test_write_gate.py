"""The write gate through the command line, as a user types it: a link anywhere in an output or report path is
refused before any work, an existing report file is replaced only with ``--overwrite``, an interrupted run is named
as one with ``--resume``, and a stale lock is reported in one line without Python source.

Every case runs :func:`hf_unlearn.cli.main` in process on the tiny target and hashes the test's folder tree before
and after: a refused command changes nothing, an accepted one changes only its output.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

from hf_unlearn.cli import main
from hf_unlearn.safe_output import lock_path


def tree_digest(folder: Path, skip: tuple[Path, ...] = ()) -> dict[str, str]:
    """Every entry under ``folder`` (links as their target text, not followed) -> a digest of what it is, except
    the entries under ``skip``."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if any(path == s or s in path.parents for s in skip):
            continue
        if path.is_symlink():
            found[str(path)] = "link:" + os.readlink(path)
        elif path.is_file():
            found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[str(path)] = "folder"
    return found


def _error(capsys) -> str:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    lines = captured.err.strip().splitlines()
    assert lines and lines[-1].startswith("hf-unlearn: error: "), captured.err
    return lines[-1]


def _grom(model: Path, out: Path, *extra: str) -> list[str]:
    return ["unlearn", "--method", "grom", "--model", str(model), "--data", "synthetic", "--preset", "demo",
            "--output", str(out), *extra]


def _eval(model: Path, out: Path, *extra: str) -> list[str]:
    return ["eval", "--model", str(model), "--data", "synthetic", "--max-examples", "2", "--max-new-tokens", "4",
            "--batch-size", "2", "--output", str(out), *extra]


def test_an_output_link_to_a_folder_is_refused_and_the_folder_kept_even_with_overwrite(tiny_pair, tmp_path, capsys):
    user = tmp_path / "userdir"
    user.mkdir()
    (user / "keep.txt").write_text("precious")
    (tmp_path / "out").symlink_to(user)
    before = tree_digest(tmp_path)
    assert main(_grom(tiny_pair.target, tmp_path / "out", "--overwrite")) == 2
    err = _error(capsys)
    assert "symbolic link" in err and str(tmp_path / "out") in err
    assert tree_digest(tmp_path) == before and (user / "keep.txt").read_text() == "precious"


def test_a_dangling_output_link_is_refused_and_creates_nothing(tiny_pair, tmp_path, capsys):
    (tmp_path / "out").symlink_to(tmp_path / "elsewhere" / "adapter")
    before = tree_digest(tmp_path)
    assert main(_grom(tiny_pair.target, tmp_path / "out")) == 2
    assert "symbolic link" in _error(capsys)
    assert tree_digest(tmp_path) == before and not (tmp_path / "elsewhere").exists()


def test_an_output_below_a_linked_folder_is_refused(tiny_pair, tmp_path, capsys):
    (tmp_path / "real").mkdir()
    (tmp_path / "plink").symlink_to(tmp_path / "real")
    before = tree_digest(tmp_path)
    assert main(_grom(tiny_pair.target, tmp_path / "plink" / "adapter")) == 2
    assert "goes through the symbolic link" in _error(capsys)
    assert main(_eval(tiny_pair.target, tmp_path / "plink" / "r.json")) == 2
    err = _error(capsys)
    assert "goes through the symbolic link" in err and str(tmp_path / "plink") in err
    assert tree_digest(tmp_path) == before and not any((tmp_path / "real").iterdir())


def test_eval_replaces_an_existing_report_only_with_overwrite(tiny_pair, tmp_path, capsys):
    report = tmp_path / "r.json"
    report.write_text("the user's own file")
    os.link(report, tmp_path / "other-name.json")  # a hard link: its other name keeps its content either way
    before = tree_digest(tmp_path)
    assert main(_eval(tiny_pair.target, report)) == 2
    err = _error(capsys)
    assert "exists" in err and "--overwrite" in err
    assert tree_digest(tmp_path) == before
    assert main(_eval(tiny_pair.target, report, "--overwrite")) == 0
    capsys.readouterr()
    assert json.loads(report.read_text())["forget_split"] == "forget10"
    assert tree_digest(tmp_path, skip=(report,)) == {k: v for k, v in before.items() if k != str(report)}
    assert (tmp_path / "other-name.json").read_text() == "the user's own file"


HOLDER = textwrap.dedent(
    """
    import sys
    from hf_unlearn.safe_output import output_lock

    with output_lock(sys.argv[1]):
        print("locked", flush=True)
        sys.stdin.read()  # killed here
    """
)


def _killed_run(out: Path) -> int:
    """What a run killed with SIGKILL leaves: its checkpoints in ``out`` and its lock file naming a dead pid."""
    (out / "checkpoint-1").mkdir(parents=True)
    (out / "checkpoint-1" / "trainer_state.json").write_text("{}")
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env=env)
    assert child.stdout.readline().strip() == "locked"
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    child.stdin.close()
    child.stdout.close()
    return child.pid


def test_after_a_killed_run_the_message_names_resume_and_the_stale_lock_is_one_plain_line(
        tiny_pair, tmp_path, capsys, caplog):
    out = tmp_path / "out"
    pid = _killed_run(out)
    before = tree_digest(tmp_path, skip=(lock_path(out),))
    argv = ["unlearn", "--method", "grad_diff", "--model", str(tiny_pair.target), "--data", "synthetic",
            "--output", str(out), "--save_strategy", "steps", "--save_steps", "1"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(argv) == 2
    err = _error(capsys)
    assert "holds an interrupted run" in err and "--resume" in err and "checkpoint-1" in err
    assert tree_digest(tmp_path, skip=(lock_path(out),)) == before and not lock_path(out).exists()
    # the take-over is logged (one line, no Python source), not a warning that prints its source line
    stale = [r for r in caplog.records if "stale lock" in r.getMessage()]
    assert len(stale) == 1 and f"pid {pid} " in stale[0].getMessage() and "\n" not in stale[0].getMessage()
    assert not [w for w in caught if "stale lock" in str(w.message)]
