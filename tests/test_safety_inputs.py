"""Bad values and bad inputs are refused before any work: one line naming the setting, the file or the row.

Through the real CLI entry point (:func:`hf_unlearn.cli.main`, in process, the tiny model, the synthetic set)
where the case is a command-line one: exit status 2, one ``hf-unlearn: error:`` line, the method runner never
called and neither the output folder nor ``<output>.failed`` written. Then the same checks where they live: every
float field of every trainer config refused when NaN, the Python API (:func:`hf_unlearn.run.unlearn`,
:class:`~hf_unlearn.selection.SelectionCriterion`) refusing what the command line refuses, and model cards that
no field can inject text or front matter into.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
from test_input_validation import _nothing_written, _refused

from hf_unlearn.cli import main
from hf_unlearn.run import fit_or_train as real_fit_or_train  # the fixture below replaces the module's


@pytest.fixture()
def runs(monkeypatch):
    """The method runner records its calls and trains nothing (a run that reaches it ends with status 1)."""
    import hf_unlearn.run as registry

    calls: list[str] = []

    def recorder(inputs, options=None):
        calls.append(inputs.method)
        raise RuntimeError("stand-in runner: no training in this test")

    monkeypatch.setattr(registry, "fit_or_train", recorder)
    return calls



def _unlearn(model, out, method="grad_diff", *extra):
    return ["unlearn", "--method", method, "--model", str(model), "--output", str(out), "--data", "synthetic", *extra]


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _model_copy(tiny_pair, folder: Path) -> Path:
    shutil.copytree(tiny_pair.target, folder)
    return folder


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _save_weights(folder: Path, weights: dict) -> None:
    from safetensors.torch import save_file

    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})


# --------------------------------------------------------------- settings that cannot unlearn, or break the run
@pytest.mark.parametrize("method, options, fragment", [
    # settings that cannot unlearn
    ("grad_diff", ["--adam_epsilon", "inf"], "adam_epsilon=inf"),
    ("grad_diff", ["--forget_weight", "0", "--retain_weight", "0"], "nothing to optimise"),
    ("npo", ["--forget_weight", "0"], "forget_weight=0 cannot unlearn"),
    ("masc", ["--lora_alpha", "0"], "lora_alpha=0"),
    ("masc", ["--lora_alpha", "-1"], "lora_alpha=-1"),
    ("t3", ["--tilt_weight", "0"], "tilt_weight must be > 0"),
    ("t3", ["--tilt_weight", "-1"], "tilts decoding towards the forget set"),
    ("atwu", ["--forget_weight", "0"], "forget_weight=0 cannot unlearn"),
    # non-finite or out-of-range values, refused by the config before the model loads
    ("grad_diff", ["--weight_decay", "nan"], "weight_decay=nan"),
    ("grad_diff", ["--adam_epsilon", "0"], "adam_epsilon=0.0 is out of range"),
    ("grad_diff", ["--adam_beta1", "nan"], "adam_beta1=nan"),
    ("grad_diff", ["--adam_beta2", "1"], "adam_beta2=1.0 is out of range"),
    ("masc", ["--lora_r", "0"], "lora_r=0"),
    ("masc", ["--forget_weight", "inf"], "forget_weight=inf"),
    ("masc", ["--retain_weight", "inf"], "retain_weight=inf"),
    ("masc", ["--margin_beta", "inf"], "margin_beta=inf"),
    ("masc", ["--buffer_eta", "inf"], "buffer_eta=inf"),
    ("atwu", ["--budget_weight", "inf"], "budget_weight=inf"),
    ("atwu", ["--scorer_lr", "inf"], "scorer_lr=inf"),
    ("atwu", ["--saturation_beta", "inf"], "saturation_beta=inf"),
    # values that silently turn a safeguard off
    ("grad_diff", ["--max_grad_norm", "-1"], "max_grad_norm=-1.0 is out of range"),
    ("grad_diff", ["--weight_decay", "-1"], "weight_decay=-1.0 is out of range"),
    ("grad_diff", ["--save_steps", "0"], "save_steps=0"),
    ("grad_diff", ["--save_strategy", "steps", "--save_steps", "0"], "save_steps=0"),
    ("masc", ["--lora_dropout", "-1"], "lora_dropout=-1.0 is out of range"),
    ("masc", ["--lora_dropout", "1"], "lora_dropout=1.0 is out of range"),
    ("grad_diff", ["--trust_remote_code", "True"], "trust_remote_code=True is refused"),
    ("grad_diff", ["--model_init_kwargs", '{"trust_remote_code": true}'], "trust_remote_code=True is refused"),
])
def test_settings_that_cannot_unlearn_are_refused_before_the_model_loads(method, options, fragment, tiny_pair,
                                                                         tmp_path, capsys, runs, monkeypatch):
    import transformers

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the settings were checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_loading)
    out = tmp_path / "out"
    _refused(capsys, _unlearn(tiny_pair.target, out, method, *options), f"Invalid {method} setting", fragment)
    _nothing_written(out)
    assert not runs


def test_relearning_attack_options_are_refused_before_the_model_loads(capsys):
    missing = "/nonexistent/model"  # never loaded: the options are refused first
    base = ["eval", "--model", missing, "--data", "synthetic", "--attacks", "relearn"]
    _refused(capsys, [*base, "--relearn-lr", "nan"], "learning_rate must be a finite number > 0", "nan")
    _refused(capsys, [*base, "--relearn-lr", "0"], "learning_rate must be a finite number > 0")
    _refused(capsys, [*base, "--relearn-steps", "0"], "steps=0", "changes nothing")


def test_every_float_field_of_every_trainer_config_must_be_finite(tmp_path):
    """The generic check covers every float field (TrainingArguments' and each method's), not a list kept by
    hand: each one set to NaN, then to infinity, is refused when the config is built, naming the field."""
    from hf_unlearn.methods.atwu import ATWUConfig
    from hf_unlearn.methods.baselines import GradAscentConfig, GradDiffConfig, NPOConfig, SimNPOConfig
    from hf_unlearn.methods.masc import MASCConfig
    from hf_unlearn.options import option_fields

    common = {"output_dir": str(tmp_path / "out"), "report_to": "none"}
    for cls in (GradAscentConfig, GradDiffConfig, NPOConfig, SimNPOConfig, MASCConfig, ATWUConfig):
        default = cls(**common)
        floats = [f.name for f in option_fields(cls)
                  if isinstance(getattr(default, f.name), float) or "float" in str(f.type)]
        assert {"learning_rate", "weight_decay", "adam_epsilon", "max_grad_norm"} <= set(floats), cls
        for name in floats:
            for bad in (math.nan, math.inf):
                with pytest.raises(ValueError, match=name):
                    cls(**common, **{name: bad})
    assert not (tmp_path / "out").exists()


def test_range_rules():
    from hf_unlearn.methods.base.config import in_range

    assert in_range(0.0, ">= 0") and not in_range(0.0, "> 0") and not in_range(-1e-9, ">= 0")
    assert in_range(0.0, "[0, 1)") and not in_range(1.0, "[0, 1)") and in_range(1.0, "[0, 1]")
    assert not in_range(0.0, "(0, 1)") and in_range(0.5, "(0, 1)") and not in_range(math.nan, ">= 0")
    assert in_range(1.5, "> 1") and not in_range(1.0, "> 1") and in_range(-3.0, "< 0")


# ---------------------------------------------------------------------------------------------- model files
def test_weights_missing_or_unexpected_are_refused_naming_them(tiny_pair, tmp_path, capsys, runs):
    """transformers would initialise a missing weight at random (and ignore an unexpected one) and say so only
    in a log line the quiet console hides; the run would "unlearn" a model with a random layer."""
    import torch

    missing = _model_copy(tiny_pair, tmp_path / "missing")
    weights = _weights(missing)
    del weights["model.layers.0.mlp.down_proj.weight"]
    _save_weights(missing, weights)
    extra = _model_copy(tiny_pair, tmp_path / "extra")
    _save_weights(extra, {**_weights(extra), "model.layers.0.mlp.extra.weight": torch.zeros(3)})
    out = tmp_path / "out"
    _refused(capsys, _unlearn(missing, out), "1 weight(s) missing from the checkpoint",
             "model.layers.0.mlp.down_proj.weight", "initialised at random")
    _refused(capsys, _unlearn(extra, out), "1 weight(s) the model does not have", "model.layers.0.mlp.extra.weight")
    _refused(capsys, ["eval", "--data", "synthetic", "--model", str(missing)], "down_proj.weight")
    _nothing_written(out)
    assert not runs


def test_an_lm_head_tied_to_the_embeddings_is_not_missing(tiny_pair, tmp_path, capsys, runs):
    tied = _model_copy(tiny_pair, tmp_path / "tied")
    config = json.loads((tied / "config.json").read_text())
    (tied / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    weights = _weights(tied)
    del weights["lm_head.weight"]
    _save_weights(tied, weights)
    assert main(_unlearn(tied, tmp_path / "out")) == 1  # loaded: it reached the (stand-in) runner
    assert runs == ["grad_diff"]


@pytest.mark.parametrize("damage, fragment", [
    ("truncated", "not a complete safetensors file"),
    ("empty", "is empty (0 bytes)"),
    ("garbage", "not a complete safetensors file"),
    ("pickle only", "holds only pytorch_model.bin, a pickle file"),
    ("config shapes", "shape differs from the one config.json describes"),
    ("nan weights", "hold NaN or infinite values (first: model.layers.1.self_attn.q_proj.weight)"),
])
def test_damaged_model_folders_are_refused_in_one_line(damage, fragment, tiny_pair, tmp_path, capsys, runs):
    import torch

    folder = _model_copy(tiny_pair, tmp_path / "model")
    weights_file = folder / "model.safetensors"
    if damage == "truncated":
        data = weights_file.read_bytes()
        weights_file.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        weights_file.write_bytes(b"")
    elif damage == "garbage":
        weights_file.write_bytes(os.urandom(4096))
    elif damage == "pickle only":
        torch.save(_weights(folder), folder / "pytorch_model.bin")
        weights_file.unlink()
    elif damage == "config shapes":
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 2 * config["intermediate_size"]}))
    else:
        weights = _weights(folder)
        weights["model.layers.1.self_attn.q_proj.weight"][0, 0] = float("nan")
        _save_weights(folder, weights)
    out = tmp_path / "out"
    err = _refused(capsys, _unlearn(folder, out), fragment)
    if damage in ("truncated", "empty", "garbage"):
        assert str(weights_file) in err
    elif damage == "config shapes":
        assert "6 weight(s) whose shape differs" in err
        assert "model.layers.0.mlp.down_proj.weight: checkpoint (64, 176), config (64, 352)" in err
    _nothing_written(out)
    assert not runs


def test_a_local_path_that_does_not_exist_is_not_looked_up_on_the_hub(tiny_pair, tmp_path, capsys, runs, monkeypatch):
    import transformers

    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    asked = []
    real = transformers.AutoModelForCausalLM.from_pretrained

    def recording(name, *args, **kwargs):
        asked.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", recording)
    out = tmp_path / "out"
    _refused(capsys, _unlearn("models/tiny-typo", out), "Model folder models/tiny-typo does not exist",
             "models/ is a local folder")
    _refused(capsys, _unlearn("./tiny", out), "Model folder ./tiny does not exist")
    _refused(capsys, _unlearn("not a repo id", out), "does not exist, and it is not a valid Hub model id")
    (tmp_path / "a_file").write_text("x")
    _refused(capsys, _unlearn("a_file", out), "a_file is a file, not a model folder")
    assert asked == []
    # a bare name can be a Hub id: it is tried, and the message says there is no local folder of that name
    _refused(capsys, _unlearn("tiny_typo", out), "there is no local folder tiny_typo in", "as a Hub model id")
    _nothing_written(out)
    assert not runs


# -------------------------------------------------------------------------------------------- rows and paths
def test_rows_files_that_are_not_utf8_text_or_hold_a_lone_surrogate_are_named(tiny_pair, tmp_path, capsys, runs):
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(b'{"question": "Who?", "answer": "A."}\n{"question": "Qui est-ce\xe9?", "answer": "B."}\n')
    surrogate = tmp_path / "surrogate.jsonl"
    surrogate.write_text('{"question": "Who?", "answer": "A."}\n{"question": "Who \\ud800?", "answer": "B."}\n')
    out = tmp_path / "out"
    _refused(capsys, _unlearn(tiny_pair.target, out, "grad_diff", "--forget-file", str(latin1)),
             f"{latin1}:2: not UTF-8 text")
    for method in ("grad_diff", "grom", "t3"):
        _refused(capsys, _unlearn(tiny_pair.target, out, method, "--retain-file", str(surrogate)),
                 f"{surrogate}:2: 'question' holds a lone surrogate")
    _nothing_written(out)
    assert not runs


def test_paths_that_are_not_rows_files_or_folders_get_their_real_cause(tiny_pair, synthetic, tmp_path, capsys, runs):
    out = tmp_path / "out"
    folder = tmp_path / "rows"
    folder.mkdir()
    _refused(capsys, _unlearn(tiny_pair.target, out, "grad_diff", "--forget-file", str(folder)),
             f"Rows file {folder} is a folder with no documents in it")
    _refused(capsys, _unlearn(tiny_pair.target, out, "grad_diff", "--forget-file", os.devnull),
             f"Rows file {os.devnull} is not a regular file")
    _refused(capsys, _unlearn(tiny_pair.target, out, "grad_diff", "--select", "--holdout", "missing.jsonl"),
             "--holdout missing.jsonl", "missing.jsonl does not exist")
    _refused(capsys, _unlearn(tiny_pair.target, out, "grad_diff", "--select", "--holdout", "holdout99"),
             "--holdout holdout99: no such file, and not a TOFU config")
    shared = _jsonl(tmp_path / "shared.jsonl", synthetic["forget10"][:3])
    _refused(capsys, _unlearn(tiny_pair.target, out, "grad_diff", "--select", "--holdout", str(shared)),
             "shares rows with the forget set")
    _nothing_written(out)
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    _refused(capsys, _unlearn(tiny_pair.target, blocker / "sub"), f"{blocker} is a file, not a folder")
    assert blocker.is_file() and blocker.read_text() == "x"
    assert not runs


# ---------------------------------------------------------------------------------- the Python API, one path
def test_prepare_inputs_refuses_what_the_cli_refuses(tiny_target, synthetic, tmp_path, runs):
    from hf_unlearn.run import prepare_inputs

    model, tokenizer = tiny_target
    retain = synthetic["retain90"][:4]
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"Row 0 of the forget rows: 'answer' is null"):
        prepare_inputs("grad_diff", model, tokenizer, [{"question": "q", "answer": None}], retain, out)
    with pytest.raises(ValueError, match=r"Row 1 of the retain rows: 'question' is an int"):
        prepare_inputs("npo", model, tokenizer, synthetic["forget10"][:2], [retain[0], {"question": 3, "answer": "a"}], out)
    with pytest.raises(ValueError, match="also occur in the retain rows"):
        prepare_inputs("grad_diff", model, tokenizer, retain[:2], retain, out)
    with pytest.raises(ValueError, match="Invalid masc setting: lora_alpha=0"):
        prepare_inputs("masc", model, tokenizer, synthetic["forget10"][:2], retain, out, {"lora_alpha": 0})
    with pytest.raises(ValueError, match="forget row 0: its prompt alone is"):
        prepare_inputs("t3", model, tokenizer, [{"question": "Is it " + "very " * 400 + "long?", "answer": "Yes."}], retain,
                out)
    with pytest.raises(ValueError, match=r"Row 0 of the forget rows: 'answer' is null"):
        real_fit_or_train(prepare_inputs("grom", model, tokenizer, [{"question": "q", "answer": None}], retain, out))
    assert not runs and not out.exists()


def test_selection_criterion_refuses_holdout_or_validation_rows_from_the_forget_set(synthetic):
    from hf_unlearn.selection import SelectionCriterion

    forget, holdout, retain = synthetic["forget10"][:6], synthetic["holdout10"][:6], synthetic["retain90"][:6]
    with pytest.raises(ValueError, match="6 of the 6 forget rows also occur in the holdout rows"):
        SelectionCriterion(forget, forget, retain)
    with pytest.raises(ValueError, match="1 of the 6 forget rows also occur in the holdout rows"):
        SelectionCriterion(forget, [*holdout, forget[3]], retain)
    with pytest.raises(ValueError, match="also occur in the retain_validation rows"):
        SelectionCriterion(forget, holdout, [*retain, forget[0]])
    with pytest.raises(ValueError, match="'answer' is null"):
        SelectionCriterion(forget, [*holdout, {"question": "q", "answer": None}], retain)
    assert len(SelectionCriterion(forget, holdout, retain).holdout) == 6


# -------------------------------------------------------------------------------------------------- cards

def test_card_fields_cannot_inject_front_matter_or_text(hub, tiny_target, monkeypatch):
    import hf_unlearn.hub.publish as publish
    from hf_unlearn.hub import build_model_card, push_unlearned

    evil = "x\n---\nevil: yes"
    with pytest.raises(ValueError, match="base_model=.*line break"):
        build_model_card("unlearned_model", evil, "npo", forget_split="forget10")
    with pytest.raises(ValueError, match="repo_id=.*backtick"):
        build_model_card("unlearned_model", "org/base", "npo", forget_split="forget10", repo_id="me/x`y")
    pushed = []
    monkeypatch.setattr(publish, "push_folder", lambda *args, **kwargs: pushed.append(args))
    model, _ = tiny_target
    with pytest.raises(ValueError, match="base_model="):
        push_unlearned(model, "tester/evil", token=hub.token, method="npo", forget_split="forget10", base_model=evil)
    assert pushed == [] and hub.repos == {}

    # free text is kept on one line, without code-span or table breakers
    card = build_model_card("unlearned_model", "org/base", "npo", {"note": "a\n---\nevil: yes | `x`"},
                            forget_split="forget10\n---\nevil: yes", dataset="some/data\n# Heading")
    text = str(card)
    assert "evil" not in card.data.to_dict() and text.count("\n---\n") == 1  # the end of the front matter only
    assert not any(line.startswith(("evil:", "# Heading")) for line in text.splitlines())
    assert "| `note` | `a --- evil: yes \\| 'x'` |" in text and "`forget10 --- evil: yes`" in text
