"""Intervals by author: a cluster bootstrap for TOFU's forget quality and paired comparisons.

The rows of one TOFU author move together, so the bootstrap resamples authors (clusters), not rows: with ``K``
clusters and ``R_k`` the rows of cluster ``k``, one resample draws ``k_1..k_K`` uniformly with replacement and takes
the rows ``R_{k_1} + ... + R_{k_K}``; the interval is the ``(1 - c)/2`` and ``(1 + c)/2`` quantiles of the statistic
over the resamples. Every function is pure and seeded (``numpy.random.default_rng(seed)``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


def cluster_resample_indices(clusters: Sequence[Any], n_resamples: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``n_resamples`` resamples of the rows by cluster: each draws ``K`` of the ``K`` clusters uniformly with
    replacement and concatenates their row indices ``R_{k_1} + ... + R_{k_K}``."""
    if n_resamples < 1:
        raise ValueError(f"A bootstrap needs at least one resample, got {n_resamples}.")
    labels = np.asarray(clusters)
    if labels.ndim != 1 or len(labels) == 0:
        raise ValueError("A cluster bootstrap needs one cluster label per row and at least one row.")
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    groups = [np.flatnonzero(inverse == k) for k in np.argsort(first)]  # each cluster's rows, by first appearance
    draws = rng.integers(0, len(groups), size=(n_resamples, len(groups)))
    if len({len(g) for g in groups}) == 1:  # clusters of one size: one gather for every resample
        return list(np.stack(groups)[draws].reshape(n_resamples, -1))
    return [np.concatenate([groups[k] for k in draw]) for draw in draws]


def cluster_bootstrap(
    statistic: Callable[..., float], samples: Sequence[Sequence[Any]], *, confidence: float = 0.95,
    n_resamples: int = 1000, seed: int = 0,
) -> dict[str, float]:
    """``S`` on the full samples and its cluster-bootstrap percentile interval: ``samples`` holds one cluster-label
    sequence per sample, ``statistic(*indices)`` computes ``S`` on one array of row indices per sample. Returns
    ``value``, ``low``, ``high``, ``confidence``, ``n_resamples``."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}.")
    rng = np.random.default_rng(seed)
    draws = [cluster_resample_indices(labels, n_resamples, rng) for labels in samples]
    values = [float(statistic(*indices)) for indices in zip(*draws)]
    low, high = np.quantile(values, [(1 - confidence) / 2, (1 + confidence) / 2])
    full = float(statistic(*(np.arange(len(labels)) for labels in samples)))
    return {"value": full, "low": float(low), "high": float(high), "confidence": confidence, "n_resamples": n_resamples}


def forget_quality_by_author(
    predictions: Sequence[float], references: Sequence[float], clusters: Sequence[Any], *,
    confidence: float = 0.95, n_resamples: int = 1000, seed: int = 0,
) -> dict[str, float]:
    """Forget quality ``p = KS_pvalue({tr_i}, {tr_i^ref})`` and ``D = sup_x |F(x) - F^ref(x)|``, each with its
    interval; the truth ratios are paired by question and a resample applies the same rows to both sides. Returns
    ``forget_quality``, ``ks_statistic``, each with ``_low`` / ``_high``, ``confidence``, ``n_resamples``."""
    from scipy.stats import ks_2samp

    pred, ref = np.asarray(predictions, dtype=np.float64), np.asarray(references, dtype=np.float64)
    if not len(pred) == len(ref) == len(clusters):
        raise ValueError(f"Forget quality pairs the questions: got {len(pred)} predictions, {len(ref)} references and {len(clusters)} cluster labels.")
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


def paired_difference_by_author(
    statistic: Callable[[Sequence[float], np.ndarray], float], first: Sequence[float], second: Sequence[float],
    clusters: Sequence[Any], *, confidence: float = 0.95, n_resamples: int = 1000, seed: int = 0,
) -> dict[str, float]:
    """Method A against method B on the same rows: ``Delta_b = S(a[I_b]) - S(b[I_b])`` with the same resampled
    authors on both sides; ``statistic(values, row_indices)`` computes ``S``. Returns ``difference``,
    ``difference_low``, ``difference_high``, ``confidence``, ``n_resamples``."""
    a, b = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)
    if not len(a) == len(b) == len(clusters):
        raise ValueError(f"A paired comparison needs both methods on the same rows: got {len(a)}, {len(b)} values and {len(clusters)} cluster labels.")
    out = cluster_bootstrap(lambda i: statistic(a, i) - statistic(b, i), [clusters], confidence=confidence,
                            n_resamples=n_resamples, seed=seed)
    return {"difference": out["value"], "difference_low": out["low"], "difference_high": out["high"],
            "confidence": confidence, "n_resamples": n_resamples}
