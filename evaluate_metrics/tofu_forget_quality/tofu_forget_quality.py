"""TOFU forget quality: KS-test p-value between an unlearned model's and a retain model's truth ratios.

Standalone `evaluate` metric module (no hf_unlearn import), Hub-Space ready. See README.md.
"""

from __future__ import annotations

import math

import datasets
import evaluate
from scipy.stats import ks_2samp

_CITATION = """\
@article{maini2024tofu,
  title   = {TOFU: A Task of Fictitious Unlearning for LLMs},
  author  = {Maini, Pratyush and Feng, Zhili and Schwarzschild, Avi and Lipton, Zachary C. and Kolter, J. Zico},
  journal = {arXiv preprint arXiv:2401.06121},
  year    = {2024}
}
"""

_DESCRIPTION = """\
Forget quality of TOFU (Maini et al., 2024): the p-value of a two-sided two-sample
Kolmogorov-Smirnov test between the per-example truth ratios of the unlearned model on the forget
set (`predictions`) and those of a model trained on the retain set only (`references`, the gold
standard of unlearning), on the same forget questions.

    D = sup_x |F_pred(x) - F_ref(x)|      (F: empirical CDFs of the two samples)
    forget_quality = p-value of D under H0 "same distribution"

A high p-value (1.0 for identical samples) means the unlearned model cannot be told apart from the
retain model; TOFU reads forget quality > 0.05 as successful forgetting. The test is invariant to
strictly monotone transforms of both samples, so truth ratios as false/true or true/false give the
same value.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `float`): per-example forget-set truth ratios of the unlearned model.
    references (`list` of `float`): per-example forget-set truth ratios of the retain model, on the
        same forget questions (same count).
Returns:
    forget_quality (`float`): the two-sided KS-test p-value (scipy.stats.ks_2samp, method "auto").
    ks_statistic (`float`): the KS statistic D.
Examples:
    >>> metric = evaluate.load("evaluate_metrics/tofu_forget_quality")
    >>> metric.compute(predictions=[0.5, 0.7, 0.9], references=[0.5, 0.7, 0.9])
    {'forget_quality': 1.0, 'ks_statistic': 0.0}
"""


def ks_forget_quality(predictions: list[float], references: list[float]) -> tuple[float, float]:
    """(p-value, D) of the two-sided two-sample KS test of ``predictions`` vs ``references``."""
    if not predictions or not references:
        raise ValueError("Forget quality needs at least one prediction and one reference truth ratio.")
    values = [float(v) for v in (*predictions, *references)]
    if not all(math.isfinite(v) for v in values):
        raise ValueError("Forget quality got a non-finite truth ratio.")
    result = ks_2samp([float(p) for p in predictions], [float(r) for r in references])
    return float(result.pvalue), float(result.statistic)


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class TofuForgetQuality(evaluate.Metric):
    """TOFU forget quality (two-sample KS test p-value)."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("float64"), "references": datasets.Value("float64")}
            ),
            homepage="https://locuslab.github.io/tofu/",
            reference_urls=["https://arxiv.org/abs/2401.06121", "https://github.com/locuslab/tofu"],
        )

    def _compute(self, predictions, references):
        p_value, statistic = ks_forget_quality(list(predictions), list(references))
        return {"forget_quality": p_value, "ks_statistic": statistic}
