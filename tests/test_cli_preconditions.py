"""`hf-unlearn unlearn` refuses bad input before the first training step, with one line and no traceback.

Each test runs the real CLI entry point (:func:`hf_unlearn.cli.main`) with one defect and checks: a non-zero
exit status, exactly one ``hf-unlearn: error:`` line on stderr naming the problem, no traceback anywhere, and
that no training happened (the method runner is replaced by one that fails the test if it is ever called,
and the output folder stays as it was). A last pair of tests checks that ``save_strategy=steps`` checkpoints
and ``--resume`` continues from the latest checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hf_unlearn.cli import main
from hf_unlearn.options import parse_method_settings


@pytest.fixture()
def no_training(monkeypatch):
    """Any call of the method runner fails the test: the precondition must fire before training."""
    import hf_unlearn.run as registry

    calls = []

    def forbidden(inputs, options=None):
        calls.append(inputs.method)
        raise AssertionError(f"training started for {inputs.method} although a precondition failed")

    monkeypatch.setattr(registry, "fit_or_train", forbidden)
    return calls


def _refused(capsys, argv, *expected, status=2):
    code = main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == status != 0, (code, err, captured.out)
    assert "Traceback" not in captured.err + captured.out
    assert err.startswith("hf-unlearn: error: ") and "\n" not in err, err
    for fragment in expected:
        assert fragment in err, (fragment, err)
    return err


def _base(tiny_pair, out, *extra):
    return ["unlearn", "--method", "grad_diff", "--model", str(tiny_pair.target), "--data", "synthetic",
            "--output", str(out), *extra]


def test_missing_retain_reference(tiny_pair, tmp_path, capsys, no_training):
    missing = tmp_path / "nope.json"
    _refused(capsys, _base(tiny_pair, tmp_path / "out", "--eval", "--retain-reference", str(missing)),
             "Retain reference", str(missing), "does not exist")
    assert not (tmp_path / "out").exists() and not no_training


def test_unreadable_retain_reference(tiny_pair, tmp_path, capsys, no_training):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    _refused(capsys, _base(tiny_pair, tmp_path / "out", "--retain-reference", str(bad)), str(bad), "not valid JSON")
    bad.write_text(json.dumps({"forget_truth_ratios": [0.5, float("nan")]}))
    _refused(capsys, _base(tiny_pair, tmp_path / "out", "--retain-reference", str(bad)), "finite")
    assert not (tmp_path / "out").exists() and not no_training


def test_eval_needs_every_evaluation_config(tiny_pair, tmp_path, capsys, no_training):
    from hf_unlearn.data import synthetic_tofu

    data = tmp_path / "tofu"
    data.mkdir()
    for name, rows in synthetic_tofu().items():
        if name != "world_facts_perturbed":  # the evaluator needs it; training does not
            (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["unlearn", "--method", "grad_diff", "--model", str(tiny_pair.target), "--data", str(data),
            "--output", str(tmp_path / "out"), "--eval"]
    _refused(capsys, argv, "evaluation needs", "world_facts_perturbed (FileNotFoundError)")
    assert not (tmp_path / "out").exists() and not no_training


def test_invalid_repo_id(tiny_pair, tmp_path, capsys, no_training):
    _refused(capsys, _base(tiny_pair, tmp_path / "out", "--push-to-hub", "not a/valid//repo id", "--hub-token", "x"),
             "Invalid repo id")
    assert not no_training


def test_push_needs_a_token(tiny_pair, tmp_path, capsys, monkeypatch, no_training):
    import huggingface_hub

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    _refused(capsys, _base(tiny_pair, tmp_path / "out", "--push-to-hub", "someone/forgot-authors"), "needs a token")
    assert not (tmp_path / "out").exists() and not no_training


def test_output_folder_must_be_safe_and_writable(tiny_pair, tmp_path, capsys, no_training):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    _refused(capsys, _base(tiny_pair, blocker / "out"), "cannot be written")
    _refused(capsys, _base(tiny_pair, Path(tiny_pair.target) / "unlearned"), "overlaps the input")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("precious")
    _refused(capsys, _base(tiny_pair, taken), "not empty", "--overwrite")
    assert (taken / "keep.txt").read_text() == "precious" and sorted(p.name for p in taken.iterdir()) == ["keep.txt"]
    assert not no_training


def test_unknown_option_and_wrong_type(tiny_pair, tmp_path, capsys, no_training):
    err = _refused(capsys, _base(tiny_pair, tmp_path / "out", "--learning_rat", "1e-4"), "Unknown option --learning_rat")
    assert "did you mean --learning_rate" in err
    _refused(capsys, _base(tiny_pair, tmp_path / "out", "--learning_rate", "fast"), "learning_rate", "invalid float value")
    # a value of the right type that the config refuses (NPO's beta must be > 0)
    argv = _base(tiny_pair, tmp_path / "out", "--beta", "-1")
    argv[2] = "npo"
    _refused(capsys, argv, "Invalid npo setting", "beta")
    _refused(capsys, ["unlearn", "--method", "nope", "--model", "m", "--output", str(tmp_path / "o")], "Unknown method 'nope'")
    assert not (tmp_path / "out").exists() and not no_training


def test_resume_needs_a_checkpoint(tiny_pair, tmp_path, capsys, no_training):
    (tmp_path / "out").mkdir()
    _refused(capsys, _base(tiny_pair, tmp_path / "out", "--resume"), "no checkpoint-*")
    assert not no_training


def test_options_are_the_config_fields():
    from hf_unlearn.options import config_parser, method_config_class, option_fields

    for method in ("grad_diff", "masc", "atwu", "grom", "t3"):
        parser = config_parser(method)
        listed = {a.dest for a in parser._actions}
        assert {f.name for f in option_fields(method_config_class(method))} <= listed, method
        text = parser.format_help()
        for f in option_fields(method_config_class(method)):
            assert f"--{f.name}" in text, (method, f.name)
    # every given option is kept, even one equal to its default (save_strategy's default is "steps")
    settings = parse_method_settings("grad_diff", ["--save_strategy", "steps", "--learning_rate=3e-4"])
    assert settings == {"save_strategy": "steps", "learning_rate": 3e-4}
    assert parse_method_settings("masc", ["--top_k", "5"], preset={"top_k": 10, "stop_tolerance": 0.3}) == {
        "top_k": 5, "stop_tolerance": 0.3}


def test_checkpoints_then_resume(tiny_pair, tmp_path, capsys):
    out = tmp_path / "run"
    common = ["--learning_rate", "1e-4", "--per_device_train_batch_size", "8", "--save_strategy", "steps",
              "--save_steps", "2", "--logging_steps", "1"]
    assert main(_base(tiny_pair, out, *common, "--max_steps", "2", "--verbose")) == 0
    assert (out / "checkpoint-2").is_dir() and (out / "model.safetensors").is_file()
    first = [json.loads(line) for line in (out / "logs" / "grad_diff.jsonl").read_text().splitlines()]
    assert [r["step"] for r in first if "loss" in r] == [1, 2]
    # --verbose: the per-step logs are also printed, as the same JSON lines
    echoed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [r["step"] for r in echoed if "loss" in r] == [1, 2]
    assert main(_base(tiny_pair, out, *common, "--max_steps", "4", "--resume")) == 0
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    logs = [json.loads(line) for line in (out / "logs" / "grad_diff.jsonl").read_text().splitlines()]
    # the resumed run logged steps 3 and 4 only: it continued from checkpoint-2 instead of starting over
    assert [r["step"] for r in logs if "loss" in r] == [1, 2, 3, 4]
    out_text = capsys.readouterr().out
    assert "grad_diff" in out_text and "{'loss'" not in out_text and '"loss"' not in out_text  # quiet without --verbose


def test_a_failed_run_is_one_line_naming_method_phase_and_log(tiny_pair, tmp_path, capsys):
    """A run that diverges (learning rate 1e6) stops with one line: the method, the phase and the log file; the
    log keeps the traceback; the output folder is never created (the partial run is kept beside it)."""
    out = tmp_path / "diverged"
    code = main(_base(tiny_pair, out, "--learning_rate", "1e6", "--max_steps", "3", "--logging_steps", "1"))
    captured = capsys.readouterr()
    assert code == 1 and "Traceback" not in captured.out + captured.err
    failed = [line for line in captured.out.splitlines() + captured.err.splitlines() if "FAILED" in line or "failed" in line]
    assert len(failed) == 1, captured
    log = tmp_path / "diverged.failed" / "logs" / "grad_diff.jsonl"
    assert failed[0].startswith("grad_diff") and "training" in failed[0] and f"(log: {log})" in failed[0]
    events = [json.loads(line) for line in log.read_text().splitlines()]
    error = [e for e in events if e.get("event") == "error"]
    assert len(error) == 1 and error[0]["phase"].startswith("training") and "Traceback" in error[0]["traceback"]
    assert not out.exists()


def test_push_to_hub_uploads_the_artifact_with_its_card(tiny_pair, tmp_path, monkeypatch, capsys):
    """The valid counterpart of the push checks: the artifact and its model card reach the (local) Hub."""
    from hub_server import LocalHub, use_local_hub

    with LocalHub(tmp_path / "hub-server") as server:
        foreign = use_local_hub(monkeypatch, server, tmp_path / "hf-home")
        argv = ["unlearn", "--method", "grom", "--model", str(tiny_pair.target), "--data", "synthetic",
                "--output", str(tmp_path / "grom"), "--preset", "demo",
                "--push-to-hub", "tester/grom-forget10", "--hub-token", server.token]
        assert main(argv) == 0, capsys.readouterr()
        files = server.files("tester/grom-forget10")
        assert not foreign and not server.unhandled
    assert {"README.md", "adapter_config.json", "adapter_model.safetensors"} <= set(files)
    assert files["adapter_model.safetensors"] == (tmp_path / "grom" / "adapter_model.safetensors").read_bytes()
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("grom") and " push " in f" {line} " for line in lines) == 1
