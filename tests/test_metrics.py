"""The three `evaluate` metric modules against independent computations (scipy, hand formulas)."""

from __future__ import annotations

import math

import evaluate
import numpy as np
import pytest
from scipy.stats import hmean, ks_2samp

import hf_unlearn


@pytest.fixture(scope="module")
def truth_ratio():
    return evaluate.load(hf_unlearn.metric_path("tofu_truth_ratio"), keep_in_memory=True)


@pytest.fixture(scope="module")
def forget_quality():
    return evaluate.load(hf_unlearn.metric_path("tofu_forget_quality"), keep_in_memory=True)


@pytest.fixture(scope="module")
def model_utility():
    return evaluate.load(hf_unlearn.metric_path("tofu_model_utility"), keep_in_memory=True)


def test_metric_paths_exist_and_unknown_name_fails():
    for name in hf_unlearn.METRIC_NAMES:
        folder = hf_unlearn.metric_path(name)
        assert (hf_unlearn._artifact_dir("evaluate_metrics") / name / "README.md").is_file()
        assert folder.endswith(name)
    with pytest.raises(ValueError, match="Unknown metric"):
        hf_unlearn.metric_path("tofu_nonsense")


def test_truth_ratio_matches_hand_formula(truth_ratio):
    rng = np.random.default_rng(0)
    true = rng.uniform(0.1, 3.0, size=25)
    # ragged lists of false losses (real TOFU has 5 perturbed answers, real authors 3)
    false = [rng.uniform(0.1, 3.0, size=rng.integers(1, 6)) for _ in range(25)]
    expected = np.array([math.exp(t - np.mean(f)) for t, f in zip(true, false)])
    out = truth_ratio.compute(true_losses=list(true), false_losses=[list(f) for f in false])
    np.testing.assert_allclose(out["truth_ratios"], expected, rtol=1e-12)
    np.testing.assert_allclose(out["truth_ratio"], np.mean(np.minimum(expected, 1 / expected)), rtol=1e-12)
    out = truth_ratio.compute(
        true_losses=list(true), false_losses=[list(f) for f in false], aggregator="true_better"
    )
    np.testing.assert_allclose(out["truth_ratio"], np.mean(np.maximum(0, 1 - expected)), rtol=1e-12)


def test_truth_ratio_worked_example(truth_ratio):
    # true loss 1, false losses 1 and 3 -> tr = exp(1 - 2) = 1/e; true_better = 1 - 1/e
    out = truth_ratio.compute(true_losses=[1.0], false_losses=[[1.0, 3.0]], aggregator="true_better")
    assert out["truth_ratios"] == pytest.approx([math.exp(-1)])
    assert out["truth_ratio"] == pytest.approx(1 - math.exp(-1))
    # a model preferring the wrong answer: tr = e; closer_to_1_better = 1/e, true_better = 0
    assert truth_ratio.compute(true_losses=[2.0], false_losses=[[1.0]])["truth_ratio"] == pytest.approx(
        math.exp(-1)
    )
    assert (
        truth_ratio.compute(true_losses=[2.0], false_losses=[[1.0]], aggregator="true_better")["truth_ratio"]
        == 0
    )


def test_truth_ratio_bad_input(truth_ratio):
    with pytest.raises(ValueError, match="aggregator"):
        truth_ratio.compute(true_losses=[1.0], false_losses=[[1.0]], aggregator="mean")
    with pytest.raises(ValueError, match="no false"):
        truth_ratio.compute(true_losses=[1.0, 1.0], false_losses=[[1.0], []])
    with pytest.raises(ValueError, match="non-finite"):
        truth_ratio.compute(true_losses=[float("nan")], false_losses=[[1.0]])


def test_forget_quality_matches_scipy(forget_quality):
    rng = np.random.default_rng(1)
    for shift, n in ((0.0, 40), (0.3, 40), (2.0, 20), (0.5, 400)):
        pred = rng.lognormal(shift, 1.0, size=n)
        ref = rng.lognormal(0.0, 1.0, size=n)
        expected = ks_2samp(pred, ref)
        out = forget_quality.compute(predictions=list(pred), references=list(ref))
        assert out["forget_quality"] == pytest.approx(expected.pvalue, rel=1e-12, abs=1e-300)
        assert out["ks_statistic"] == pytest.approx(expected.statistic, rel=1e-12)


def test_forget_quality_identical_and_separated(forget_quality):
    values = [0.2, 0.5, 0.9, 1.3, 2.0]
    out = forget_quality.compute(predictions=values, references=values)
    assert out == {"forget_quality": 1.0, "ks_statistic": 0.0}
    # fully separated samples of 20: D = 1 and the exact p-value 2 / C(40, 20)
    out = forget_quality.compute(
        predictions=[0.01 * i for i in range(20)], references=[1 + 0.01 * i for i in range(20)]
    )
    assert out["ks_statistic"] == 1.0
    assert out["forget_quality"] == pytest.approx(2 / math.comb(40, 20), rel=1e-9)
    # monotone invariance: reciprocal ratios (TOFU's true-over-false convention) give the same p-value
    rng = np.random.default_rng(2)
    a, b = rng.lognormal(0, 1, 30), rng.lognormal(0.4, 1, 30)
    direct = forget_quality.compute(predictions=list(a), references=list(b))
    flipped = forget_quality.compute(predictions=list(1 / a), references=list(1 / b))
    assert direct["forget_quality"] == pytest.approx(flipped["forget_quality"], rel=1e-12)


def test_forget_quality_bad_input(forget_quality):
    with pytest.raises(ValueError, match="non-finite"):
        forget_quality.compute(predictions=[1.0, float("inf")], references=[1.0, 2.0])
    with pytest.raises(ValueError):
        forget_quality.compute(predictions=[1.0, 2.0], references=[1.0, 2.0, 3.0])


def test_model_utility_matches_scipy_hmean(model_utility):
    rng = np.random.default_rng(3)
    for _ in range(5):
        comps = rng.uniform(0.01, 1.0, size=9)
        out = model_utility.compute(predictions=list(comps))
        assert out["model_utility"] == pytest.approx(hmean(comps), rel=1e-12)
    assert model_utility.compute(predictions=[0.5] * 8 + [0.25])["model_utility"] == pytest.approx(0.45)
    assert model_utility.compute(predictions=[0.9] * 8 + [0.0])["model_utility"] == 0.0
    with pytest.raises(ValueError, match="non-negative"):
        model_utility.compute(predictions=[0.5] * 8 + [-0.1])


def test_evaluator_uses_the_same_modules():
    from hf_unlearn.evaluation import metrics

    out = metrics.truth_ratio([1.0], [[1.0, 3.0]], "true_better")
    assert out["truth_ratio"] == pytest.approx(1 - math.exp(-1))
    assert metrics.model_utility([0.5] * 8 + [0.25]) == pytest.approx(0.45)
    assert metrics.load_metric("tofu_truth_ratio") is metrics.load_metric("tofu_truth_ratio")
    with pytest.raises(ValueError, match="same forget questions"):
        metrics.forget_quality([1.0], [1.0, 2.0])
