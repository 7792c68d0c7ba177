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


# ------------------------------------------------------------------------------------ every writer passes the gate
PACKAGE = Path(__file__).resolve().parents[1] / "hf_unlearn"
#: The gate itself: the only modules that write a path without first handing it to the gate.
GATE_MODULES = {"write_gate.py", "safe_output.py", "locking.py"}
#: Calls that write, remove or create a path: ``module.function`` ones, methods of any object, and the builtin
#: ``open`` with a writing mode.
MODULE_WRITERS = {
    "os": {"replace", "rename", "remove", "unlink", "rmdir", "mkdir", "makedirs", "link", "symlink", "open",
           "truncate"},
    "shutil": {"rmtree", "copy", "copy2", "copyfile", "copytree", "move"},
    "tempfile": {"mkdtemp", "mkstemp", "TemporaryDirectory", "NamedTemporaryFile"},
    "torch": {"save"}, "json": {"dump"},
}
METHOD_WRITERS = {"write_text", "write_bytes", "mkdir", "unlink", "rmdir", "touch", "symlink_to", "hardlink_to",
                  "save_pretrained", "to_json_file", "save_file"}
#: Calls that pass a path through the gate (the path they return, lock or build is then safe to write into).
GATE_CALLS = {"gated_path", "atomic_directory", "output_lock", "check_output_dir"}
#: Writers that need no gate of their own, each with the reason: they write only into a folder the system made
#: for them (a ``tempfile`` folder no user named), or only into the folder the Trainer hands them, which the run's
#: save or checkpoint built through the gate.
EXEMPT = {
    "demo/compare.py:run_demo_method": "a tempfile folder of its own",
    "evaluation/quantization.py:_load_bnb_copy": "a tempfile folder of its own",
    "hub/publish.py:_save_artifact": "into _upload's tempfile folder",
    "hub/publish.py:_upload": "a tempfile folder of its own",
    "hub/spaces.py:push_metric_space": "a tempfile folder of its own",
    "methods/grom/edit.py:GROMEdit.push_to_hub": "a tempfile folder of its own",
    "methods/atwu/trainer.py:ATWUTrainer._save": "the Trainer's save folder (save_model or checkpoint staging)",
    "methods/atwu/weighter.py:save_optimizer_state": "the Trainer's checkpoint staging folder",
    "methods/rmu/trainer.py:RMUTrainer._save_optimizer_and_scheduler": "the Trainer's checkpoint staging folder",
}


def _writer_name(call) -> str | None:
    import ast

    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in MODULE_WRITERS:
        return f"{func.value.id}.{func.attr}" if func.attr in MODULE_WRITERS[func.value.id] else None
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name == "open" and isinstance(func, ast.Name):
        mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
        return "open" if isinstance(mode, ast.Constant) and set(str(mode.value)) & set("wax+") else None
    return name if name in METHOD_WRITERS else None


def package_writers(root: Path = PACKAGE) -> dict[str, tuple[list[str], bool]]:
    """Every top-level function or method of the package (outside the gate and the benchmark lab) that writes:
    ``module:qualname -> (its writing calls, whether it passes a path through the gate)``."""
    import ast

    found = {}
    for py in sorted(root.rglob("*.py")):
        rel = py.relative_to(root).as_posix()
        if rel in GATE_MODULES or rel.startswith("bench/"):
            continue
        tree = ast.parse(py.read_text())
        units = [(n.name, n) for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        units += [(f"{c.name}.{n.name}", n) for c in tree.body if isinstance(c, ast.ClassDef)
                  for n in c.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for qualname, unit in units:
            calls = [n for n in ast.walk(unit) if isinstance(n, ast.Call)]
            writes = [f"{w}@{c.lineno}" for c in calls if (w := _writer_name(c))]
            gated = any((c.func.attr if isinstance(c.func, ast.Attribute) else getattr(c.func, "id", None))
                        in GATE_CALLS for c in calls)
            if writes:
                found[f"{rel}:{qualname}"] = (writes, gated)
    return found


def test_every_writer_of_the_package_passes_its_path_through_the_gate():
    writers = package_writers()
    bypassing = {name: writes for name, (writes, gated) in writers.items() if not gated and name not in EXEMPT}
    assert not bypassing, f"writers that do not pass their path through the write gate: {bypassing}"
    assert not set(EXEMPT) - set(writers), f"exempt writers that no longer write: {set(EXEMPT) - set(writers)}"
    # the scan sees the writers it must: the checkpoint staging, a trainer's extra files, the saved result
    assert {"methods/base/checkpoints.py:stage_checkpoint", "result.py:Unlearned.save_pretrained",
            "methods/rmu/trainer.py:RMUTrainer._save_optimizer_and_scheduler"} <= set(writers)


def test_the_writer_scan_flags_a_writer_that_bypasses_the_gate(tmp_path):
    (tmp_path / "mod.py").write_text(textwrap.dedent(
        """
        import json, os, shutil
        from pathlib import Path

        def report(path, obj):
            with open(path, "w") as fh:
                json.dump(obj, fh)

        def log(path):
            with open(path, mode="a") as fh:
                fh.write("x")

        def reads(path):
            with open(path) as fh:
                return fh.read()

        class Saver:
            def save(self, model, out):
                model.save_pretrained(out)

            def clean(self, out):
                shutil.rmtree(out)

        def gated(out):
            out = gated_path(out)
            Path(out).mkdir()
        """
    ))
    found = package_writers(tmp_path)
    assert {k: gated for k, (_, gated) in found.items()} == {
        "mod.py:report": False, "mod.py:log": False, "mod.py:Saver.save": False, "mod.py:Saver.clean": False,
        "mod.py:gated": True}


def test_every_test_the_safety_table_names_exists():
    import re

    tests = PACKAGE.parent / "tests"
    named, current = [], None
    for match in re.finditer(r"`(?:(test_\w+\.py)::|::)(test_\w+)`", (PACKAGE.parent / "docs" / "safety.md").read_text()):
        current = match.group(1) or current
        named.append((current, match.group(2)))
    missing = [(f, t) for f, t in named if f"def {t}(" not in (tests / f).read_text()]
    assert named and not missing, missing
