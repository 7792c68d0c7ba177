"""The forget-quality bootstrap interval against a slow pure-Python reference (ECDF by brute force, exact
two-sample KS p-value by counting lattice paths)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from hf_unlearn.evaluation.cluster_bootstrap import cluster_resample_indices, row_clusters
from hf_unlearn.evaluation.metrics import forget_quality_interval


def _slow_ks_statistic(a: list[float], b: list[float]) -> float:
    """sup_x |F_a(x) - F_b(x)|, evaluated at every sample point (the ECDFs only jump there)."""
    best = 0.0
    for x in a + b:
        fa = sum(v <= x for v in a) / len(a)
        fb = sum(v <= x for v in b) / len(b)
        best = max(best, abs(fa - fb))
    return best


def _slow_exact_pvalue(d: float, n: int) -> float:
    """P(D_{n,n} >= d) for two samples of size n: one minus the share of the C(2n, n) monotone lattice paths
    from (0, 0) to (n, n) that stay strictly inside |i - j| < h, h = round(d * n)."""
    h = round(d * n)
    paths = [[0] * (n + 1) for _ in range(n + 1)]
    paths[0][0] = 1
    for i in range(n + 1):
        for j in range(n + 1):
            if (i, j) == (0, 0):
                continue
            if abs(i - j) >= h:
                paths[i][j] = 0
                continue
            paths[i][j] = (paths[i - 1][j] if i else 0) + (paths[i][j - 1] if j else 0)
    return 1.0 - paths[n][n] / math.comb(2 * n, n)


def _slow_quantile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default 'linear' method)."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def test_interval_matches_the_slow_reference():
    rng = random.Random(3)
    n = 24
    predictions = [rng.gauss(0.4, 0.1) for _ in range(n)]
    references = [rng.gauss(0.5, 0.1) for _ in range(n)]
    result = forget_quality_interval(predictions, references, n_resamples=60, seed=7)

    pvalues, stats = [], []
    for idx in cluster_resample_indices(row_clusters(n), 60, np.random.default_rng(7)):
        idx = idx.tolist()
        a, b = [predictions[i] for i in idx], [references[i] for i in idx]
        d = _slow_ks_statistic(a, b)
        stats.append(d)
        pvalues.append(_slow_exact_pvalue(d, n))
    # scipy's exact KS distribution and the path count agree to rounding (1e-9 relative is ample for float64)
    assert result["ks_statistic_low"] == pytest.approx(_slow_quantile(stats, 0.025), rel=1e-9)
    assert result["ks_statistic_high"] == pytest.approx(_slow_quantile(stats, 0.975), rel=1e-9)
    assert result["forget_quality_low"] == pytest.approx(_slow_quantile(pvalues, 0.025), rel=1e-6, abs=1e-12)
    assert result["forget_quality_high"] == pytest.approx(_slow_quantile(pvalues, 0.975), rel=1e-6, abs=1e-12)
    d_full = _slow_ks_statistic(predictions, references)
    assert result["ks_statistic"] == pytest.approx(d_full, rel=1e-12)
    assert result["forget_quality"] == pytest.approx(_slow_exact_pvalue(d_full, n), rel=1e-6)


def test_identical_distributions_give_an_interval_at_one_and_shifted_ones_an_interval_near_zero():
    values = list(np.linspace(0.1, 0.9, 40))
    same = forget_quality_interval(values, values, n_resamples=50)
    assert same["forget_quality"] == pytest.approx(1.0)
    assert same["forget_quality_low"] == pytest.approx(1.0) and same["ks_statistic_high"] == 0.0
    shifted = forget_quality_interval(values, [v + 2.0 for v in values], n_resamples=50)
    assert shifted["forget_quality_high"] < 1e-10 and shifted["ks_statistic_low"] == 1.0


def test_interval_refuses_bad_arguments():
    with pytest.raises(ValueError, match="confidence"):
        forget_quality_interval([0.1, 0.2], [0.1, 0.2], confidence=1.0)
    with pytest.raises(ValueError, match="pairs the questions"):
        forget_quality_interval([0.1, 0.2], [0.1])
    with pytest.raises(ValueError, match="one resample"):
        forget_quality_interval([0.1, 0.2], [0.1, 0.2], n_resamples=0)
