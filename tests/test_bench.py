"""The benchmark lab: subject TOML files, the extra-metric rows and the tables, the selection rule, and a grid run on
the tiny pair."""

from __future__ import annotations

import json
import math
import re

import pytest
from unlearn_bench.bar import choose_setting
from unlearn_bench.registry import PRESETS, configs_dir, load_subject_presets
from unlearn_bench.report import COLUMNS, GRID_COLUMNS, grid_markdown_table, markdown_table, print_and_save
from unlearn_bench.rows import copy_extra_metrics

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


def test_the_demo_runs_the_tofu_tiny_subjects_demo_settings():
    """The TOFU-tiny subject's demo settings are the library's (``hf_unlearn/demo/settings.toml``), method by method
    and in the same order."""
    from hf_unlearn.demo import demo_methods, demo_settings

    assert demo_methods() == list(PRESETS)
    assert {m: demo_settings(m) for m in PRESETS} == {m: spec.demo for m, spec in PRESETS.items()}


def test_choose_setting_keeps_utility_then_maximises_forget_quality():
    grid = [
        {"forget_quality": 0.9, "model_utility": 0.5, "error": None},  # too much utility lost
        {"forget_quality": 0.3, "model_utility": 0.95, "error": None},
        {"forget_quality": 0.6, "model_utility": 0.92, "error": None},
        {"forget_quality": None, "model_utility": None, "error": "boom"},
    ]
    assert choose_setting(grid, target_utility=1.0) == 2
    assert choose_setting(grid[:1], target_utility=1.0) == 0  # none keeps utility: best utility
    assert choose_setting(grid[3:], target_utility=1.0) is None


def test_grid_run_reports_every_setting_and_quantizes_the_chosen_one(tiny_pair, tmp_path):
    from unlearn_bench.report import varying_settings, write_results
    from unlearn_bench.runner import run_comparison

    grid = PRESETS["grom"].grid
    results = run_comparison(tiny_pair, ["grom"], grid=True, source="synthetic", forget_split="forget10",
                             eval_kwargs={"max_new_tokens": 24, "max_examples": 24}, progress=False)
    rows = results["grid"]["grom"]
    assert [r["settings"] for r in rows] == [dict(s) for s in grid]
    assert all(r["error"] is None and math.isfinite(r["forget_quality"]) for r in rows)
    chosen = results["rows"]["grom"]
    assert chosen["chosen_index"] == choose_setting(rows, results["target"]["model_utility"])
    assert chosen["settings"] == rows[chosen["chosen_index"]]["settings"]
    assert math.isfinite(chosen["forget_rouge_l_nf4"])  # the chosen row is always re-checked after NF4
    # GROM against one plain forward pass over forget + retain, measured in the same run
    assert results["plain_forward_seconds"] > 0
    assert chosen["time_vs_forward"] == pytest.approx(chosen["seconds"] / results["plain_forward_seconds"])
    paths = write_results(results, tmp_path, "grid", {"mode": "test"})
    assert "at most 24 new tokens" in paths["markdown"].read_text()  # a lowered generation length is stated
    grid_lines = paths["grid_markdown"].read_text().strip().splitlines()[2:]
    assert len(grid_lines) == len(grid) and sum("| yes |" in line for line in grid_lines) == 1
    assert [f"retain_weight={s['retain_weight']}" for s in grid] == [
        ", ".join(f"{k}={v}" for k, v in varied.items()) for varied in varying_settings(rows)]
    saved = json.loads(paths["json"].read_text())
    assert saved["grid"]["grom"][chosen["chosen_index"]]["forget_quality"] == chosen["forget_quality"]
    # every figure the evaluator defines is in the benchmark JSON, for the methods and the references alike
    from hf_unlearn.evaluation.report import METRIC_DEFINITIONS

    for row in (saved["grid"]["grom"][0], saved["target"], saved["retain_reference"]):
        assert set(METRIC_DEFINITIONS) <= set(row), sorted(set(METRIC_DEFINITIONS) - set(row))
    assert math.isfinite(saved["target"]["mia_min_k"]) and math.isfinite(saved["target"]["privleak"])


def test_every_method_gets_the_same_grid_budget():
    sizes = {name: len(spec.grid) for name, spec in PRESETS.items()}
    assert len(set(sizes.values())) == 1 and 1 <= next(iter(sizes.values())) <= 6, sizes
    # T3's grid varies its decoding knobs (temperature and/or tilt weight), nothing else
    t3 = PRESETS["t3"].grid
    assert len({(s["temperature"], s["tilt_weight"]) for s in t3}) == len(t3)
    for name, spec in PRESETS.items():  # distinct settings: no budget spent twice on the same point
        assert len({json.dumps(s, sort_keys=True) for s in spec.grid}) == len(spec.grid), name
