"""The benchmark harness's pieces that need no model: subject TOML files, the extra-metric rows and the tables."""

from __future__ import annotations

import json
import re

import pytest

from hf_unlearn.bench.registry import PRESETS, configs_dir, load_subject_presets
from hf_unlearn.bench.report import COLUMNS, GRID_COLUMNS, grid_markdown_table, markdown_table, print_and_save
from hf_unlearn.bench.rows import copy_extra_metrics

SUBJECT = """
[shared.trainer]
seed = 0
per_device_train_batch_size = 8

[shared.budget]
per_device_train_batch_size = 16
num_train_epochs = 4

[methods.npo]
use = ["trainer"]
settings = { beta = 0.1 }
demo = { learning_rate = 1e-3, num_train_epochs = 10 }
grid_use = ["budget"]
grid = [{ learning_rate = 3e-5 }, { learning_rate = 1e-4, beta = 0.2 }]
"""


def test_subject_settings_are_assembled_in_order(tmp_path):
    path = tmp_path / "subject.toml"
    path.write_text(SUBJECT)
    npo = load_subject_presets(path)["npo"]
    assert npo["demo"] == {"seed": 0, "per_device_train_batch_size": 8, "beta": 0.1, "learning_rate": 1e-3,
                           "num_train_epochs": 10}
    assert npo["grid"] == (
        {"seed": 0, "per_device_train_batch_size": 16, "beta": 0.1, "num_train_epochs": 4, "learning_rate": 3e-5},
        {"seed": 0, "per_device_train_batch_size": 16, "beta": 0.2, "num_train_epochs": 4, "learning_rate": 1e-4},
    )


def test_subject_file_errors_are_clear(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(SUBJECT.replace('use = ["trainer"]', 'use = ["missing"]'))
    with pytest.raises(ValueError, match="unknown shared table 'missing'"):
        load_subject_presets(bad)
    bad.write_text(SUBJECT + "\n[methods.grom]\ngrids = []\n")
    with pytest.raises(ValueError, match="unknown keys \\['grids'\\]"):
        load_subject_presets(bad)
    with pytest.raises(FileNotFoundError, match="tofu_tiny"):
        load_subject_presets("no_such_subject")


def test_registered_methods_take_the_shipped_tofu_tiny_settings():
    assert (configs_dir() / "tofu_tiny.toml").is_file()
    presets = load_subject_presets("tofu_tiny")
    assert set(presets) == set(PRESETS)
    for name, spec in PRESETS.items():
        assert spec.demo == presets[name]["demo"] and spec.grid == presets[name]["grid"], name


def _row(method: str, **values) -> dict:
    base = {"method": method, "settings": {}, "error": None, "forget_quality": 0.5, "model_utility": 0.6,
            "seconds": 1.25}
    return {**base, **values}


def test_extra_metrics_reach_the_row_json_and_grid_table():
    row = _row("atwu", settings={"learning_rate": 1e-4})
    copy_extra_metrics(row, {"token_auroc": 0.8125})
    assert row["token_auroc"] == 0.8125 and row["extra_metrics"] == ["token_auroc"]
    with pytest.raises(ValueError, match="clash"):
        copy_extra_metrics(_row("atwu"), {"seconds": 3.0})

    other = _row("npo", settings={"learning_rate": 3e-4})
    copy_extra_metrics(other, {})
    results = {
        "target": _row("target"), "retain_reference": _row("retain reference"),
        "rows": {"atwu": dict(row, chosen_index=0), "npo": dict(other, chosen_index=0)},
        "grid": {"atwu": [row, _row("atwu", settings={"learning_rate": 1e-3}, error="RuntimeError: boom")],
                 "npo": [other]},
    }
    json.dumps(results)  # the row stays JSON
    lines = grid_markdown_table(results).splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[-1] == "token auroc" and len(header) == 3 + len(GRID_COLUMNS) + 1
    cells = {line.split("|")[1].strip() + line.split("|")[2].strip(): [c.strip() for c in line.strip("|").split("|")]
             for line in lines[2:]}
    assert cells["atwulearning_rate=0.0001"][-1] == "0.812" and cells["atwulearning_rate=0.0001"][2] == "yes"
    assert cells["atwulearning_rate=0.001"][3] == "failed: RuntimeError: boom"
    assert cells["npo(single setting)"][-1] == "n/a"
    # the headline table keeps its fixed columns
    main = markdown_table(results).splitlines()
    assert main[0].count("|") == len(COLUMNS) + 2
    assert re.search(r"\| atwu \| 0.5 \| n/a \| n/a \| 0.600 \|", main[4])  # no truth ratios: no interval


def test_print_and_save_writes_the_json(tmp_path, capsys):
    out = tmp_path / "sub" / "speed.json"
    print_and_save({"ratio": 0.5}, "| table |", out)
    assert json.loads(out.read_text()) == {"ratio": 0.5}
    assert capsys.readouterr().out.startswith("| table |\n{")
