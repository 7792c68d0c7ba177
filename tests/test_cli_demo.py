"""The `hf-unlearn` CLI: the demo (every registered method on the synthetic set, a reduced
benchmark) with its quiet console (one progress line per method and phase, then the table; per-step
logs in JSON Lines files), clear one-line errors, and `eval`."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections import Counter

import pytest
from conftest import CACHE_DIR

from hf_unlearn.bench.bar import choose_setting
from hf_unlearn.bench.registry import PRESETS
from hf_unlearn.bench.report import COLUMNS
from hf_unlearn.cli import main


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """`hf-unlearn demo` as a user runs it: a fresh process, its stdout and stderr captured."""
    out = tmp_path_factory.mktemp("demo")
    proc = subprocess.run(
        [sys.executable, "-m", "hf_unlearn.cli", "demo", "--output", str(out), "--cache-dir", str(CACHE_DIR)],
        capture_output=True, text=True, timeout=3600,
    )
    return proc, out


@pytest.fixture(scope="module")
def demo_output(demo_run):
    proc, out = demo_run
    return proc.returncode, out


PROGRESS = re.compile(r"^(?P<label>\S+)\s+(?P<phase>training|evaluation|NF4 re-check)\s+\.\.\.")


def test_demo_console_is_one_line_per_method_and_phase_then_the_table(demo_run):
    proc, out = demo_run
    stdout, stderr = proc.stdout, proc.stderr
    # no Trainer log dictionaries, no Python warnings, no progress bars, no tracebacks
    for text in (stdout, stderr):
        assert "{'loss'" not in text and "'grad_norm'" not in text, text[-2000:]
        assert not re.search(r"\b\w*Warning\b", text), text[-2000:]
        assert "it/s]" not in text and "Traceback" not in text, text[-2000:]
    lines = stdout.splitlines()
    progress = [(m["label"], m["phase"], i) for i, line in enumerate(lines) if (m := PROGRESS.match(line))]
    counts = Counter((label, phase) for label, phase, _ in progress)
    assert all(n == 1 for n in counts.values()), counts
    for method in PRESETS:
        assert counts[(method, "training")] == 1 and counts[(method, "evaluation")] == 1, method
        assert counts[(method, "NF4 re-check")] == (0 if method == "t3" else 1), method
    # every progress line is closed on the same line (done with its seconds, or FAILED with the log file)
    for _, _, i in progress:
        assert re.search(r"\.\.\. (done +[\d.]+ s|FAILED: .+\(log: .+\.jsonl\))", lines[i]), lines[i]
    table = next(i for i, line in enumerate(lines) if line.startswith("| method |"))
    assert table > max(i for _, _, i in progress)
    assert all(not line.startswith("{") for line in lines)
    # the per-step logs went to <output>/logs/<method>.jsonl instead
    records = [json.loads(line) for line in (out / "logs" / "grad_diff.jsonl").read_text().splitlines()]
    assert any("loss" in r and "step" in r for r in records)


def test_demo_runs_every_method_with_complete_finite_rows(demo_output):
    status, out = demo_output
    results = json.loads((out / "demo.json").read_text())
    errors = {m: r["error"] for m, r in results["rows"].items() if r["error"]}
    assert status == 0 and not errors, errors
    assert set(results["rows"]) == set(PRESETS)
    for method, row in results["rows"].items():
        for key in ("forget_quality", "model_utility", "forget_rouge_l", "forget_truth_ratio", "seconds", "peak_rss_mb", "trainable_share"):
            assert isinstance(row[key], float) and math.isfinite(row[key]), (method, key, row[key])
        if method != "t3":  # T3 leaves the weights alone: no quantization re-check
            assert math.isfinite(row["forget_rouge_l_nf4"]), method
    assert results["rows"]["t3"]["forget_rouge_l_nf4"] is None
    # speed references measured in the same run: GROM against a plain forward pass, T3 against plain generate
    assert math.isfinite(results["rows"]["grom"]["time_vs_forward"]) and results["rows"]["grom"]["time_vs_forward"] > 0
    speed = results["rows"]["t3"]["generation_speed"]
    assert speed["tokens_per_s"] > 0 and speed["plain_tokens_per_s"] > 0
    assert results["rows"]["t3"]["generate_speed_ratio"] == pytest.approx(speed["tokens_per_s"] / speed["plain_tokens_per_s"])
    assert all(row.get("generate_speed_ratio") is None for m, row in results["rows"].items() if m != "t3")
    assert results["rows"]["grad_diff"]["time_vs_grad_diff"] == pytest.approx(1.0)
    # the protocol: the target is distinguishable from the retain reference, which matches itself
    assert results["target"]["forget_quality"] < results["retain_reference"]["forget_quality"] == 1.0
    assert results["sanity_gate"]["passed"]
    # every method unlearned something: forget ROUGE-L below the target's
    for method, row in results["rows"].items():
        assert row["forget_rouge_l"] < results["target"]["forget_rouge_l"], method
    assert (out / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_markdown_agrees_with_json(demo_output):
    _, out = demo_output
    results = json.loads((out / "demo.json").read_text())
    text = (out / "demo.md").read_text()
    lines = [line for line in text.strip().splitlines() if line.startswith("|")]
    assert "at most 40 new tokens" in text  # the demo lowers TOFU's 200 and says so under its table
    assert lines[0].count("|") == len(COLUMNS) + 2
    rows = {re.split(r"\s*\|\s*", line.strip("| "))[0]: re.split(r"\s*\|\s*", line.strip("| "))[1:] for line in lines[2:]}
    assert set(rows) == {"target", "retain reference", *results["rows"]}
    for name, cells in rows.items():
        row = results["rows"].get(name) or results["target" if name == "target" else "retain_reference"]
        for (key, _, fmt), cell in zip(COLUMNS, cells):
            expected = "n/a" if row.get(key) is None else format(row[key], fmt)
            assert cell == expected, (name, key)


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


def test_user_errors_are_one_line(capsys, tmp_path):
    assert main(["unlearn", "--method", "nope", "--model", str(tmp_path), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hf-unlearn: error: Unknown method 'nope'") and "\n" not in err
    assert main(["eval", "--model", str(tmp_path / "missing"), "--data", "synthetic"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_unlearn_and_eval_commands(tiny_pair, tmp_path, capsys):
    out = tmp_path / "grom"
    status = main([
        "unlearn", "--method", "grom", "--model", str(tiny_pair.target), "--data", "synthetic",
        "--output", str(out), "--eval", "--preset", "demo", "--forget_weight", "10",
    ])
    assert status == 0
    assert (out / "adapter_model.safetensors").is_file() and (out / "tofu_report.json").is_file()
    report = json.loads((out / "tofu_report.json").read_text())
    assert report["forget_split"] == "forget10" and report["forget_prob"] < 0.5
    ratios = tmp_path / "retain_ratios.json"
    assert main(["eval", "--model", str(tiny_pair.retain), "--data", "synthetic", "--save-truth-ratios", str(ratios),
                 "--max-new-tokens", "16"]) == 0
    assert main(["eval", "--model", str(tiny_pair.target), "--data", "synthetic", "--retain-reference", str(ratios),
                 "--max-new-tokens", "16", "--output", str(tmp_path / "target.json")]) == 0
    target = json.loads((tmp_path / "target.json").read_text())
    assert target["forget_quality"] < 1e-3
    assert "forget quality" in capsys.readouterr().out.lower()


def test_grid_run_reports_every_setting_and_quantizes_the_chosen_one(tiny_pair, tmp_path):
    from hf_unlearn.bench.report import varying_settings, write_results
    from hf_unlearn.bench.runner import run_comparison

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
