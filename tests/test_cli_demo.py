"""The `hf-unlearn` CLI: the demo (every registered method on the synthetic set with its demo setting) with its
quiet console (one progress line per method and phase, then the table; per-step logs in JSON Lines files), clear
one-line errors, and `eval`."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections import Counter

import pytest
from conftest import CACHE_DIR

from hf_unlearn.cli import main
from hf_unlearn.demo import DEMO_COLUMNS, demo_methods


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
    for method in demo_methods():
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
    assert list(results["rows"]) == demo_methods()
    for method, row in results["rows"].items():
        for key in ("forget_quality", "model_utility", "forget_rouge_l", "forget_truth_ratio", "seconds"):
            assert isinstance(row[key], float) and math.isfinite(row[key]), (method, key, row[key])
        if method != "t3":  # T3 leaves the weights alone: no quantization re-check
            assert math.isfinite(row["forget_rouge_l_nf4"]), method
    assert results["rows"]["t3"]["forget_rouge_l_nf4"] is None
    assert math.isfinite(results["target"]["forget_rouge_l_nf4"])
    # the protocol: the target is distinguishable from the retain reference, which matches itself
    assert results["target"]["forget_quality"] < results["retain_reference"]["forget_quality"] == 1.0
    assert results["sanity_gate"]["passed"]
    # each method ran with its strength selection: it unlearned something (forget ROUGE-L below the target's), or the
    # criterion kept the starting model because every later checkpoint broke the retain tolerance
    for method, row in results["rows"].items():
        assert row["selection"]["candidates"] and "reason" in row["selection"], method
        if row["selection"]["chosen"] == {"step": 0}:
            assert row["forget_rouge_l"] == pytest.approx(results["target"]["forget_rouge_l"]), method
        else:
            assert row["forget_rouge_l"] < results["target"]["forget_rouge_l"], method


def test_demo_markdown_agrees_with_json(demo_output):
    _, out = demo_output
    results = json.loads((out / "demo.json").read_text())
    text = (out / "demo.md").read_text()
    lines = [line for line in text.strip().splitlines() if line.startswith("|")]
    assert "at most 40 new tokens" in text  # the demo lowers TOFU's 200 and says so under its table
    assert lines[0].count("|") == len(DEMO_COLUMNS) + 2
    rows = {re.split(r"\s*\|\s*", line.strip("| "))[0]: re.split(r"\s*\|\s*", line.strip("| "))[1:] for line in lines[2:]}
    assert set(rows) == {"target", "retain reference", *results["rows"]}
    for name, cells in rows.items():
        row = results["rows"].get(name) or results["target" if name == "target" else "retain_reference"]
        for (key, _, fmt), cell in zip(DEMO_COLUMNS, cells):
            expected = "n/a" if row.get(key) is None else format(row[key], fmt)
            assert cell == expected, (name, key)


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
