"""ROUGE-L recall of generated answers, as TOFU computes it (rouge-score, Porter stemmer on)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache


@lru_cache(maxsize=1)
def _rouge_l_scorer():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def rouge_l_recall(predictions: Sequence[str], references: Sequence[str]) -> list[float]:
    """ROUGE-L recall of each prediction against its reference.

    recall = LCS(prediction, reference) / len(reference), over rouge-score's lower-cased,
    stemmed word tokens (``RougeScorer(["rougeL"], use_stemmer=True)``, as in TOFU). An empty
    reference scores 0.
    """
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references.")
    scorer = _rouge_l_scorer()
    return [float(scorer.score(ref, pred)["rougeL"].recall) for pred, ref in zip(predictions, references)]
