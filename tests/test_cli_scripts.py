"""``hf-unlearn unlearn --method X`` and ``python examples/scripts/X.py`` share one code path.

Both run :func:`hf_unlearn.run.unlearn` after the same checks, so given the same options on the tiny model they
write folders with the same files, the same configs and the same weights; and the script refuses what the
command line refuses, with the same message, before any work.
"""

from __future__ import annotations

import json
import math
import runpy
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT

from hf_unlearn.cli import main

SCRIPTS = REPO_ROOT / "examples" / "scripts"

# A short run per kind of entry point: a trainer and a closed-form edit (options as the method's config names them).
OPTIONS = {
    "grad_diff": ["--learning_rate", "3e-4", "--max_steps", "3", "--per_device_train_batch_size", "8",
                  "--logging_steps", "1"],
    "grom": ["--target_modules", "lm_head", "--forget_weight", "10", "--suppression_margin", "30"],
}


def _script(method: str, argv: list[str], monkeypatch) -> dict:
    path = SCRIPTS / f"{method}.py"
    monkeypatch.setattr(sys, "argv", [str(path), *argv])
    return runpy.run_path(str(path), run_name="__main__")


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        out.update({f"{path.name}:{k}": v for k, v in load_file(str(path)).items()})
    return out


def _assert_same_record(a, b, where: str = "") -> None:
    """Two JSON records agree, except run times (keys ``seconds`` / ``*_seconds``); numbers within 1e-6."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = {k for k in set(a) | set(b) if k != "seconds" and not k.endswith("_seconds")}
        for key in sorted(keys):
            assert key in a and key in b, f"{where}/{key} only on one side"
            _assert_same_record(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same_record(x, y, f"{where}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9), (where, a, b)
    else:
        assert a == b, (where, a, b)


def _log_records(folder: Path, method: str) -> list[dict]:
    return [json.loads(line) for line in (folder / "logs" / f"{method}.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("method", sorted(OPTIONS))
def test_script_and_cli_write_the_same_folder(method, tiny_pair, tmp_path, monkeypatch, capsys):
    by_cli, by_script = tmp_path / "cli", tmp_path / "script"
    code = main(["unlearn", "--method", method, "--model", str(tiny_pair.target), "--data", "synthetic",
                 "--output", str(by_cli), *OPTIONS[method]])
    assert code == 0, capsys.readouterr().err
    namespace = _script(method, ["--model_name_or_path", str(tiny_pair.target), "--dataset_name", "synthetic",
                                 "--output_dir", str(by_script), *OPTIONS[method]], monkeypatch)
    assert namespace["METHOD"] == method and callable(namespace["make_parser"]) and callable(namespace["main"])

    files = _files(by_cli)
    assert files == _files(by_script)
    assert f"logs/{method}.jsonl" in files and any(f.endswith(".safetensors") for f in files)
    for name in sorted(f for f in files if f.endswith(".json") and not f.startswith("logs/")):
        _assert_same_record(json.loads((by_cli / name).read_text()), json.loads((by_script / name).read_text()), name)
    cli_tensors, script_tensors = _tensors(by_cli), _tensors(by_script)
    assert cli_tensors.keys() == script_tensors.keys() and cli_tensors
    for key in cli_tensors:
        torch.testing.assert_close(script_tensors[key], cli_tensors[key], msg=key)
    # the same settings reached the method: the `trained` record of the log names exactly the options given
    trained = [r for r in _log_records(by_cli, method) if r.get("event") == "trained"]
    assert trained and trained[0]["settings"] == [r for r in _log_records(by_script, method)
                                                  if r.get("event") == "trained"][0]["settings"]
    if method == "grad_diff":  # the per-step logs of the trainer reached the file in both
        assert [r["step"] for r in _log_records(by_cli, method) if "loss" in r] == [1, 2, 3]
        assert [r["step"] for r in _log_records(by_script, method) if "loss" in r] == [1, 2, 3]


def test_script_refuses_a_bad_option_as_the_cli_does(tiny_pair, tmp_path, monkeypatch, capsys):
    from hf_unlearn.options import UserError

    argv = ["--learning_rat", "1e-4"]
    code = main(["unlearn", "--method", "npo", "--model", str(tiny_pair.target), "--data", "synthetic",
                 "--output", str(tmp_path / "cli"), *argv])
    cli_error = capsys.readouterr().err.strip()
    assert code == 2 and "Unknown option --learning_rat" in cli_error
    with pytest.raises(UserError) as raised:
        _script("npo", ["--model_name_or_path", str(tiny_pair.target), "--dataset_name", "synthetic",
                        "--output_dir", str(tmp_path / "script"), *argv], monkeypatch)
    assert cli_error == f"hf-unlearn: error: {raised.value}"
    with pytest.raises(UserError, match="learning_rate"):
        _script("npo", ["--model_name_or_path", str(tiny_pair.target), "--dataset_name", "synthetic",
                        "--output_dir", str(tmp_path / "script"), "--learning_rate", "-1"], monkeypatch)
    assert not (tmp_path / "cli").exists() and not (tmp_path / "script").exists()


def test_unlearn_nf4_check_matches_the_benchmarks_figure(tiny_pair, tmp_path, capsys):
    """``unlearn --eval --nf4-check`` measures forget ROUGE-L of the NF4 copy with the library's
    :func:`hf_unlearn.run.nf4_forget_rouge`, the figure the benchmark's NF4 column reports for the same model."""
    import re

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from unlearn_bench import runner

    from hf_unlearn.data import load_tofu_rows

    out = tmp_path / "out"
    code = main(["unlearn", "--method", "grad_diff", "--model", str(tiny_pair.target), "--data", "synthetic",
                 "--output", str(out), "--eval", "--nf4-check", "--max-new-tokens", "8", "--learning_rate", "3e-4",
                 "--max_steps", "2", "--per_device_train_batch_size", "8"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    figure = re.search(r"NF4 re-check .* forget ROUGE-L (\d\.\d{3})", printed)
    assert figure, printed
    report = json.loads((out / "tofu_report.json").read_text())
    n = report["splits"]["forget"]["num_examples"]
    rows = load_tofu_rows("forget10_perturbed", "synthetic")[:n]
    model, tokenizer = AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    expected = runner.nf4_forget_rouge(model, tokenizer, rows, {"max_new_tokens": 8})  # the bench's NF4 column
    assert figure.group(1) == f"{expected:.3f}"
