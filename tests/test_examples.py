"""Every example script runs on the tiny model, writes its native artifact, and unlearns.

Each script in ``examples/scripts`` is run as ``__main__`` with its command-line arguments (short budgets),
the artifact it wrote is loaded back the way a user would load it (a model folder, a PEFT adapter, a T3
head), and the mean answer NLL of the forget rows under that artifact is compared with the untouched
model's: unlearning must raise it. ``examples/deletion_request.py`` is run end to end the same way.
"""

from __future__ import annotations

import json
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

SCRIPTS = REPO_ROOT / "examples" / "scripts"

# Short budgets for the tiny model: enough steps to move the forget NLL, no more.
RUNS = {
    "grad_diff": ["--learning_rate", "3e-4", "--num_train_epochs", "3", "--per_device_train_batch_size", "8"],
    "npo": ["--learning_rate", "1e-3", "--beta", "0.1", "--num_train_epochs", "3", "--per_device_train_batch_size", "8"],
    "masc": ["--learning_rate", "2e-3", "--per_device_train_batch_size", "4", "--margin_threshold", "1.0",
             "--stop_tolerance", "0.3", "--max_steps", "30"],
    "atwu": ["--learning_rate", "5e-4", "--num_train_epochs", "3", "--per_device_train_batch_size", "8",
             "--weight_decay", "0.0"],
    "grom": ["--target_modules", "lm_head", "--forget_weight", "10", "--suppression_margin", "30"],
    "t3": ["--rank", "8", "--layer", "1", "--steps", "100"],
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
TRAINER_FLAGS = ["--report_to", "none", "--save_strategy", "no", "--logging_steps", "1000", "--seed", "0"]


def run_script(path: Path, argv: list[str], monkeypatch) -> dict:
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
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_unlearn.logprobs import mean_answer_nll

    tokenizer = AutoTokenizer.from_pretrained(target)
    if method == "grom" or (out / "adapter_config.json").is_file():  # GROM, and MASC's default LoRA adapter
        from peft import PeftModel

        assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(target), str(out))
        return mean_answer_nll(model, tokenizer, forget_rows)
    if method == "t3":
        from hf_unlearn.methods.t3 import T3Classifier, t3_scorer

        assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
        head = T3Classifier.from_pretrained(out)
        base = AutoModelForCausalLM.from_pretrained(target)
        return mean_answer_nll(base, tokenizer, forget_rows, scorer=t3_scorer(base, head))
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(out)
    return mean_answer_nll(model, tokenizer, forget_rows)


@pytest.mark.parametrize("method", sorted(RUNS))
def test_example_script_unlearns(method, tiny_pair, tmp_path, monkeypatch, forget_rows, base_forget_nll):
    out = tmp_path / method
    argv = ["--model_name_or_path", str(tiny_pair.target), "--dataset_name", "synthetic",
            "--output_dir", str(out), *RUNS[method]]
    if method not in ("grom", "t3"):
        argv += TRAINER_FLAGS
    run_script(SCRIPTS / f"{method}.py", argv, monkeypatch)
    nll = _load_and_score(method, out, Path(tiny_pair.target), forget_rows)
    assert nll > base_forget_nll + 0.05, (method, base_forget_nll, nll)


@pytest.mark.parametrize("method", sorted(RUNS))
def test_example_docstring_commands_parse(method, monkeypatch):
    """The copy-paste commands in each script's docstring name only options its parser accepts."""
    path = SCRIPTS / f"{method}.py"
    namespace = runpy.run_path(str(path), run_name="example_under_test")
    doc = namespace["__doc__"]
    commands = re.findall(r"python examples/scripts/\S+\.py((?:.*\\\n)*.*)", doc)
    assert len(commands) >= 2, doc  # TOFU-tiny and a Hub model
    parser = namespace["make_parser"]()
    for command in commands:
        args = shlex.split(command.replace("\\\n", " "))
        _, unknown = parser.parse_known_args(args)
        assert unknown == [], (method, unknown)
    assert "tofu-tiny" in commands[0] and "locuslab/TOFU" in commands[1]




def test_deletion_request_end_to_end(tiny_pair, tmp_path, capsys, hub):
    from hf_unlearn.data import load_tofu_rows

    records = tmp_path / "delete_me.jsonl"
    to_delete = load_tofu_rows("forget10", "synthetic")
    records.write_text("".join(json.dumps({"question": r["question"], "answer": r["answer"]}) + "\n" for r in to_delete))
    out, repo = tmp_path / "request", tmp_path / "published"
    script = runpy.run_path(str(REPO_ROOT / "examples" / "deletion_request.py"), run_name="deletion_request")
    script["main"]([
        "--model", str(tiny_pair.target), "--records", str(records), "--method", "grom",
        "--retain_data", "synthetic", "--retain_model", str(tiny_pair.retain), "--output_dir", str(out),
        "--repo", str(repo), "--max_new_tokens", "24", "--target_modules", "lm_head",
        "--push_to_hub", "tester/deletion-001", "--hub_token", hub.token,
    ])
    printed = capsys.readouterr().out
    report = json.loads((out / "deletion_report.json").read_text())
    assert report["method"] == "grom" and report["num_records"] == len(to_delete)
    assert report["reference"]["kind"] == "retain model"
    # forgotten: the records' answers are less likely and less often reproduced than by the original
    assert report["after"]["forget_nll"] > report["before"]["forget_nll"] + 0.05
    assert report["after"]["forget_rouge_l"] < report["before"]["forget_rouge_l"]
    assert report["after_nf4"]["forget_rouge_l"] is not None
    # specific: the records' NLL rose far more than the retain rows' (the method's own option reached GROM)
    assert report["settings"]["target_modules"] == ["lm_head"]
    forget_rise = report["after"]["forget_nll"] - report["before"]["forget_nll"]
    assert forget_rise > 3 * (report["after"]["retain_nll"] - report["before"]["retain_nll"])
    # the published folder: the adapter, its model card and the report
    assert (repo / "adapter_model.safetensors").is_file() and (repo / "README.md").is_file()
    assert "grom" in (repo / "README.md").read_text().lower()
    assert json.loads((repo / "deletion_report.json").read_text()) == report
    assert (out / "deletion_report.md").read_text() in printed
    # and the same folder on the Hub, in one commit
    pushed = hub.files("tester/deletion-001")
    assert {"README.md", "adapter_model.safetensors", "adapter_config.json", "deletion_report.json"} <= set(pushed)
    assert pushed["README.md"] == (repo / "README.md").read_bytes()
