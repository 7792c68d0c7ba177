"""The evaluator's single access point to the package's ``evaluate`` metric modules (``evaluate_metrics/``, the
one source of the TOFU aggregates' formulas), loaded once per process and cached."""

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


def truth_ratio(true_losses: Sequence[float], false_losses: Sequence[Sequence[float]], aggregator: str) -> dict[str, Any]:
    """``tofu_truth_ratio``: ``{"truth_ratio", "truth_ratios"}`` with ``tr_i = exp(true_loss_i - mean_j false_loss_ij)``."""
    return load_metric("tofu_truth_ratio").compute(
        true_losses=_floats(true_losses), false_losses=[_floats(f) for f in false_losses], aggregator=aggregator)


def forget_quality(predictions: Sequence[float], references: Sequence[float]) -> dict[str, float]:
    """``tofu_forget_quality``: ``{"forget_quality": KS p-value, "ks_statistic": D}``."""
    if len(predictions) != len(references):
        raise ValueError(f"Forget quality compares truth ratios on the same forget questions, but got {len(predictions)} predictions and {len(references)} references.")
    return load_metric("tofu_forget_quality").compute(predictions=_floats(predictions), references=_floats(references))


def model_utility(components: Sequence[float]) -> float:
    """``tofu_model_utility``: harmonic mean of the component scores (0 if any is 0)."""
    return float(load_metric("tofu_model_utility").compute(predictions=_floats(components))["model_utility"])


def forget_quality_interval(
    predictions: Sequence[float], references: Sequence[float], confidence: float = 0.95,
    n_resamples: int = 1000, seed: int = 0,
) -> dict[str, float]:
    """Forget quality ``p = KS_pvalue({tr_i}, {tr_i^ref})`` and the KS statistic ``D``, each with its percentile
    bootstrap interval over the forget rows (paired by question; every row its own cluster in
    :func:`.cluster_bootstrap.forget_quality_by_author`). Returns ``forget_quality``, ``ks_statistic``, each with
    ``_low`` / ``_high``, ``confidence``, ``n_resamples``."""
    from .cluster_bootstrap import forget_quality_by_author, row_clusters

    return forget_quality_by_author(_floats(predictions), _floats(references), row_clusters(len(predictions)),
                                    confidence=confidence, n_resamples=n_resamples, seed=seed)
