"""The four `evaluate` metric modules and the report's pure metric functions against independent computations
(scipy, slow loops, hand formulas)."""

from __future__ import annotations

import math

import evaluate
import numpy as np
import pytest
from scipy.stats import hmean, ks_2samp

import hf_unlearn
from hf_unlearn.assets import _artifact_dir


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
        assert (_artifact_dir("evaluate_metrics") / name / "README.md").is_file()
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


# --------------------------------------------------------------------------------------------------------------
# Privacy and memorization (open-unlearning's TOFU table), MU-ROUGE: pure functions vs slow references
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def privleak_metric():
    return evaluate.load(hf_unlearn.metric_path("tofu_privleak"), keep_in_memory=True)


def _slow_auc(forget, holdout):
    """Pairwise definition: P(s_holdout > s_forget) + 1/2 P(tie), holdout labelled 1."""
    total = 0.0
    for f in forget:
        for h in holdout:
            total += 1.0 if h > f else 0.5 if h == f else 0.0
    return total / (len(forget) * len(holdout))


def test_mia_auc_matches_pairwise_definition_and_mann_whitney():
    from scipy.stats import mannwhitneyu

    from hf_unlearn.evaluation import mia_auc

    rng = np.random.default_rng(5)
    for n_f, n_h in ((7, 11), (20, 20), (3, 1)):
        forget = rng.normal(0.0, 1.0, n_f).round(1)  # rounding makes ties
        holdout = rng.normal(0.5, 1.0, n_h).round(1)
        auc = mia_auc(forget, holdout)
        assert auc == pytest.approx(_slow_auc(forget, holdout), abs=1e-12)
        assert auc == pytest.approx(mannwhitneyu(holdout, forget).statistic / (n_f * n_h), abs=1e-12)
    assert mia_auc([0.1, 0.2], [0.9, 1.0]) == 1.0 and mia_auc([0.9, 1.0], [0.1, 0.2]) == 0.0
    with pytest.raises(ValueError, match="at least one"):
        mia_auc([], [1.0])
    with pytest.raises(ValueError, match="non-finite"):
        mia_auc([float("nan")], [1.0])


def test_attack_scores_match_loops():
    import zlib

    from hf_unlearn.evaluation import loss_score, min_k_plus_plus_score, min_k_score, zlib_score

    rng = np.random.default_rng(6)
    lp = -rng.exponential(1.0, size=13)
    assert loss_score(lp) == pytest.approx(-sum(lp) / 13)
    assert zlib_score(lp, "some answer text") == pytest.approx(
        (-sum(lp) / 13) / len(zlib.compress(b"some answer text"))
    )
    # min-k 40%: the 5 (= floor(0.4 * 13)) least likely tokens
    lowest = sorted(lp)[:5]
    assert min_k_score(lp, 0.4) == pytest.approx(-sum(lowest) / 5)
    assert min_k_score(lp[:1], 0.4) == pytest.approx(-lp[0])  # at least one token
    # min-k++ from a real next-token distribution: z = (log p(y) - E[log p]) / std[log p]
    logits = rng.normal(size=(13, 30))
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    targets = rng.integers(0, 30, 13)
    tok_lp = logp[np.arange(13), targets]
    mu = np.array([sum(math.exp(v) * v for v in row) for row in logp])
    var = np.array([sum(math.exp(v) * v * v for v in row) for row in logp]) - mu**2
    z = [(tok_lp[t] - mu[t]) / math.sqrt(var[t]) for t in range(13)]
    assert min_k_plus_plus_score(tok_lp, mu, var, 0.4) == pytest.approx(-sum(sorted(z)[:5]) / 5)
    assert min_k_score([], 0.4) == 0.0 and loss_score([]) == 0.0


def test_privleak_formula():
    from hf_unlearn.evaluation import privleak

    assert privleak(1.0) == pytest.approx(-100.0)  # memorised, against the default reference AUC 0.5
    assert privleak(0.5) == pytest.approx(0.0)
    assert privleak(0.8, 0.6) == pytest.approx(((1 - 0.8) - (1 - 0.6)) / (1 - 0.6) * 100)
    assert privleak(0.3, 0.6) == pytest.approx(75.0)
    with pytest.raises(ValueError, match="below 1"):
        privleak(0.5, 1.0)


def _slow_extraction_strength(greedy):
    """open-unlearning's loop: the first k whose suffix is all correct; stops at n - 1."""
    n = len(greedy)
    for k in range(n):
        if all(greedy[k:]):
            break
    return 1 - k / n


def test_extraction_strength_and_exact_memorization_match_loops():
    from hf_unlearn.evaluation import exact_memorization, extraction_strength

    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(1, 12))
        greedy = list(rng.random(n) < 0.7)
        assert extraction_strength(greedy) == pytest.approx(_slow_extraction_strength(greedy))
        assert exact_memorization(greedy) == pytest.approx(sum(greedy) / n)
    assert extraction_strength([True] * 5) == 1.0
    assert extraction_strength([False, False, True, True]) == pytest.approx(0.5)
    assert extraction_strength([True, True, False]) == pytest.approx(1 / 3)  # open-unlearning's 1/n floor
    assert extraction_strength([]) == 0.0 and exact_memorization([]) == 0.0


def test_mu_rouge_is_scipy_hmean():
    from hf_unlearn.evaluation import mu_rouge

    assert mu_rouge(0.9, 0.6, 0.3) == pytest.approx(hmean([0.9, 0.6, 0.3]))
    assert mu_rouge(0.9, 0.0, 0.3) == 0.0
    with pytest.raises(ValueError):
        mu_rouge(-0.1, 0.5, 0.5)


def test_privleak_module_matches_functions(privleak_metric):
    from hf_unlearn.evaluation import mia_auc, privleak

    rng = np.random.default_rng(8)
    forget, holdout = list(rng.normal(0, 1, 9)), list(rng.normal(0.7, 1, 12))
    out = privleak_metric.compute(predictions=forget + holdout, references=[0] * 9 + [1] * 12, reference_auc=0.55)
    assert out["auc"] == pytest.approx(_slow_auc(forget, holdout))
    assert out["auc"] == pytest.approx(mia_auc(forget, holdout))
    assert out["privleak"] == pytest.approx(privleak(out["auc"], 0.55))
    assert privleak_metric.compute(predictions=[0.1, 0.2, 0.9, 1.0], references=[0, 0, 1, 1]) == {
        "auc": 1.0, "privleak": -100.0}
    with pytest.raises(ValueError, match="0 \\(forget\\) or 1"):
        privleak_metric.compute(predictions=[0.1, 0.2], references=[0, 2])
    with pytest.raises(ValueError, match="at least one forget"):
        privleak_metric.compute(predictions=[0.1, 0.2], references=[1, 1])
