"""The TOFU-small validation script: it refuses a refitted GROM path or T3 head that is not the bench's, reports the
chosen candidate against the best one by forget quality within the retain tolerance, replays T3's one-pass scores
per grid point as the per-point tilted scorer gives them, and probes a trainer at exactly the checkpoints its
selection measures."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "small_pair_validation.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("small_pair_validation", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record(changes, gaps, index):
    return {"index": index, "candidates": [{"scale": 1.0, "retain_weight": w, "ridge": 0.01, "edit_norm": float(w)}
                                           for w in range(1, len(gaps) + 1)],
            "measurements": [{"retain_change": c, "shift_gap": g} for c, g in zip(changes, gaps)]}


def test_the_chosen_point_is_compared_with_the_best_within_the_tolerance(script):
    record = _record(changes=[0.0, 0.05, 0.08, 0.3], gaps=[-2.0, -0.5, 0.4, 3.0], index=2)
    fq = [{"forget_quality": q} for q in (1e-6, 0.2, 0.02, 0.9)]  # the strongest point is outside the tolerance
    out = script.summarize(record, fq, 0.1)
    assert out["best_within_tolerance"] == 1 and out["chosen"] == 2
    assert out["log10_regret"] == pytest.approx(math.log10(0.2 / 0.02))
    assert script.summarize(_record([0.0, 0.05, 0.08, 0.3], [-2.0, -0.5, 0.4, 3.0], 1), fq, 0.1)[
        "log10_regret"] == 0.0
    assert script.summarize(record, fq, 0.1)["spearman_closeness_vs_fq"] == pytest.approx(-0.4)  # ranks (2,3,4,1) vs (1,3,2,4)


def test_a_path_other_than_the_benchs_is_refused_before_scoring(script):
    record = _record(changes=[0.0, 0.0], gaps=[0.0, 0.0], index=0)
    points = [{"scale": 1.0, "retain_weight": w, "ridge": 0.01} for w in (1.0, 2.0)]
    script.check_path(points, [1.0, 2.0], record)
    with pytest.raises(ValueError, match="Point 1 differs"):
        script.check_path(points, [1.0, 2.5], record)
    with pytest.raises(ValueError, match="has 1 points"):
        script.check_path(points[:1], [1.0], record)


def test_a_t3_head_other_than_the_benchs_is_refused(script):
    report = {"steps_run": 300, "best_epoch": 36, "heldout_accuracy": 0.93886, "train_accuracy": 1.0,
              "fit_forget_examples": 80}
    script.check_t3_fit(report, dict(report))
    with pytest.raises(ValueError, match="best_epoch"):
        script.check_t3_fit({**report, "best_epoch": 35}, report)


def test_a_rerun_record_is_compared_with_the_benchs(script):
    bench = {"index": 1, "candidates": [{"step": 0}, {"step": 8}],
             "measurements": [{"shift_gap": -2.7}, {"shift_gap": -2.3}]}
    rerun = {**bench, "measurements": [{"shift_gap": -2.7}, {"shift_gap": -2.25}]}
    out = script.gap_agreement(rerun, bench)
    assert out["same_candidates"] and out["same_choice"]
    assert out["max_abs_gap_difference"] == pytest.approx(0.05)
    other = script.gap_agreement({**rerun, "index": 0, "candidates": [{"step": 0}, {"step": 4}]}, bench)
    assert not other["same_candidates"] and other["max_abs_gap_difference"] is None and not other["same_choice"]


def test_shared_pass_scorers_replay_each_candidate_and_refuse_other_batches(script):
    calls = []

    def per_batch(ids, mask, pos, labels):
        calls.append(ids.shape)
        return torch.stack([ids.double() * k for k in (1, 2, 3)], dim=-1)

    shared = script.SharedPassScorers(per_batch)
    batches = [torch.arange(6).view(2, 3), torch.arange(4).view(1, 4)]
    for k in (0, 2, 1):
        score = shared.scorer(k)
        for ids in batches:
            torch.testing.assert_close(score(ids, None, None, ids), ids.double() * (k + 1))
    assert len(calls) == 2  # one pass: later loops replay the kept batches
    with pytest.raises(RuntimeError, match="Batch 0 differs"):
        shared.scorer(0)(batches[1], None, None, batches[1])


def test_t3_grid_scores_replayed_from_one_pass_equal_the_per_point_scorer(script, tiny_pair, synthetic):
    from hf_unlearn.demo import load_tiny
    from hf_unlearn.methods.t3 import T3ClassifierConfig, fit_t3, t3_scorer
    from hf_unlearn.methods.t3.scoring import t3_candidate_log_probs

    model, tok = load_tiny(tiny_pair.target)
    model.eval()
    tok.pad_token = tok.pad_token or tok.eos_token
    head = fit_t3(model, tok, synthetic["forget10"][:10], synthetic["retain90"][:40], T3ClassifierConfig(rank=4),
                  steps=30, holdout_fraction=0.0, progress=False)
    settings = [(1.0, 0.5), (2.5, 2.0)]
    rows = synthetic["forget10_perturbed"][:6]
    reference = [0.5] * len(rows)
    shared = script.SharedPassScorers(lambda ids, mask, pos, labels: t3_candidate_log_probs(
        model, head, ids, labels, mask, pos, settings))
    for k, (t, w) in enumerate(settings):
        replayed = script.score_forget(model, tok, rows, reference, scorer=shared.scorer(k), rows_per_author=3)
        direct = script.score_forget(model, tok, rows, reference, scorer=t3_scorer(model, head, t, w),
                                     rows_per_author=3)
        np.testing.assert_allclose(replayed["truth_ratios"], direct["truth_ratios"], rtol=2e-3)
        assert replayed["forget_prob"] == pytest.approx(direct["forget_prob"], rel=2e-3)
    assert len(shared.kept) > 0
    untilted = script.score_forget(model, tok, rows, reference, rows_per_author=3)
    assert not np.allclose(untilted["truth_ratios"], direct["truth_ratios"], rtol=1e-2)  # the tilt changed them
    # the intervals resample the two authors of 3 rows each, not the rows
    from hf_unlearn.evaluation.cluster_bootstrap import forget_quality_by_author

    by_author = forget_quality_by_author(untilted["truth_ratios"], reference, [0, 0, 0, 1, 1, 1])
    assert {k: untilted[k] for k in script.FQ_KEYS} == {k: by_author[k] for k in script.FQ_KEYS}
    with pytest.raises(ValueError, match="whole authors"):
        script.score_forget(model, tok, rows, reference)  # 6 rows are not whole authors of 20


def test_max_rows_must_be_whole_authors(script, tmp_path, capsys):
    with pytest.raises(SystemExit):
        script.main(["--method", "npo", "--cache-dir", str(tmp_path), "--bench-partial", str(tmp_path / "none.json"),
                     "--output", str(tmp_path / "out.json"), "--max-rows", "30"])
    assert "whole authors" in capsys.readouterr().err


def test_the_probe_scores_every_checkpoint_the_selection_measures(script, tiny_pair, synthetic, tmp_path):
    from hf_unlearn.demo import load_tiny
    from hf_unlearn.run import TrainOptions, fit_or_train, prepare_inputs
    from hf_unlearn.selection import SelectionCriterion

    model, tok = load_tiny(tiny_pair.target)
    modes = []

    def score(m):
        modes.append(m.training)
        return {"forget_quality": 0.5, "weight": m.lm_head.weight.detach().clone()}

    probe = script.CheckpointProbe(score, selection_steps=2)
    criterion = SelectionCriterion(synthetic["forget10"][:8], synthetic["holdout10"][:8], synthetic["retain90"][150:158])
    settings = {"max_steps": 5, "learning_rate": 3e-3, "per_device_train_batch_size": 4, "disable_tqdm": True}
    result = fit_or_train(prepare_inputs("grad_ascent", model, tok, synthetic["forget10"], synthetic["retain90"][:40], tmp_path / "out", settings), TrainOptions(criterion=criterion, selection_steps=2, callbacks=[probe]))
    record = result.info["selection"]
    steps = [c["step"] for c in record["candidates"]]
    assert steps == [0, 2, 4, 5] and sorted(probe.scores) == steps and set(probe.seconds) == set(steps)
    assert not any(modes)  # scored in eval mode
    chosen = record["chosen"]["step"]
    torch.testing.assert_close(model.lm_head.weight.detach(), probe.scores[chosen]["weight"])
    assert (probe.scores[5]["weight"] - probe.scores[0]["weight"]).abs().max() > 0  # the probe saw training move
    model.train()
    probe.on_train_end(None, SimpleNamespace(global_step=99), None, model=model)
    assert not modes[-1] and model.training and 99 in probe.scores  # the trainer's mode given back
