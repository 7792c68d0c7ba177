"""The evaluator's single access point to the package's `evaluate` metric modules.

Every TOFU aggregate (truth ratios, forget quality, model utility) is computed by the metric
modules shipped in ``evaluate_metrics/`` (one source of truth for the formulas); they are loaded
once per process with ``evaluate.load(hf_unlearn.metric_path(name))`` and cached.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from ..assets import METRIC_NAMES, metric_path


@cache
def load_metric(name: str) -> Any:
    """The loaded ``evaluate`` module ``name`` (one of ``hf_unlearn.METRIC_NAMES``), cached."""
    if name not in METRIC_NAMES:
        raise ValueError(f"Unknown metric {name!r}; the package ships {list(METRIC_NAMES)}.")
    import evaluate

    return evaluate.load(metric_path(name), keep_in_memory=True)


def _floats(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values]


def truth_ratio(
    true_losses: Sequence[float], false_losses: Sequence[Sequence[float]], aggregator: str
) -> dict[str, Any]:
    """``tofu_truth_ratio``: ``{"truth_ratio", "truth_ratios"}`` with
    ``tr_i = exp(true_loss_i - mean_j false_loss_ij)``."""
    return load_metric("tofu_truth_ratio").compute(
        true_losses=_floats(true_losses), false_losses=[_floats(f) for f in false_losses],
        aggregator=aggregator,
    )


def forget_quality(predictions: Sequence[float], references: Sequence[float]) -> dict[str, float]:
    """``tofu_forget_quality``: ``{"forget_quality": KS p-value, "ks_statistic": D}``."""
    if len(predictions) != len(references):
        raise ValueError(
            f"Forget quality compares truth ratios on the same forget questions, but got "
            f"{len(predictions)} predictions and {len(references)} references."
        )
    return load_metric("tofu_forget_quality").compute(
        predictions=_floats(predictions), references=_floats(references)
    )


def model_utility(components: Sequence[float]) -> float:
    """``tofu_model_utility``: harmonic mean of the component scores (0 if any is 0)."""
    return float(load_metric("tofu_model_utility").compute(predictions=_floats(components))["model_utility"])


def bootstrap_indices(n: int, n_resamples: int, seed: int = 0) -> Any:
    """``(n_resamples, n)`` row indices drawn uniformly with replacement (``numpy.random.default_rng(seed)``)."""
    import numpy as np

    if n < 1 or n_resamples < 1:
        raise ValueError(f"A bootstrap needs at least one row and one resample, got n={n}, n_resamples={n_resamples}.")
    return np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))


def forget_quality_interval(
    predictions: Sequence[float], references: Sequence[float], confidence: float = 0.95,
    n_resamples: int = 1000, seed: int = 0,
) -> dict[str, float]:
    """Forget quality with a percentile bootstrap interval over the forget rows.

    Forget quality is ``p = KS_pvalue({tr_i}, {tr_i^ref})`` over the per-question truth ratios of the model
    (``predictions``) and of the retain reference (``references``), which are paired by question. A resample
    ``b`` draws row indices ``I_b`` (``len = n``, with replacement) and applies them to both sides:
    ``p_b = KS_pvalue({tr_i : i in I_b}, {tr_i^ref : i in I_b})``. The interval is the
    ``(1 - confidence)/2`` and ``(1 + confidence)/2`` quantiles of ``{p_b}`` (numpy's linear interpolation);
    the KS statistic ``D = sup_x |F_n(x) - F_n^ref(x)|`` is reported for the full sample and as the same
    quantiles over resamples. Returns ``forget_quality``, ``ks_statistic``, ``forget_quality_low``,
    ``forget_quality_high``, ``ks_statistic_low``, ``ks_statistic_high``, ``confidence``, ``n_resamples``.
    """
    import numpy as np
    from scipy.stats import ks_2samp

    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}.")
    full = forget_quality(predictions, references)
    pred, ref = np.asarray(_floats(predictions)), np.asarray(_floats(references))
    pvalues, stats = [], []
    for idx in bootstrap_indices(len(pred), n_resamples, seed):
        result = ks_2samp(pred[idx], ref[idx])
        pvalues.append(float(result.pvalue))
        stats.append(float(result.statistic))
    lo, hi = (1 - confidence) / 2, (1 + confidence) / 2
    return {
        "forget_quality": float(full["forget_quality"]), "ks_statistic": float(full["ks_statistic"]),
        "forget_quality_low": float(np.quantile(pvalues, lo)),
        "forget_quality_high": float(np.quantile(pvalues, hi)),
        "ks_statistic_low": float(np.quantile(stats, lo)), "ks_statistic_high": float(np.quantile(stats, hi)),
        "confidence": confidence, "n_resamples": n_resamples,
    }
