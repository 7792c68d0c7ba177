"""Intervals by author: a cluster bootstrap for TOFU's forget quality, model utility, the gaps between splits and
paired comparisons of two methods on the same authors.

The rows of one TOFU author share that author's difficulty and move together under unlearning, so the rows of a
split are not independent draws: 80 forget rows of 4 authors are closer to 4 draws than to 80. A bootstrap that
resamples rows treats them as 80 and gives intervals that are too narrow. The *cluster bootstrap* resamples the
clusters (authors) instead: with ``K`` distinct clusters ``c_1..c_K`` and ``R_k`` the row indices of cluster
``c_k``, one resample draws ``k_1..k_K`` uniformly with replacement from ``1..K`` and takes the rows
``R_{k_1} + ... + R_{k_K}`` (a cluster drawn twice contributes its rows twice). A statistic ``S`` of the rows is
computed on each resample ``b``, giving ``S_b``; the interval is the percentile interval, the ``(1 - c)/2`` and
``(1 + c)/2`` quantiles of ``{S_b}`` (numpy's linear interpolation) for confidence ``c``. The row bootstrap is
the special case where every row is its own cluster (:func:`row_clusters`).

A statistic over several samples (forget and holdout authors; the retain, real-author and world-fact splits of
model utility) resamples each sample by its own clusters, independently. A *paired* comparison applies the same
resampled indices to two methods' values on the same rows, so what the authors share cancels in the difference.

Every function here is pure (numpy and scipy only) and seeded: ``numpy.random.default_rng(seed)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

#: Rows per author in TOFU's forget, retain and holdout splits (they are stored author by author).
TOFU_ROWS_PER_AUTHOR = 20


def row_clusters(n_rows: int) -> np.ndarray:
    """Every row its own cluster: ``[0, 1, ..., n_rows - 1]`` (the cluster bootstrap is then the row bootstrap)."""
    return np.arange(n_rows)


def author_clusters(n_rows: int, rows_per_author: int = TOFU_ROWS_PER_AUTHOR) -> np.ndarray:
    """The author of each row of a split stored author by author: ``label_i = floor(i / rows_per_author)``."""
    if n_rows % rows_per_author:
        raise ValueError(f"{n_rows} rows are not whole authors of {rows_per_author} rows each.")
    return np.arange(n_rows) // rows_per_author


def _cluster_rows(clusters: Sequence[Any]) -> list[np.ndarray]:
    """The row indices of each distinct cluster label, in order of first appearance."""
    labels = np.asarray(clusters)
    if labels.ndim != 1 or len(labels) == 0:
        raise ValueError("A cluster bootstrap needs one cluster label per row and at least one row.")
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    order = np.argsort(first)
    return [np.flatnonzero(inverse == k) for k in order]


def cluster_resample_indices(clusters: Sequence[Any], n_resamples: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``n_resamples`` resamples of the rows by cluster: each draws ``K`` of the ``K`` clusters uniformly with
    replacement and concatenates their row indices ``R_{k_1} + ... + R_{k_K}``."""
    if n_resamples < 1:
        raise ValueError(f"A bootstrap needs at least one resample, got {n_resamples}.")
    groups = _cluster_rows(clusters)
    draws = rng.integers(0, len(groups), size=(n_resamples, len(groups)))
    if len({len(g) for g in groups}) == 1:  # clusters of one size: one gather for every resample
        return list(np.stack(groups)[draws].reshape(n_resamples, -1))
    return [np.concatenate([groups[k] for k in draw]) for draw in draws]


def percentile_interval(values: Sequence[float], confidence: float) -> tuple[float, float]:
    """The ``(1 - c)/2`` and ``(1 + c)/2`` quantiles of ``values`` (numpy's linear interpolation)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}.")
    lo, hi = np.quantile(np.asarray(values, dtype=np.float64), [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(lo), float(hi)


def cluster_bootstrap(
    statistic: Callable[..., float], samples: Sequence[Sequence[Any]], *, confidence: float = 0.95,
    n_resamples: int = 1000, seed: int = 0,
) -> dict[str, float]:
    """``S`` on the full samples and its cluster-bootstrap percentile interval.

    ``samples`` holds one cluster-label sequence per sample (one label per row); ``statistic(*indices)`` takes one
    array of row indices per sample and returns ``S`` on those rows. The full-sample value is ``S`` on every row
    (``arange(n_j)`` for each sample ``j``); resample ``b`` draws each sample's clusters independently
    (:func:`cluster_resample_indices`). Returns ``value``, ``low``, ``high``, ``confidence``, ``n_resamples``.
    """
    rng = np.random.default_rng(seed)
    draws = [cluster_resample_indices(labels, n_resamples, rng) for labels in samples]
    values = [float(statistic(*indices)) for indices in zip(*draws)]
    low, high = percentile_interval(values, confidence)
    full = float(statistic(*(np.arange(len(labels)) for labels in samples)))
    return {"value": full, "low": low, "high": high, "confidence": confidence, "n_resamples": n_resamples}


def forget_quality_by_author(
    predictions: Sequence[float], references: Sequence[float], clusters: Sequence[Any], *,
    confidence: float = 0.95, n_resamples: int = 1000, seed: int = 0,
) -> dict[str, float]:
    """TOFU's forget quality and the KS statistic beside it, each with its cluster-bootstrap interval.

    With ``tr_i`` the model's and ``tr_i^ref`` the retain reference's truth ratio on forget question ``i`` (paired
    by question), forget quality is ``p = KS_pvalue({tr_i}, {tr_i^ref})`` and the effect size beside it the KS
    statistic ``D = sup_x |F(x) - F^ref(x)|`` of the two empirical distributions. A resample draws authors
    (``clusters``, one label per question) and applies the same rows to both sides. Returns ``forget_quality``,
    ``forget_quality_low``, ``forget_quality_high``, ``ks_statistic``, ``ks_statistic_low``, ``ks_statistic_high``,
    ``confidence``, ``n_resamples``.
    """
    from scipy.stats import ks_2samp

    pred, ref = np.asarray(predictions, dtype=np.float64), np.asarray(references, dtype=np.float64)
    if not len(pred) == len(ref) == len(clusters):
        raise ValueError(f"Forget quality pairs the questions: got {len(pred)} predictions, {len(ref)} references "
                         f"and {len(clusters)} cluster labels.")
    options = {"confidence": confidence, "n_resamples": n_resamples, "seed": seed}
    p = cluster_bootstrap(lambda i: ks_2samp(pred[i], ref[i]).pvalue, [clusters], **options)
    d = cluster_bootstrap(lambda i: ks_2samp(pred[i], ref[i]).statistic, [clusters], **options)
    return {"forget_quality": p["value"], "forget_quality_low": p["low"], "forget_quality_high": p["high"],
            "ks_statistic": d["value"], "ks_statistic_low": d["low"], "ks_statistic_high": d["high"],
            "confidence": confidence, "n_resamples": n_resamples}


def truth_ratio_scores(ratios: Sequence[float], aggregator: str) -> np.ndarray:
    """The per-question scores whose mean is TOFU's truth-ratio aggregate: ``min(tr_i, 1/tr_i)`` for
    ``closer_to_1_better`` (forget), ``max(0, 1 - tr_i)`` for ``true_better`` (retain, real authors, world facts)."""
    tr = np.asarray(ratios, dtype=np.float64)
    if aggregator == "closer_to_1_better":
        return np.minimum(tr, 1.0 / tr)
    if aggregator == "true_better":
        return np.maximum(0.0, 1.0 - tr)
    raise ValueError(f"Unknown aggregator {aggregator!r}; use 'closer_to_1_better' or 'true_better'.")


def harmonic_mean(values: Sequence[float]) -> float:
    """``n / sum_i (1 / s_i)``, 0 when any ``s_i`` is 0 (TOFU's model utility over its components)."""
    s = np.asarray(values, dtype=np.float64)
    return 0.0 if np.any(s <= 0) else float(len(s) / np.sum(1.0 / s))


def model_utility_by_author(
    splits: Mapping[str, tuple[Mapping[str, Sequence[float]], Sequence[Any]]], *, confidence: float = 0.95,
    n_resamples: int = 1000, seed: int = 0,
) -> dict[str, float]:
    """TOFU's model utility with its cluster-bootstrap interval.

    ``splits`` maps each utility split (retain, real authors, world facts) to ``(scores, clusters)``: ``scores``
    maps a component name to its per-row scores (the answer probability, the ROUGE-L recall and the truth-ratio
    score of :func:`truth_ratio_scores`, whose split means are TOFU's components) and ``clusters`` labels each
    row's author (a split without authors: :func:`row_clusters`). Model utility is the harmonic mean of the split
    means of every component, ``MU = H(mean_{i in split} s_i for every (split, component))``; a resample draws
    each split's clusters independently. Returns ``model_utility``, ``model_utility_low``, ``model_utility_high``,
    ``confidence``, ``n_resamples``.
    """
    names = list(splits)
    arrays = [{k: np.asarray(v, dtype=np.float64) for k, v in splits[n][0].items()} for n in names]

    def utility(*indices: np.ndarray) -> float:
        return harmonic_mean([a[i].mean() for scores, i in zip(arrays, indices) for a in scores.values()])

    out = cluster_bootstrap(utility, [splits[n][1] for n in names], confidence=confidence,
                            n_resamples=n_resamples, seed=seed)
    return {"model_utility": out["value"], "model_utility_low": out["low"], "model_utility_high": out["high"],
            "confidence": confidence, "n_resamples": n_resamples}


def author_mean(values: np.ndarray, clusters: np.ndarray) -> float:
    """The mean over clusters of each cluster's row mean, ``(1/K) sum_k mean_{i in c_k} v_i`` (every author
    weighs the same, however many rows it has)."""
    return float(_author_means(np.asarray(values, dtype=np.float64), np.asarray(clusters)).mean())


def gap_by_author(
    first: Sequence[float], first_clusters: Sequence[Any], second: Sequence[float], second_clusters: Sequence[Any],
    *, confidence: float = 0.95, n_resamples: int = 1000, seed: int = 0,
) -> dict[str, float]:
    """A gap between two splits, ``author_mean(first) - author_mean(second)`` (e.g. the forget authors' NLL shift
    minus the holdout authors'), with its cluster-bootstrap interval. Each split is first reduced to its author
    means ``m_k``; a resample draws each split's authors independently with replacement, so the resampled gap is
    ``mean_b(m^first_{k_b}) - mean_b(m^second_{l_b})``, an author drawn twice counting twice. Returns ``gap``,
    ``gap_low``, ``gap_high``, ``confidence``, ``n_resamples``."""
    a = _author_means(np.asarray(first, dtype=np.float64), np.asarray(first_clusters))
    b = _author_means(np.asarray(second, dtype=np.float64), np.asarray(second_clusters))
    out = cluster_bootstrap(lambda i, j: a[i].mean() - b[j].mean(), [row_clusters(len(a)), row_clusters(len(b))],
                            confidence=confidence, n_resamples=n_resamples, seed=seed)
    return {"gap": out["value"], "gap_low": out["low"], "gap_high": out["high"], "confidence": confidence,
            "n_resamples": n_resamples}


def _author_means(values: np.ndarray, clusters: np.ndarray) -> np.ndarray:
    """Each cluster's row mean, clusters in order of first appearance."""
    if len(values) != len(clusters):
        raise ValueError(f"Got {len(values)} values and {len(clusters)} cluster labels.")
    return np.array([values[rows].mean() for rows in _cluster_rows(clusters)])


def paired_difference_by_author(
    statistic: Callable[[Sequence[float], np.ndarray], float], first: Sequence[float], second: Sequence[float],
    clusters: Sequence[Any], *, confidence: float = 0.95, n_resamples: int = 1000, seed: int = 0,
) -> dict[str, float]:
    """Method A against method B on the same rows: ``Delta = S(a) - S(b)`` with its cluster-bootstrap interval.

    ``first`` and ``second`` are the two methods' per-row values on the same questions, in the same order;
    ``statistic(values, row_indices)`` computes ``S`` on the rows ``row_indices`` of ``values``. Each resample
    draws authors once and applies the same rows to both methods, ``Delta_b = S(a[I_b]) - S(b[I_b])``, so the
    difficulty the authors share cancels. Returns ``difference``, ``difference_low``, ``difference_high``,
    ``confidence``, ``n_resamples``.
    """
    a, b = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)
    if not len(a) == len(b) == len(clusters):
        raise ValueError(f"A paired comparison needs both methods on the same rows: got {len(a)}, {len(b)} values "
                         f"and {len(clusters)} cluster labels.")
    out = cluster_bootstrap(lambda i: statistic(a, i) - statistic(b, i), [clusters], confidence=confidence,
                            n_resamples=n_resamples, seed=seed)
    return {"difference": out["value"], "difference_low": out["low"], "difference_high": out["high"],
            "confidence": confidence, "n_resamples": n_resamples}


#: The model-utility splits of a TOFU report and how their rows cluster: the retain split by author, the real
#: authors and world facts row by row (each row its own entity).
UTILITY_SPLIT_CLUSTERS = {"retain": "author", "real_authors": "row", "world_facts": "row"}


def _split_clusters(n_rows: int, kind: str) -> np.ndarray:
    return author_clusters(n_rows) if kind == "author" else row_clusters(n_rows)


def report_intervals_by_author(
    splits: Mapping[str, Mapping[str, Any]], reference_forget_truth_ratios: Sequence[float] | None = None, *,
    confidence: float = 0.95, n_resamples: int = 1000, seed: int = 0,
) -> dict[str, float | None]:
    """A TOFU report's forget quality (with the KS statistic) and model utility, each with its interval by author.

    ``splits`` is the report's ``splits`` (each with ``per_example`` ``prob``, ``rouge_l`` and ``truth_ratio``
    lists); ``reference_forget_truth_ratios`` the retain reference's forget truth ratios (without them, forget
    quality is ``None``). Forget and retain rows are clustered by author (:data:`TOFU_ROWS_PER_AUTHOR` rows each,
    in order); real authors and world facts row by row (:data:`UTILITY_SPLIT_CLUSTERS`). Model utility's
    components are the split means of the per-row probability, ROUGE-L recall and ``max(0, 1 - tr_i)``.
    """
    options = {"confidence": confidence, "n_resamples": n_resamples, "seed": seed}
    out: dict[str, float | None] = dict.fromkeys(
        ("forget_quality", "forget_quality_low", "forget_quality_high", "ks_statistic", "ks_statistic_low",
         "ks_statistic_high"))
    forget_tr = splits["forget"]["per_example"]["truth_ratio"]
    if reference_forget_truth_ratios is not None:
        out.update(forget_quality_by_author(forget_tr, reference_forget_truth_ratios,
                                            author_clusters(len(forget_tr)), **options))
    utility = {}
    for name, kind in UTILITY_SPLIT_CLUSTERS.items():
        rows = splits[name]["per_example"]
        scores = {"prob": rows["prob"], "rouge_l": rows["rouge_l"],
                  "truth_ratio": truth_ratio_scores(rows["truth_ratio"], "true_better")}
        utility[name] = (scores, _split_clusters(len(rows["prob"]), kind))
    out.update(model_utility_by_author(utility, **options))
    return out
