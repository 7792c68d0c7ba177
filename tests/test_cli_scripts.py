"""The example scripts ``examples/scripts/<method>.py``, built as TRL's scripts are: one per registered method.

* Each parses ``--help`` (run as ``__main__``), and the two commands of its docstring name only its options.
* Run end to end as a user runs them (a subprocess on the tiny model): a trainer with ``--use_peft``, GROM and T3
  each save a result that loads back the way a user loads it, differs from the input model where it should (an
  adapter, a head beside the unchanged base) and unlearns (the forget answers' NLL rises). The other scripts run
  in this process with short budgets, save the full weights, which differ from the input's, and unlearn too
  (``test_multiprocess.py`` runs ``grad_diff.py`` as a subprocess under ``accelerate launch``).
* Bad input is refused before any model loads: an empty forget file, a misspelt option, an out-of-range value.

Also here: ``hf-unlearn unlearn --eval --nf4-check`` measures the NF4 copy as the benchmark does.
"""

from __future__ import annotations

import json
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT

from hf_unlearn.cli import main

SCRIPTS = REPO_ROOT / "examples" / "scripts"
TRAINER_FLAGS = ["--report_to", "none", "--save_strategy", "no", "--logging_steps", "1000", "--seed", "0"]

# Short budgets for the tiny model: enough steps to move the forget NLL, no more.
SUBPROCESS_RUNS = {
    "npo": ["--use_peft", "--lora_r", "8", "--lora_target_modules", "all-linear", "--learning_rate", "1e-2",
            "--beta", "0.1", "--max_steps", "4", "--per_device_train_batch_size", "8", "--gradient_checkpointing",
            "False", *TRAINER_FLAGS],
    "grom": ["--target_modules", "lm_head", "--forget_weight", "10", "--suppression_margin", "30", "--progress", "False"],
    "t3": ["--rank", "8", "--layer", "1", "--steps", "100"],
}
IN_PROCESS_RUNS = {
    "grad_diff": ["--learning_rate", "3e-4", "--num_train_epochs", "3", "--per_device_train_batch_size", "8"],
    "npo": ["--learning_rate", "1e-3", "--beta", "0.1", "--num_train_epochs", "3", "--per_device_train_batch_size", "8"],
    "grad_ascent": ["--learning_rate", "3e-4", "--num_train_epochs", "2", "--per_device_train_batch_size", "8"],
    "simnpo": ["--learning_rate", "1e-3", "--num_train_epochs", "3", "--per_device_train_batch_size", "8"],
    "masc": ["--learning_rate", "2e-3", "--per_device_train_batch_size", "4", "--margin_threshold", "1.0",
             "--stop_tolerance", "0.3", "--max_steps", "30"],
    "atwu": ["--learning_rate", "5e-4", "--num_train_epochs", "3", "--per_device_train_batch_size", "8",
             "--weight_decay", "0.0"],
    "wga": ["--learning_rate", "5e-4", "--num_train_epochs", "3", "--per_device_train_batch_size", "8"],
    "satimp": ["--learning_rate", "2e-3", "--num_train_epochs", "3", "--per_device_train_batch_size", "8"],
    "ceu": ["--learning_rate", "2e-4", "--num_train_epochs", "3", "--per_device_train_batch_size", "8"],
    "undial": ["--learning_rate", "5e-4", "--retain_weight", "1.0", "--num_train_epochs", "3",
               "--per_device_train_batch_size", "8"],
    "idk_dpo": ["--learning_rate", "2e-3", "--num_train_epochs", "3", "--per_device_train_batch_size", "8"],
    "rmu": ["--layer", "1", "--learning_rate", "1e-3", "--num_train_epochs", "3", "--per_device_train_batch_size", "8"],
    "pdu": ["--retain_loss_eps", "0.1", "--retain_weight", "10", "--dual_warmup_epochs", "1", "--learning_rate", "1e-3",
            "--num_train_epochs", "3", "--per_device_train_batch_size", "8"],
}
NOT_TRAINED = ("grom", "t3")
REQUIRED = {"pdu": ["--retain_loss_eps", "0.1"]}  # options without a default
BESIDE = {"atwu": "atwu_weighter", "masc": "masc_stopping.json"}  # what a trainer saves beside its model


def _registered() -> tuple[str, ...]:
    from hf_unlearn.registry import method_names

    return method_names()


def _run_as_main(path: Path, argv: list[str], monkeypatch) -> dict:
    monkeypatch.setattr(sys, "argv", [str(path), *argv])
    return runpy.run_path(str(path), run_name="__main__")


@pytest.fixture(scope="module")
def forget_rows():
    from hf_unlearn.data import load_tofu_rows

    return load_tofu_rows("forget10", "synthetic")


@pytest.fixture(scope="module")
def base_forget_nll(tiny_pair, forget_rows):
    from hf_unlearn.demo import load_tiny
    from hf_unlearn.logprobs import mean_answer_nll

    model, tokenizer = load_tiny(tiny_pair.target)
    return mean_answer_nll(model, tokenizer, forget_rows)


def _load_and_score(method: str, out: Path, target: Path, forget_rows) -> float:
    """The result in ``out`` loaded as a user loads it, checked against the input model ``target``; returns the
    mean answer NLL of the forget rows under it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_unlearn.logprobs import mean_answer_nll

    tokenizer = AutoTokenizer.from_pretrained(target)
    base = AutoModelForCausalLM.from_pretrained(target)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    if method == "t3":  # a head beside the base, whose weights stay as they were
        from hf_unlearn.methods.t3 import T3Classifier, t3_scorer

        assert {"config.json", "model.safetensors"} <= {p.name for p in out.iterdir()}
        head = T3Classifier.from_pretrained(out)
        return mean_answer_nll(base, tokenizer, forget_rows, scorer=t3_scorer(base, head))
    if (out / "adapter_config.json").is_file():  # GROM, --use_peft and MASC's default: an adapter on the base
        from peft import PeftModel

        assert not (out / "model.safetensors").exists() and (out / "adapter_model.safetensors").is_file()
        model = PeftModel.from_pretrained(base, str(out)).merge_and_unload()
    else:  # the full weights, and the tokenizer beside them
        assert method not in NOT_TRAINED and (out / "model.safetensors").is_file()
        assert (out / "tokenizer.json").is_file()
        model = AutoModelForCausalLM.from_pretrained(out)
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert any(not torch.equal(after[k], before[k]) for k in before)  # the weights changed
    return mean_answer_nll(model, tokenizer, forget_rows)


# ----- (b) one script per registered method, each with --help and commands that parse ---------------------------


def test_every_registered_method_has_a_script():
    assert sorted(p.stem for p in SCRIPTS.glob("*.py")) == sorted(_registered())


@pytest.mark.parametrize("method", _registered())
def test_script_help_and_docstring_commands_parse(method, monkeypatch, capsys):
    path = SCRIPTS / f"{method}.py"
    with pytest.raises(SystemExit) as exited:
        _run_as_main(path, ["--help"], monkeypatch)
    printed = capsys.readouterr().out
    assert exited.value.code == 0
    for option in ("--model_name_or_path", "--dataset_name", "--forget_file", "--output_dir", "--dtype"):
        assert option in printed, (method, option)
    namespace = runpy.run_path(str(path), run_name="example_under_test")
    commands = re.findall(r"python examples/scripts/\S+\.py((?:.*\\\n)*.*)", namespace["__doc__"])
    assert len(commands) == 2 and "tofu-tiny" in commands[0] and "locuslab/TOFU" in commands[1], method
    parser = namespace["make_parser"]()
    for command in commands:
        _, unknown = parser.parse_known_args(shlex.split(command.replace("\\\n", " ")))
        assert unknown == [], (method, unknown)


# ----- (a) end to end -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", sorted(SUBPROCESS_RUNS))
def test_script_runs_end_to_end(method, tiny_pair, tmp_path, forget_rows, base_forget_nll):
    out = tmp_path / method
    command = [sys.executable, str(SCRIPTS / f"{method}.py"), "--model_name_or_path", str(tiny_pair.target),
               "--dataset_name", "synthetic", "--output_dir", str(out), *SUBPROCESS_RUNS[method]]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    nll = _load_and_score(method, out, Path(tiny_pair.target), forget_rows)
    assert nll > base_forget_nll + 0.05, (method, base_forget_nll, nll)


@pytest.mark.parametrize("method", sorted(IN_PROCESS_RUNS))
def test_script_unlearns(method, tiny_pair, tmp_path, monkeypatch, forget_rows, base_forget_nll):
    out = tmp_path / method
    _run_as_main(SCRIPTS / f"{method}.py", ["--model_name_or_path", str(tiny_pair.target), "--dataset_name",
                                            "synthetic", "--output_dir", str(out), *IN_PROCESS_RUNS[method],
                                            *TRAINER_FLAGS], monkeypatch)
    if method in BESIDE:
        assert (out / BESIDE[method]).exists()
    nll = _load_and_score(method, out, Path(tiny_pair.target), forget_rows)
    assert nll > base_forget_nll + 0.05, (method, base_forget_nll, nll)


# ----- (c) refused before any model loads ---------------------------------------------------------------------------


@pytest.fixture()
def no_model_load(monkeypatch):
    """Loading a model fails the test (the scripts take ``load_model_and_tokenizer`` when they run)."""
    import hf_unlearn.scripts

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(hf_unlearn.scripts, "load_model_and_tokenizer", refuse)


@pytest.mark.parametrize("method", _registered())
def test_empty_forget_file_refused_before_the_model_loads(method, tiny_pair, tmp_path, monkeypatch, no_model_load):
    from hf_unlearn.options import UserError

    empty = tmp_path / "forget.jsonl"
    empty.write_text("")
    out = tmp_path / "out"
    with pytest.raises(UserError, match="has no rows"):
        _run_as_main(SCRIPTS / f"{method}.py", ["--model_name_or_path", str(tiny_pair.target), "--dataset_name",
                                                "synthetic", "--forget_file", str(empty), "--output_dir", str(out),
                                                *REQUIRED.get(method, [])], monkeypatch)
    assert not out.exists()


@pytest.mark.parametrize("method,argv,match", [
    ("npo", ["--lerning_rate", "1e-4"], "--lerning_rate"),
    ("npo", ["--learning_rate=-1"], "learning_rate"),
    ("grom", ["--forget_weigth", "3"], "--forget_weigth"),
    ("t3", ["--rank", "0"], "rank"),
])
def test_bad_option_refused_before_the_model_loads(method, argv, match, tiny_pair, tmp_path, monkeypatch,
                                                   no_model_load):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=match):
        _run_as_main(SCRIPTS / f"{method}.py", ["--model_name_or_path", str(tiny_pair.target), "--dataset_name",
                                                "synthetic", "--output_dir", str(out), *argv], monkeypatch)
    assert not out.exists()


@pytest.mark.parametrize("method", ["npo", "masc", "grom", "t3"])
def test_non_empty_output_folder_refused_before_the_model_loads(method, tiny_pair, tmp_path, monkeypatch,
                                                                no_model_load):
    from hf_unlearn.safe_output import OutputDirError

    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("a user's file")
    with pytest.raises(OutputDirError, match="not empty|overwrite"):
        _run_as_main(SCRIPTS / f"{method}.py", ["--model_name_or_path", str(tiny_pair.target), "--dataset_name",
                                                "synthetic", "--output_dir", str(out), *REQUIRED.get(method, [])],
                     monkeypatch)
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "a user's file"


# ----- the command line's NF4 re-check ----------------------------------------------------------------------------


def test_unlearn_nf4_check_matches_the_benchmarks_figure(tiny_pair, tmp_path, capsys):
    """``unlearn --eval --nf4-check`` measures forget ROUGE-L of the NF4 copy with the library's
    :func:`hf_unlearn.run.nf4_forget_rouge`, the figure the benchmark's NF4 column reports for the same model."""
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
