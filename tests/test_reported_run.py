"""The reported run: each chosen configuration run once on a reported split, figures with intervals by author, the
paired comparison of a paper method against the best baseline, and a rerun that skips every finished method."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "reported_run.py"


@pytest.fixture(scope="module")
def reported():
    spec = importlib.util.spec_from_file_location("reported_run", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["reported_run"] = module
    spec.loader.exec_module(module)
    return module


def _evaluation(rng, shift=0.0, n_forget=20, n_retain=20):
    def split(n):
        return {"prob": list(rng.uniform(0.2, 0.9, n)), "rouge_l": list(rng.uniform(0.2, 0.9, n)),
                "truth_ratio": list(rng.uniform(0.3, 0.9, n))}
    forget = split(n_forget)
    forget["truth_ratio"] = list(np.asarray(forget["truth_ratio"]) + shift)
    return {"forget": forget, "retain": split(n_retain), "real_authors": split(5), "world_facts": split(5),
            "nll": {"forget": list(rng.uniform(0, 1, n_forget) + shift), "holdout": list(rng.uniform(0, 1, n_forget))}}


def test_figures_and_paired_comparison_from_per_row_values(reported):
    rng = np.random.default_rng(0)
    reference, target = _evaluation(rng), _evaluation(rng)
    strong, weak = _evaluation(rng, shift=0.0), _evaluation(rng, shift=2.0)
    f = reported.method_figures(strong, reference, target, rows_per_author=5, n_resamples=200)
    for name in ("forget_quality", "ks_statistic", "model_utility", "shift_gap", "utility_gap_to_reference",
                 "forget_truth_ratio_gap_to_reference"):
        assert f[f"{name}_low"] <= f[name] + 1e-12 and f[name] <= f[f"{name}_high"] + 1e-12, name
    assert reported.method_figures(reference, reference, target, 5, n_resamples=50)["utility_gap_to_reference"] == 0
    # the truth ratios pushed away from the reference's: lower forget quality, larger D
    w = reported.method_figures(weak, reference, target, 5, n_resamples=50)
    assert w["forget_quality"] < f["forget_quality"] and w["ks_statistic"] > f["ks_statistic"]
    figures = {"grad_diff": w, "npo": f, "grom": w}
    assert reported.best_baseline(figures) == "npo"
    c = reported.paired_comparison(weak, strong, reference, 5, n_resamples=200)
    assert c["forget_quality_difference"] == pytest.approx(w["forget_quality"] - f["forget_quality"])
    assert c["ks_statistic_difference_low"] > 0  # the same authors on both sides: D clearly larger
    same = reported.paired_comparison(strong, strong, reference, 5, n_resamples=50)
    assert same["model_utility_difference_low"] == same["model_utility_difference_high"] == 0


def test_the_reported_run_end_to_end_and_resumed(reported, tiny_pair, synthetic, tmp_path, monkeypatch):
    from hf_unlearn.selection import SelectionCriterion

    s = synthetic
    pair = reported.sweep.SweepPair(
        "tofu-tiny", Path(tiny_pair.target), Path(tiny_pair.retain), tmp_path, None, s["forget10"],
        s["retain90"][:40], s["holdout10"], s["retain90"][150:160], s["forget10_perturbed"],
        {"retain": s["retain_perturbed"], "real_authors": s["real_authors_perturbed"],
         "world_facts": s["world_facts_perturbed"]}, rows_per_author=10)
    pair.criteria[None] = SelectionCriterion(s["forget10"], s["holdout10"], s["retain90"][150:160])
    fast = {"max_steps": 4, "per_device_train_batch_size": 4, "disable_tqdm": True, "seed": 0}
    presets = {"grad_ascent": {"demo": fast},
               "grom": {"demo": {"target_modules": "lm_head", "forget_weight": 10.0, "suppression_margin": 30.0}}}
    monkeypatch.setattr(reported, "build_pair", lambda *a: pair)
    monkeypatch.setattr("unlearn_bench.registry.load_subject_presets", lambda subject: presets)
    chosen = tmp_path / "chosen.json"
    chosen.write_text(json.dumps({"authors": "forget10 authors 5-8", "chosen": {"grad_ascent": {"overrides": {"learning_rate": 3e-3}},
                                             "grom": {"overrides": {"ridge": 1e-2}}}}))
    out = tmp_path / "out"
    argv = ["--authors", "1-4", "--chosen", str(chosen), "--out", str(out), "--cache-dir", str(tmp_path),
            "--methods", "grad_ascent", "grom", "--selection-steps", "2", "--max-new-tokens", "4",
            "--resamples", "200"]
    result = reported.main(argv)
    figures = result["figures"]
    assert set(figures) == {"__target__", "grad_ascent", "grom"}
    assert figures["__target__"]["shift_gap"] == 0.0
    for f in figures.values():
        assert f["forget_quality_low"] <= f["forget_quality"] <= f["forget_quality_high"]
        assert f["model_utility_low"] <= f["model_utility"] <= f["model_utility_high"]
    assert result["best_baseline"] == "grad_ascent" and list(result["comparisons"]) == ["grom"]
    saved = json.loads((out / "reported.json").read_text())
    assert saved["authors"] == "forget10 authors 1-4" and "hf_unlearn" in saved["provenance"]
    assert saved["bootstrap"]["n_resamples"] == 200 and figures["grom"]["n_resamples"] == 200
    assert saved["provenance"]["command"].startswith("python benchmarks/reported_run.py --authors 1-4")
    ga = next(r for r in saved["configurations"].values() if r["method"] == "grad_ascent")
    assert ga["settings"]["learning_rate"] == 3e-3 and ga["selection"]["candidates"]
    assert len(ga["evaluation"]["retain"]["rouge_l"]) == len(s["retain_perturbed"])  # generated
    table = (out / "reported.md").read_text()
    assert "| grom | " in table and "best baseline" in table

    def refuse(*args, **kwargs):
        raise AssertionError("a finished method was run again")

    monkeypatch.setattr(reported, "run_chosen", refuse)
    monkeypatch.setattr(reported, "evaluate_model", refuse)
    again = reported.main(argv)
    assert again["comparisons"] == result["comparisons"]
    with pytest.raises(SystemExit):
        reported.main([*argv[:1], "5-8", *argv[2:]])  # never the tuning authors
    other = tmp_path / "chosen_elsewhere.json"
    other.write_text(json.dumps({**json.loads(chosen.read_text()), "authors": "forget10 authors 1-4"}))
    with pytest.raises(SystemExit):
        reported.main([*argv[:3], str(other), *argv[4:]])  # configurations not chosen on the tuning authors
