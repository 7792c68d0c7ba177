"""Bad input is refused when it is loaded or parsed, before any work and before any folder is written.

Through the real CLI entry point (:func:`hf_unlearn.cli.main`, in process, tiny models, the synthetic set): each
defect ends with exit status 2 and one ``hf-unlearn: error:`` line naming the problem, the method runner is never
called, and neither the output folder nor ``<output>.failed`` exists afterwards. Then the same checks where they
live: the row checks of :mod:`hf_unlearn.data.tofu` and the config checks of ``UnlearningConfig``; and where
``--data`` comes from when it is not given (``HF_UNLEARN_TOFU_DIR``, else the Hub id with a one-line offline
error).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hf_unlearn.cli import main


@pytest.fixture()
def runs(monkeypatch):
    """The method runner records its calls and trains nothing (exit status 1 when a run reaches it): a refusal
    must come before it, and a valid input must reach it."""
    import hf_unlearn.run as registry

    calls: list[dict] = []

    def recorder(inputs, options=None):
        calls.append({"method": inputs.method, "forget": list(inputs.forget), "retain": list(inputs.retain),
                      "settings": inputs.settings})
        raise RuntimeError("stand-in runner: no training in this test")

    monkeypatch.setattr(registry, "fit_or_train", recorder)
    return calls


def _refused(capsys, argv, *expected):
    code = main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2, (code, err, captured.out)
    assert "Traceback" not in captured.err + captured.out
    assert err.startswith("hf-unlearn: error: ") and "\n" not in err, err
    for fragment in expected:
        assert fragment in err, (fragment, err)
    return err


def _nothing_written(out: Path) -> None:
    assert not out.exists(), sorted(p.name for p in out.iterdir())
    failed = sorted(out.parent.glob(f"{out.name}.failed*"))
    assert not failed, [str(p) for p in failed]


def _unlearn(tiny_pair, out, method="grad_diff", *extra, data="synthetic"):
    argv = ["unlearn", "--method", method, "--model", str(tiny_pair.target), "--output", str(out), *extra]
    return argv + (["--data", data] if data is not None else [])


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------ config values (defects 7, 8)
@pytest.mark.parametrize("option, value, fragment", [
    ("--learning_rate", "-1e-3", "learning_rate=-0.001"),  # argparse read -1e-3 as an option before
    ("--learning_rate", "0", "learning_rate=0.0"),
    ("--learning_rate", "nan", "learning_rate=nan"),
    ("--learning_rate", "inf", "learning_rate=inf"),
    ("--num_train_epochs", "0", "num_train_epochs=0.0"),
    ("--num_train_epochs", "-1", "num_train_epochs=-1.0"),
    ("--max_steps", "0", "max_steps=0"),
    ("--per_device_train_batch_size", "0", "per_device_train_batch_size"),
    ("--max_length", "0", "max_length=0"),
    ("--max_length", "-5", "max_length=-5"),
])
@pytest.mark.parametrize("strategy", ["no", "steps"])
def test_bad_training_values_are_refused_before_any_folder(option, value, fragment, strategy, tiny_pair, tmp_path,
                                                          capsys, runs):
    """With save_strategy=steps a run trains in place, so a refusal inside the run used to leave the output
    folder behind with only logs/ in it."""
    out = tmp_path / "out"
    _refused(capsys, _unlearn(tiny_pair, out, "grad_diff", option, value, "--save_strategy", strategy),
             "Invalid grad_diff setting", fragment)
    _nothing_written(out)
    assert not runs


def test_negative_values_parse_for_every_method(tiny_pair, tmp_path, capsys, runs):
    """A negative number is a value, not an option, also for the MASC and T3 configs."""
    out = tmp_path / "out"
    _refused(capsys, _unlearn(tiny_pair, out, "masc", "--learning_rate", "-1e-3"), "Invalid masc setting",
             "learning_rate")
    _refused(capsys, _unlearn(tiny_pair, out, "t3", "--learning_rate", "-1e-3"), "Invalid t3 setting", "learning_rate")
    _nothing_written(out)
    assert not runs


# --------------------------------------------------------------------------------------------- rows (defect 5)
@pytest.mark.parametrize("bad, fragment", [
    ({"question": "Who wrote it?", "answer": ""}, "'answer' is empty"),
    ({"question": "Who wrote it?", "answer": "   "}, "'answer' is blank"),
    ({"question": "Who wrote it?", "answer": None}, "'answer' is null"),
    ({"question": "Who wrote it?", "answer": 1984}, "'answer' is an int (1984), not a string"),
    ({"question": None, "answer": "Someone."}, "'question' is null"),
    ({"question": "", "answer": "Someone."}, "'question' is empty"),
])
@pytest.mark.parametrize("method", ["grad_diff", "grom", "t3"])
def test_empty_null_and_non_string_rows_are_refused_with_file_and_line(bad, fragment, method, tiny_pair, tmp_path,
                                                                       capsys, runs):
    good = {"question": "Where was the author born?", "answer": "In a small town."}
    rows = _jsonl(tmp_path / "forget.jsonl", [good, "", bad])  # the blank line 2 is skipped; the bad row is line 3
    out = tmp_path / "out"
    _refused(capsys, _unlearn(tiny_pair, out, method, "--forget-file", str(rows)), f"{rows}:3: {fragment}")
    _refused(capsys, _unlearn(tiny_pair, out, method, "--retain-file", str(rows)), f"{rows}:3: {fragment}")
    _nothing_written(out)
    assert not runs


def test_bad_rows_in_a_tofu_folder_are_refused_naming_the_config_and_row(tiny_pair, synthetic, tmp_path, capsys, runs):
    data = tmp_path / "tofu"
    data.mkdir()
    for name, rows in synthetic.items():
        _jsonl(data / f"{name}.jsonl", rows)
    forget = [dict(r) for r in synthetic["forget10"]]
    forget[2]["answer"] = None
    _jsonl(data / "forget10.jsonl", forget)
    out = tmp_path / "out"
    _refused(capsys, _unlearn(tiny_pair, out, "npo", data=str(data)), "Row 2 of TOFU config 'forget10'",
             "'answer' is null")
    _nothing_written(out)
    assert not runs


# ----------------------------------------------------------------------------- checks needing the model (defect 8)
def test_forget_retain_overlap_is_refused_unless_allowed(tiny_pair, synthetic, tmp_path, capsys, runs):
    shared = _jsonl(tmp_path / "shared.jsonl", synthetic["retain90"][:3])
    out = tmp_path / "out"
    for method in ("grad_diff", "npo", "grom", "t3"):
        _refused(capsys, _unlearn(tiny_pair, out, method, "--forget-file", str(shared)),
                 "3 of the 3 forget rows also occur in the retain rows")
    _nothing_written(out)
    assert not runs
    # allow_overlap lets a trainer method through to its run (the stand-in runner then fails it: status 1)
    assert main(_unlearn(tiny_pair, out, "grad_diff", "--forget-file", str(shared), "--allow_overlap", "true")) == 1
    assert [c["method"] for c in runs] == ["grad_diff"]


@pytest.mark.parametrize("method", ["grad_diff", "masc", "grom", "t3"])
def test_a_prompt_that_fills_the_context_is_refused(method, tiny_pair, tmp_path, capsys, runs):
    """The tiny model has 256 positions; a 400-word question leaves no room for an answer token."""
    rows = _jsonl(tmp_path / "long.jsonl", [{"question": "Is it " + "very " * 400 + "long?", "answer": "Yes."}])
    out = tmp_path / "out"
    _refused(capsys, _unlearn(tiny_pair, out, method, "--forget-file", str(rows)),
             "forget row 0: its prompt alone is", "within 256 tokens (the model's 256 positions)")
    _nothing_written(out)
    assert not runs


def test_a_retain_set_whose_prompts_all_fill_the_context_is_refused(tiny_pair, tmp_path, capsys, runs):
    rows = _jsonl(tmp_path / "long.jsonl", [{"question": "Is it " + "very " * 400 + "long?", "answer": "Yes."}])
    out = tmp_path / "out"
    _refused(capsys, _unlearn(tiny_pair, out, "grad_diff", "--retain-file", str(rows)), "No retain row leaves room")
    _nothing_written(out)
    assert not runs


def test_t3_layer_and_template_and_grom_modules_are_checked_against_the_model(tiny_pair, tmp_path, capsys, runs):
    out = tmp_path / "out"
    _refused(capsys, _unlearn(tiny_pair, out, "t3", "--layer", "99"), "Invalid t3 setting", "layer=99", "2 layers")
    _refused(capsys, _unlearn(tiny_pair, out, "t3", "--prompt_template", "no-such-template"), "Invalid t3 setting",
             "no-such-template")
    # a preset that needs a chat template, with a tokenizer that has none
    _refused(capsys, _unlearn(tiny_pair, out, "t3", "--prompt_template", "chat"), "prompt_template",
             "tokenizer has none")
    _refused(capsys, _unlearn(tiny_pair, out, "grom", "--target_modules", "nope_proj"), "Invalid grom setting",
             "'nope_proj' matches no module", "down_proj")
    _nothing_written(out)
    assert not runs


def test_eval_retain_reference_with_the_wrong_row_count_is_refused_before_training(tiny_pair, synthetic, tmp_path,
                                                                                    capsys, runs):
    n = len(synthetic["forget10_perturbed"])
    reference = tmp_path / "retain_ref.json"
    reference.write_text(json.dumps({"forget_truth_ratios": [0.5] * (n - 1)}))
    out = tmp_path / "out"
    _refused(capsys, _unlearn(tiny_pair, out, "grad_diff", "--eval", "--retain-reference", str(reference)),
             f"has {n - 1} forget truth ratios", f"scores {n} forget rows")
    _nothing_written(out)
    assert not runs
    # the same count passes this check and reaches the run
    reference.write_text(json.dumps({"forget_truth_ratios": [0.5] * n}))
    assert main(_unlearn(tiny_pair, out, "grad_diff", "--eval", "--retain-reference", str(reference))) == 1
    assert [c["method"] for c in runs] == ["grad_diff"]


# ------------------------------------------------------------------------------------- model folders (defect 9)
def test_a_folder_without_weights_and_one_without_tokenizer_get_distinct_messages(tiny_pair, tmp_path, capsys, runs):
    target = Path(tiny_pair.target)
    no_weights = tmp_path / "no_weights"
    no_tokenizer = tmp_path / "no_tokenizer"
    for folder, dropped in ((no_weights, "model.safetensors"), (no_tokenizer, "tokenizer")):
        folder.mkdir()
        for f in target.iterdir():
            if f.is_file() and not f.name.startswith(dropped):
                shutil.copy(f, folder / f.name)
    out = tmp_path / "out"
    argv = ["unlearn", "--method", "grad_diff", "--data", "synthetic", "--output", str(out), "--model"]
    weights_err = _refused(capsys, [*argv, str(no_weights)], f"{no_weights} has no weights", "save_pretrained")
    tok_err = _refused(capsys, [*argv, str(no_tokenizer)], f"{no_tokenizer} has no tokenizer",
                       "tokenizer.save_pretrained")
    assert "has no tokenizer" not in weights_err and "has no weights" not in tok_err
    _refused(capsys, ["eval", "--data", "synthetic", "--model", str(no_tokenizer)], "has no tokenizer")
    _nothing_written(out)
    assert not runs


# ------------------------------------------------------------------------------------------ where --data comes from
def test_data_defaults_to_hf_unlearn_tofu_dir(tiny_pair, synthetic, tmp_path, monkeypatch, capsys, runs):
    data = tmp_path / "my_tofu"
    data.mkdir()
    for name, rows in synthetic.items():
        _jsonl(data / f"{name}.jsonl", rows)
    marked = [dict(r) for r in synthetic["forget10"]]
    marked[0]["question"] = "Which rows did the run read?"
    _jsonl(data / "forget10.jsonl", marked)
    monkeypatch.setenv("HF_UNLEARN_TOFU_DIR", str(data))
    assert main(_unlearn(tiny_pair, tmp_path / "out", "grad_diff", data=None)) == 1  # reached the stand-in runner
    assert runs[0]["forget"][0]["question"] == "Which rows did the run read?"
    assert len(runs[0]["retain"]) == len(synthetic["retain90"])
    capsys.readouterr()
    monkeypatch.setenv("HF_UNLEARN_TOFU_DIR", str(tmp_path / "missing"))
    _refused(capsys, _unlearn(tiny_pair, tmp_path / "out", "grad_diff", data=None), "HF_UNLEARN_TOFU_DIR=",
             "is not a folder")
    assert len(runs) == 1


def test_without_data_or_env_the_hub_id_is_used_and_offline_is_one_line(tiny_pair, tmp_path, monkeypatch, capsys,
                                                                         runs):
    import datasets

    asked = []

    def offline(repo_id, *args, **kwargs):
        asked.append(repo_id)
        raise ConnectionError(f"Couldn't reach '{repo_id}' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.delenv("HF_UNLEARN_TOFU_DIR", raising=False)
    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    _refused(capsys, _unlearn(tiny_pair, out, "grad_diff", data=None),
             "Could not load the TOFU data from the Hub dataset locuslab/TOFU (ConnectionError)",
             "offline, pass --data", "or set HF_UNLEARN_TOFU_DIR")
    # an explicit Hub id: the same line, without the environment variable (it would not apply)
    err = _refused(capsys, _unlearn(tiny_pair, out, "grad_diff", data="someone/tofu-copy"), "someone/tofu-copy",
                   "offline, pass --data")
    assert "HF_UNLEARN_TOFU_DIR" not in err
    assert set(asked) == {"locuslab/TOFU", "someone/tofu-copy"}
    _nothing_written(out)
    assert not runs


# -------------------------------------------------------------------------------------- the checks where they live
def test_row_checks_of_the_data_loaders(tmp_path):
    from hf_unlearn.data import check_rows, load_tofu_rows, read_qa_file
    from hf_unlearn.options import UserError
    from hf_unlearn.preconditions import load_rows

    rows = _jsonl(tmp_path / "rows.jsonl", [{"question": "q", "answer": "a"}, {"question": "q2", "answer": 7.5}])
    with pytest.raises(ValueError, match=r"rows\.jsonl:2: 'answer' is a float \(7\.5\), not a string"):
        read_qa_file(rows)
    with pytest.raises(UserError, match=r"rows\.jsonl:2"):
        load_rows("forget10", "synthetic", str(rows))
    _jsonl(tmp_path / "forget10.jsonl", [{"question": "q", "answer": "a"}, {"question": "q2", "answer": ""}])
    with pytest.raises(ValueError, match=r"Row 1 of TOFU config 'forget10' .*'answer' is empty"):
        load_tofu_rows("forget10", str(tmp_path))
    perturbed = {"question": "q", "answer": "a", "paraphrased_answer": "p", "perturbed_answer": ["x", None]}
    with pytest.raises(ValueError, match=r"perturbed_answer\[1\] is null"):
        check_rows([perturbed], "here", ("question", "answer", "paraphrased_answer", "perturbed_answer"))
    with pytest.raises(ValueError, match="not a non-empty list"):
        check_rows([dict(perturbed, perturbed_answer="x")], "here")
    with pytest.raises(ValueError, match="Row 0 of here: the row is a list, not a JSON object"):
        check_rows([["q", "a"]], "here")
    check_rows([dict(perturbed, perturbed_answer=["x", "y"])], "here")  # a good row passes


def test_real_and_synthetic_tofu_rows_pass_the_row_checks(tofu_dir):
    from hf_unlearn.data import TOFU_CONFIGS, load_tofu_rows

    for config in ("forget10", "retain90", "forget10_perturbed", "retain_perturbed", "real_authors_perturbed",
                   "world_facts_perturbed"):
        assert load_tofu_rows(config, str(tofu_dir))
    for config in TOFU_CONFIGS:
        assert load_tofu_rows(config, "synthetic")


@pytest.mark.parametrize("bad, fragment", [
    ({"learning_rate": -1e-3}, "learning_rate"), ({"learning_rate": float("nan")}, "learning_rate"),
    ({"learning_rate": float("inf")}, "learning_rate"), ({"num_train_epochs": -1}, "num_train_epochs"),
    ({"num_train_epochs": float("inf")}, "num_train_epochs"), ({"max_steps": -2}, "max_steps"),
    ({"per_device_train_batch_size": 0}, "per_device_train_batch_size"),
    ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps"),
    ({"max_length": 1}, "max_length"), ({"forget_weight": float("inf")}, "forget_weight"), ({"beta": float("inf")}, "beta"),
])
def test_unlearning_config_refuses_values_when_built(bad, fragment, tmp_path):
    from hf_unlearn.methods.atwu import ATWUConfig
    from hf_unlearn.methods.baselines import GradDiffConfig, NPOConfig
    from hf_unlearn.methods.masc import MASCConfig

    classes = (GradDiffConfig, NPOConfig) if fragment in ("forget_weight", "beta") else (GradDiffConfig, MASCConfig, ATWUConfig)
    for cls in classes:
        with pytest.raises(ValueError, match=fragment):
            cls(output_dir=str(tmp_path / "out"), report_to="none", **bad)
    # max_steps > 0 makes zero epochs irrelevant, as in transformers
    assert GradDiffConfig(output_dir=str(tmp_path / "out"), report_to="none", num_train_epochs=0, max_steps=3).max_steps == 3
    assert not (tmp_path / "out").exists()


def test_example_script_arguments_default_to_hf_unlearn_tofu_dir(synthetic, tmp_path, monkeypatch):
    from hf_unlearn.scripts import ScriptArguments, load_forget_retain

    for name in ("forget10", "retain90"):
        _jsonl(tmp_path / f"{name}.jsonl", synthetic[name][:3])
    monkeypatch.setenv("HF_UNLEARN_TOFU_DIR", str(tmp_path))
    args = ScriptArguments()
    assert args.dataset_name == str(tmp_path)
    forget, retain = load_forget_retain(args)
    assert forget == synthetic["forget10"][:3] and retain == synthetic["retain90"][:3]
    monkeypatch.delenv("HF_UNLEARN_TOFU_DIR")
    assert ScriptArguments().dataset_name == "locuslab/TOFU"
