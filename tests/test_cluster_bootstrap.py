"""The cluster (author-level) bootstrap: its coverage on constructed clustered data, and each TOFU figure's value
against the metric modules."""

import numpy as np
import pytest

from hf_unlearn.evaluation import metrics
from hf_unlearn.evaluation.cluster_bootstrap import (
    author_clusters,
    cluster_bootstrap,
    cluster_resample_indices,
    forget_quality_by_author,
    harmonic_mean,
    paired_difference_by_author,
    row_clusters,
    truth_ratio_scores,
)


def _clustered(rng, n_clusters, rows, cluster_sd=1.0, row_sd=0.5):
    """Rows whose cluster shares a random effect: ``y = u_c + e``, true mean 0."""
    effects = rng.normal(0.0, cluster_sd, n_clusters)
    labels = np.repeat(np.arange(n_clusters), rows)
    return effects[labels] + rng.normal(0.0, row_sd, len(labels)), labels


def _mean_interval(values, labels, seed):
    return cluster_bootstrap(lambda i: values[i].mean(), [labels], n_resamples=300, seed=seed)


def test_cluster_bootstrap_covers_the_true_mean_at_its_nominal_rate_and_is_wider_than_the_row_bootstrap():
    # The percentile bootstrap reaches its nominal rate as the number of clusters grows (with 30 clusters it
    # covers about 92%); 100 clusters keep the simulation within a binomial tolerance of 95%.
    rng = np.random.default_rng(7)
    reps, cover_cluster, cover_row, wider = 200, 0, 0, 0
    for rep in range(reps):
        values, labels = _clustered(rng, n_clusters=100, rows=4)
        by_cluster = _mean_interval(values, labels, rep)
        by_row = _mean_interval(values, row_clusters(len(values)), rep)
        cover_cluster += by_cluster["low"] <= 0.0 <= by_cluster["high"]
        cover_row += by_row["low"] <= 0.0 <= by_row["high"]
        wider += (by_cluster["high"] - by_cluster["low"]) > (by_row["high"] - by_row["low"])
    tolerance = 3 * np.sqrt(0.95 * 0.05 / reps)  # three binomial standard errors at the nominal rate
    assert abs(cover_cluster / reps - 0.95) <= tolerance
    assert cover_row / reps < 0.95 - tolerance  # rows of one cluster are not independent draws
    assert wider == reps


def test_a_resample_draws_whole_clusters():
    labels = np.array([0, 0, 0, 1, 1, 2])
    for idx in cluster_resample_indices(labels, 50, np.random.default_rng(0)):
        drawn = labels[idx]
        for c, size in ((0, 3), (1, 2), (2, 1)):
            assert np.sum(drawn == c) % size == 0
        assert len(idx) in {3, 4, 5, 6, 7, 8, 9}


def test_forget_quality_and_ks_statistic_equal_the_metric_module():
    rng = np.random.default_rng(1)
    pred, ref = rng.lognormal(-0.5, 0.5, 80), rng.lognormal(0.0, 0.5, 80)
    out = forget_quality_by_author(pred, ref, author_clusters(80), n_resamples=200)
    expected = metrics.forget_quality(pred, ref)
    assert out["forget_quality"] == pytest.approx(expected["forget_quality"], rel=1e-9)
    assert out["ks_statistic"] == pytest.approx(expected["ks_statistic"], rel=1e-9)
    assert out["forget_quality_low"] <= out["forget_quality_high"]
    assert out["ks_statistic_low"] <= out["ks_statistic"] <= out["ks_statistic_high"] + 1e-12


@pytest.mark.parametrize("aggregator", ["closer_to_1_better", "true_better"])
def test_truth_ratio_scores_average_to_the_metric_modules_aggregate(aggregator):
    rng = np.random.default_rng(2)
    true = rng.uniform(0.5, 3.0, 40)
    false = rng.uniform(0.5, 3.0, (40, 5))
    reference = metrics.truth_ratio(true, false, aggregator)
    scores = truth_ratio_scores(reference["truth_ratios"], aggregator)
    assert scores.mean() == pytest.approx(reference["truth_ratio"], rel=1e-9)


def test_harmonic_mean_equals_the_model_utility_module():
    components = np.random.default_rng(3).uniform(0.3, 0.9, 9)
    assert harmonic_mean(components) == pytest.approx(metrics.model_utility(components), rel=1e-9)
    assert harmonic_mean([0.5, 0.0]) == 0.0


def test_a_paired_difference_cancels_what_the_authors_share():
    rng = np.random.default_rng(4)
    shared, labels = _clustered(rng, 10, 20, cluster_sd=2.0, row_sd=0.1)
    a, b = shared + 0.3, shared + rng.normal(0.0, 0.1, len(shared))

    def mean(values, rows):
        return values[rows].mean()

    paired = paired_difference_by_author(mean, a, b, labels, n_resamples=300)
    assert paired["difference"] == pytest.approx(a.mean() - b.mean())
    assert paired["difference_low"] > 0.0  # the effect is resolved once the shared author effect cancels
    unpaired = cluster_bootstrap(lambda i, j: a[i].mean() - b[j].mean(), [labels, labels], n_resamples=300)
    assert paired["difference_high"] - paired["difference_low"] < (unpaired["high"] - unpaired["low"]) / 5
    same = paired_difference_by_author(mean, a, a, labels, n_resamples=50)
    assert same["difference_low"] == same["difference_high"] == 0.0


def test_refusals():
    with pytest.raises(ValueError, match="whole authors"):
        author_clusters(30)
    with pytest.raises(ValueError, match="same rows"):
        paired_difference_by_author(lambda v, i: v[i].mean(), [1.0, 2.0], [1.0], [0, 1])
    with pytest.raises(ValueError, match="pairs the questions"):
        forget_quality_by_author([1.0, 2.0], [1.0, 2.0], [0])
