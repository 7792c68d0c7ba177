"""MUSE PrivLeak: the Min-40% membership-inference AUC of forget vs holdout texts, relative to a retrained model's.

Standalone `evaluate` metric module (no hf_unlearn import), Hub-Space ready. See README.md.
"""

from __future__ import annotations

import math

import datasets
import evaluate
import numpy as np
from scipy.stats import rankdata

_CITATION = """\
@article{shi2024muse,
  title   = {MUSE: Machine Unlearning Six-Way Evaluation for Language Models},
  author  = {Shi, Weijia and Lee, Jaechan and Huang, Yangsibo and Malladi, Sadhika and Zhao, Jieyu and
             Holtzman, Ari and Liu, Daogao and Zettlemoyer, Luke and Smith, Noah A. and Zhang, Chiyuan},
  journal = {arXiv preprint arXiv:2407.06460},
  year    = {2024}
}
"""

#: The authors' AUC of their retrained News model (Llama-2 7B), key ``forget_holdout_Min-40%`` of
#: ``AUC_RETRAIN['news']`` in their constants.py.
NEWS_RETRAIN_AUC = 0.47719999999999996

_DESCRIPTION = """\
Privacy leakage (MUSE's C3). Each text gets its Min-40% score s = -(mean of the lowest 40% token
log-probabilities), a loss-like number (lower = more likely seen in training). With the forget texts and the
holdout texts (never seen by any model), MUSE's AUC is that of telling the holdout texts apart by -s:

    AUC = P(s_forget > s_holdout) + 1/2 P(s_forget = s_holdout)
    PrivLeak = (AUC - AUC_retrain) / AUC_retrain * 100

where AUC_retrain is the same AUC for a model retrained without the forget set: by default the authors'
published value for their News retrained model (0.4772), else a retain model's AUC. A target that memorised
the forget texts scores AUC near 0 and PrivLeak near -100; an unlearned model should be near 0; positive values
mean the forget texts look less familiar than never-seen ones (over-unlearning).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `float`): Min-40% scores (or any loss-like attack score) of the texts.
    references (`list` of `int`): 0 for a forget text, 1 for a holdout text (both must occur).
    reference_auc (`float`, optional): the retrained (retain) model's AUC; default the authors' News value 0.4772.
Returns:
    auc (`float`): MUSE's AUC, P(s_forget > s_holdout) with ties counting one half.
    privleak (`float`): (auc - reference_auc) / reference_auc * 100.
    reference_auc (`float`): the reference AUC used.
Examples:
    >>> metric = evaluate.load("evaluate_metrics/muse_privleak")
    >>> metric.compute(predictions=[0.1, 0.2, 0.9, 1.0], references=[0, 0, 1, 1], reference_auc=0.5)
    {'auc': 0.0, 'privleak': -100.0, 'reference_auc': 0.5}
"""


def muse_auc(scores: list[float], labels: list[int]) -> float:
    """``P(s_forget > s_holdout) + 1/2 P(s_forget = s_holdout)`` over all (forget, holdout) pairs, the ROC AUC of
    the holdout texts by ``-s`` (MUSE's ``roc_curve(y, -ppl)``); through average ranks (Mann-Whitney U)."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels)
    if s.size != y.size:
        raise ValueError(f"{s.size} scores but {y.size} labels.")
    if not set(np.unique(y).tolist()) <= {0, 1}:
        raise ValueError("references must be 0 (forget) or 1 (holdout).")
    n_forget, n_holdout = int((y == 0).sum()), int((y == 1).sum())
    if n_forget == 0 or n_holdout == 0:
        raise ValueError("The AUC needs at least one forget (0) and one holdout (1) text.")
    if not np.isfinite(s).all():
        raise ValueError("Got a non-finite score.")
    ranks = rankdata(s)
    u_forget = ranks[y == 0].sum() - n_forget * (n_forget + 1) / 2
    return float(u_forget / (n_forget * n_holdout))


def muse_privleak(auc: float, reference_auc: float | None = None) -> float:
    """``(auc - ref) / ref * 100`` with ``ref = reference_auc`` (default :data:`NEWS_RETRAIN_AUC`)."""
    ref = NEWS_RETRAIN_AUC if reference_auc is None else float(reference_auc)
    if not (math.isfinite(ref) and 0 < ref <= 1):
        raise ValueError(f"PrivLeak needs a reference AUC in (0, 1], got {reference_auc!r}.")
    return float((auc - ref) / ref * 100.0)


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class MusePrivleak(evaluate.Metric):
    """MUSE PrivLeak: the forget-vs-holdout Min-40% AUC relative to a retrained model's AUC."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("float64"), "references": datasets.Value("int32")}),
            homepage="https://muse-bench.github.io",
            reference_urls=["https://arxiv.org/abs/2407.06460", "https://github.com/swj0419/muse_bench"],
        )

    def _compute(self, predictions, references, reference_auc: float | None = None):
        ref = NEWS_RETRAIN_AUC if reference_auc is None else float(reference_auc)
        auc = muse_auc(list(predictions), list(references))
        return {"auc": auc, "privleak": muse_privleak(auc, ref), "reference_auc": ref}
