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
    model_utility_by_author,
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


def test_model_utility_equals_the_metric_module_and_its_author_interval_is_wider():
    rng = np.random.default_rng(3)
    retain = {k: np.clip(0.6 + _clustered(rng, 8, 20, 0.15, 0.05)[0], 0.01, 1) for k in ("prob", "rouge", "tr")}
    general = {k: rng.uniform(0.3, 0.9, 50) for k in ("prob", "rouge", "tr")}
    splits = {"retain": (retain, author_clusters(160)), "real_authors": (general, row_clusters(50)),
              "world_facts": (general, row_clusters(50))}
    by_author = model_utility_by_author(splits, n_resamples=300)
    components = [v.mean() for scores, _ in splits.values() for v in scores.values()]
    assert by_author["model_utility"] == pytest.approx(metrics.model_utility(components), rel=1e-9)
    by_row = model_utility_by_author({k: (s, row_clusters(len(c))) for k, (s, c) in splits.items()},
                                     n_resamples=300)
    assert (by_author["model_utility_high"] - by_author["model_utility_low"]
            > by_row["model_utility_high"] - by_row["model_utility_low"])
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


def test_a_reports_intervals_by_author_match_its_own_figures():
    from hf_unlearn.evaluation.cluster_bootstrap import report_intervals_by_author

    rng = np.random.default_rng(5)

    def split(n):
        return {"per_example": {"prob": rng.uniform(0.2, 0.9, n).tolist(), "rouge_l": rng.uniform(0.2, 1, n).tolist(),
                                "truth_ratio": rng.uniform(0.1, 0.9, n).tolist()}}

    splits = {"forget": split(40), "retain": split(60), "real_authors": split(25), "world_facts": split(30)}
    reference = rng.uniform(0.3, 1.0, 40)
    out = report_intervals_by_author(splits, reference, n_resamples=100)
    components = []
    for name in ("retain", "real_authors", "world_facts"):
        rows = splits[name]["per_example"]
        components += [np.mean(rows["prob"]), np.mean(rows["rouge_l"]),
                       np.mean(np.maximum(0, 1 - np.asarray(rows["truth_ratio"])))]
    assert out["model_utility"] == pytest.approx(metrics.model_utility(components), rel=1e-9)
    assert out["forget_quality"] == pytest.approx(
        metrics.forget_quality(splits["forget"]["per_example"]["truth_ratio"], reference)["forget_quality"])
    assert out["model_utility_low"] <= out["model_utility"] <= out["model_utility_high"]
    assert report_intervals_by_author(splits, None, n_resamples=20)["forget_quality"] is None
