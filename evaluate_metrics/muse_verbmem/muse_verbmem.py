"""MUSE VerbMem: ROUGE-L F1 of a model's greedy continuations of forget-text prompts against the true continuations.

Standalone `evaluate` metric module (no hf_unlearn import), Hub-Space ready. See README.md.
"""

from __future__ import annotations

import datasets
import evaluate
from rouge_score import rouge_scorer

_CITATION = """\
@article{shi2024muse,
  title   = {MUSE: Machine Unlearning Six-Way Evaluation for Language Models},
  author  = {Shi, Weijia and Lee, Jaechan and Huang, Yangsibo and Malladi, Sadhika and Zhao, Jieyu and
             Holtzman, Ari and Liu, Daogao and Zettlemoyer, Luke and Smith, Noah A. and Zhang, Chiyuan},
  journal = {arXiv preprint arXiv:2407.06460},
  year    = {2024}
}
"""

_DESCRIPTION = """\
Verbatim memorisation (MUSE's C1, VerbMem on the forget set). Each prompt is the beginning of a forget
document; the model continues it greedily for 128 new tokens and the continuation is compared with the
document's true continuation cut to its first 128 tokens:

    VerbMem = 100 * (1/n) sum_i ROUGE-L F1(continuation_i, truth_i)

with rouge-score's ROUGE-L (longest common subsequence of lower-cased word tokens, no stemming, as MUSE's
evaluation). A model that memorised the forget documents scores high; MUSE's retrained News model scores
about 20, its target about 58 (Llama-2 7B).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `str`): the model's continuations (the new tokens only, decoded).
    references (`list` of `str`): the true continuations, cut to the same number of tokens.
Returns:
    verbmem (`float`): 100 times the mean ROUGE-L F1 (MUSE's table figure).
    rouge_l_f1 (`float`): the mean ROUGE-L F1, in [0, 1].
    rouge_l_f1_per_example (`list` of `float`): the F1 of each continuation.
Examples:
    >>> metric = evaluate.load("evaluate_metrics/muse_verbmem")
    >>> metric.compute(predictions=["the cat sat on the mat"], references=["the cat sat on a mat"])["verbmem"]
    83.33333333333334
"""


def rouge_l_f1(predictions: list[str], references: list[str]) -> list[float]:
    """ROUGE-L F1 of each prediction against its reference: with ``L = LCS(prediction, reference)`` over
    rouge-score's lower-cased word tokens, ``P = L / |prediction|``, ``R = L / |reference|``,
    ``F1 = 2 P R / (P + R)`` (0 when either side has no token); ``RougeScorer(["rougeL"], use_stemmer=False)``."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references.")
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)
    return [float(scorer.score(ref, pred)["rougeL"].fmeasure) for pred, ref in zip(predictions, references)]


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class MuseVerbmem(evaluate.Metric):
    """MUSE VerbMem: ROUGE-L F1 of greedy continuations against the true continuations."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
            homepage="https://muse-bench.github.io",
            reference_urls=["https://arxiv.org/abs/2407.06460", "https://github.com/swj0419/muse_bench"],
        )

    def _compute(self, predictions, references):
        if not predictions:
            raise ValueError("VerbMem needs at least one continuation.")
        scores = rouge_l_f1(list(predictions), list(references))
        mean = sum(scores) / len(scores)
        return {"verbmem": 100.0 * mean, "rouge_l_f1": mean, "rouge_l_f1_per_example": scores}
