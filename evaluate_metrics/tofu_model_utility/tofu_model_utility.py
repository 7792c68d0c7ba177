"""TOFU model utility: harmonic mean of the nine retain / real-authors / world-facts scores.

Standalone `evaluate` metric module (no hf_unlearn import), Hub-Space ready. See README.md.
"""

from __future__ import annotations

import math

import datasets
import evaluate

_CITATION = """\
@article{maini2024tofu,
  title   = {TOFU: A Task of Fictitious Unlearning for LLMs},
  author  = {Maini, Pratyush and Feng, Zhili and Schwarzschild, Avi and Lipton, Zachary C. and Kolter, J. Zico},
  journal = {arXiv preprint arXiv:2401.06121},
  year    = {2024}
}
"""

_DESCRIPTION = """\
Model utility of TOFU (Maini et al., 2024): the harmonic mean of nine scores, the answer
probability, ROUGE-L recall and truth ratio (`true_better` aggregate) on each of the retain set,
the real-authors set and the world-facts set:

    model_utility = n / sum_i (1 / s_i)        (n = 9 in TOFU; 0 when any s_i is 0)

The harmonic mean is dominated by the worst score, so an unlearning method cannot buy a high model
utility on one set with a collapse on another.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `float`): the component scores, each in [0, 1]; TOFU uses nine
        (retain / real authors / world facts x probability, ROUGE-L recall, truth ratio).
Returns:
    model_utility (`float`): their harmonic mean (0 if any score is 0).
Examples:
    >>> metric = evaluate.load("evaluate_metrics/tofu_model_utility")
    >>> metric.compute(predictions=[0.5] * 8 + [0.25])["model_utility"]
    0.45
"""


def harmonic_mean(scores: list[float]) -> float:
    """n / sum_i (1 / s_i), and 0 when any score is 0."""
    if not scores:
        raise ValueError("Model utility needs at least one component score.")
    values = [float(s) for s in scores]
    if not all(math.isfinite(v) and v >= 0 for v in values):
        raise ValueError(f"Model utility components must be finite and non-negative, got {values}.")
    if any(v == 0 for v in values):
        return 0.0
    return len(values) / sum(1.0 / v for v in values)


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class TofuModelUtility(evaluate.Metric):
    """TOFU model utility (harmonic mean of the component scores)."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("float64")}),
            homepage="https://locuslab.github.io/tofu/",
            reference_urls=["https://arxiv.org/abs/2401.06121", "https://github.com/locuslab/tofu"],
        )

    def _compute(self, predictions):
        return {"model_utility": harmonic_mean(list(predictions))}
