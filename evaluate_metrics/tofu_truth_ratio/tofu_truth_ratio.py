"""TOFU truth ratio: how much more likely a model finds the correct answer than wrong ones.

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
The truth ratio of TOFU (Maini et al., 2024). For each question, the average per-token negative
log-likelihood (loss) of a correct answer (TOFU uses the paraphrased answer on the forget and retain
sets and the answer itself on real authors / world facts) is compared with the losses of several
perturbed, wrong answers:

    tr_i = exp(true_loss_i - mean_j false_loss_ij)
         = P(false)^(1/|false|) / P(true)   (per-token, geometric mean over the false answers)

tr < 1 means the model prefers the correct answer. Two aggregates are used by TOFU:
`closer_to_1_better` = mean_i min(tr_i, 1/tr_i) (forget set: a model that never saw the data is
indifferent, tr ~ 1), and `true_better` = mean_i max(0, 1 - tr_i) (retain, real authors, world facts).
"""

_KWARGS_DESCRIPTION = """
Args:
    true_losses (`list` of `float`): average per-token NLL of the correct answer, one per question.
    false_losses (`list` of `list` of `float`): average per-token NLLs of the perturbed answers,
        one non-empty list per question.
    aggregator (`str`): "closer_to_1_better" (default, forget set) or "true_better".
Returns:
    truth_ratio (`float`): the aggregate chosen by `aggregator`.
    truth_ratios (`list` of `float`): the per-question ratios tr_i.
Examples:
    >>> metric = evaluate.load("evaluate_metrics/tofu_truth_ratio")
    >>> out = metric.compute(true_losses=[1.0], false_losses=[[1.0, 3.0]], aggregator="true_better")
    >>> round(out["truth_ratios"][0], 4), round(out["truth_ratio"], 4)
    (0.3679, 0.6321)
"""

AGGREGATORS = ("closer_to_1_better", "true_better")


def per_example_truth_ratios(true_losses: list[float], false_losses: list[list[float]]) -> list[float]:
    """tr_i = exp(true_loss_i - mean_j false_loss_ij) for each question i."""
    if len(true_losses) != len(false_losses):
        raise ValueError(f"{len(true_losses)} true losses but {len(false_losses)} lists of false losses.")
    if not true_losses:
        raise ValueError("The truth ratio needs at least one example.")
    ratios = []
    for i, (true, false) in enumerate(zip(true_losses, false_losses)):
        if len(false) == 0:
            raise ValueError(f"Example {i} has no false (perturbed) losses.")
        values = [float(true), *(float(f) for f in false)]
        if not all(math.isfinite(v) for v in values):
            raise ValueError(f"Example {i} has a non-finite loss: true={true}, false={list(false)}.")
        ratios.append(math.exp(float(true) - sum(float(f) for f in false) / len(false)))
    return ratios


def aggregate_truth_ratios(ratios: list[float], aggregator: str) -> float:
    """`closer_to_1_better`: mean min(tr, 1/tr); `true_better`: mean max(0, 1 - tr)."""
    if aggregator == "closer_to_1_better":
        scores = [min(r, 1.0 / r) if r > 0 else 0.0 for r in ratios]
    elif aggregator == "true_better":
        scores = [max(0.0, 1.0 - r) for r in ratios]
    else:
        raise ValueError(f"Unknown aggregator {aggregator!r}; use one of {list(AGGREGATORS)}.")
    return sum(scores) / len(scores)


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class TofuTruthRatio(evaluate.Metric):
    """TOFU truth ratio (per example and aggregated)."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "true_losses": datasets.Value("float64"),
                    "false_losses": datasets.Sequence(datasets.Value("float64")),
                }
            ),
            homepage="https://locuslab.github.io/tofu/",
            reference_urls=["https://arxiv.org/abs/2401.06121", "https://github.com/locuslab/tofu"],
        )

    def _compute(self, true_losses, false_losses, aggregator: str = "closer_to_1_better"):
        if aggregator not in AGGREGATORS:
            raise ValueError(f"Unknown aggregator {aggregator!r}; use one of {list(AGGREGATORS)}.")
        ratios = per_example_truth_ratios(list(true_losses), [list(f) for f in false_losses])
        return {"truth_ratio": aggregate_truth_ratios(ratios, aggregator), "truth_ratios": ratios}
