"""The sweep command resumes where it stopped: a rerun skips every configuration its log holds, picks one
configuration per method once all of that method's have finished, and shows the rule's pick beside the
utility-matched oracle."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "sweep.py"


@pytest.fixture()
def sweep(monkeypatch):
    spec = importlib.util.spec_from_file_location("sweep_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["sweep_under_test"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    calls = []

    def run_configuration(method, settings, pair, tokenizer, selection_steps):
        calls.append((method, settings["learning_rate"]))
        gap = {1e-5: -2.0, 3e-5: -0.5, 1e-4: 0.1, 3e-4: 1.0}[settings["learning_rate"]]
        # forget quality and utility (no generation) by learning rate: 3e-4 forgets best but loses utility
        fq, mu = {1e-5: (1e-6, 0.50), 3e-5: (1e-3, 0.47), 1e-4: (1e-2, 0.44), 3e-4: (0.5, 0.2)}[settings["learning_rate"]]
        selection = {"index": 0, "rule": {"retain_tolerance": 0.1}, "candidates": [{"step": 10}],
                     "measurements": [{"shift_gap": gap, "equivalence_pvalue": 0.5, "retain_change": 0.05}]}
        return {"method": method, "settings": settings, "selection": selection,
                "candidate_scores": [{"forget_quality": fq, "model_utility": mu}], "seconds": 1.0,
                "scoring_seconds": 0.5,
                "outcome": dataclasses.asdict(module.protocol.outcome_from_selection(0, selection))}

    monkeypatch.setattr(module, "build_pair", lambda *a: SimpleNamespace(target="t", retain="r", reference_tr=[]))
    monkeypatch.setattr(module, "score_forget", lambda *a, **k: {"truth_ratios": [1.0], "model_utility": 0.5})
    monkeypatch.setattr(module, "context_of", lambda pair, steps: {"target": "fixed"})
    monkeypatch.setattr(module, "provenance", lambda argv: {})
    monkeypatch.setattr(module, "run_configuration", run_configuration)
    monkeypatch.setattr("unlearn_bench.registry.load_subject_presets",
                        lambda subject: {m: {"demo": {"seed": 0}} for m in ("npo", "grad_diff")})
    dummy = SimpleNamespace(eval=lambda: dummy)
    monkeypatch.setattr("hf_unlearn.demo.load_tiny", lambda path: (dummy, None))
    module.calls = calls
    yield module
    sys.modules.pop("sweep_under_test", None)


def test_a_rerun_skips_finished_configurations_and_picks_without_forget_quality(sweep, tmp_path):
    argv = ["--cache-dir", str(tmp_path / "cache"), "--output", str(tmp_path / "out"), "--methods", "npo",
            "grad_diff"]
    sweep.main([*argv, "--stop-after", "3"])
    assert sweep.calls == [("npo", 1e-5), ("npo", 3e-5), ("npo", 1e-4)]
    assert json.loads((tmp_path / "out" / "chosen.json").read_text())["chosen"] == {}
    out = sweep.main([*argv, "--stop-after", "2"])
    assert sweep.calls[3:] == [("npo", 3e-4), ("grad_diff", 1e-5)]
    assert out["finished"] == 5
    chosen = json.loads((tmp_path / "out" / "chosen.json").read_text())["chosen"]
    assert list(chosen) == ["npo"] and chosen["npo"]["overrides"]["learning_rate"] == 1e-4  # smallest |gap|
    table = (tmp_path / "out" / "sweep.md").read_text()
    assert "5 of 8 configurations finished" in table and "**picked**" in table
    view = out["utility_view"]["npo"]
    # the rule's pick (1e-4: smallest |gap|) beside the oracle: the best forget quality at >= 0.45 utility is 3e-5's
    assert view["rule"]["configuration"] == 2 and view["oracle"]["configuration"] == 1
    assert view["oracle"]["forget_quality"] == 1e-3 and out["utility_view"]["grad_diff"]["rule"] is None
    assert "best forget quality at >= 90% of the target's utility (oracle)" in table
    assert (tmp_path / "out" / "utility.png").stat().st_size > 0
    final = sweep.main(argv)
    assert len(sweep.calls) == 8 and len(set(sweep.calls)) == 8
    assert final["utility_view"]["grad_diff"]["oracle"]["configuration"] == 1


def test_only_the_tuning_authors_are_swept(sweep, tmp_path):
    for authors in ("reported", "replication"):
        with pytest.raises(SystemExit):
            sweep.main(["--authors", authors, "--cache-dir", str(tmp_path), "--output", str(tmp_path / "o")])
    assert sweep.calls == []


def test_the_second_axis_reuses_stored_settings_and_refuses_a_method_without_a_weight(sweep, tmp_path, monkeypatch):
    monkeypatch.setattr("unlearn_bench.registry.load_subject_presets",
                        lambda subject: {"npo": {"demo": {"seed": 0, "beta": 0.1}}})
    argv = ["--cache-dir", str(tmp_path / "cache"), "--output", str(tmp_path / "out"), "--methods", "npo"]
    sweep.main(argv)
    assert len(sweep.calls) == 4
    out = sweep.main([*argv, "--second-axis"])
    assert len(sweep.calls) == 8  # the beta 0.1 configurations are the stored ones: only beta 0.5 ran
    assert out["finished"] == 8 and list(out["chosen"]) == ["npo"]
    table = (tmp_path / "out" / "sweep.md").read_text()
    assert "8 of 8 configurations finished" in table and "learning_rate 0.0003, beta 0.5" in table
    with pytest.raises(SystemExit):
        sweep.main([*argv, "grad_ascent", "--second-axis"])
    assert len(sweep.calls) == 8
