"""ROUGE-L recall of generated answers, as TOFU computes it (rouge-score, Porter stemmer on)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache


@lru_cache(maxsize=1)
def _rouge_l_scorer():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def rouge_l_recall(predictions: Sequence[str], references: Sequence[str]) -> list[float]:
    """ROUGE-L recall of each prediction against its reference: ``LCS(prediction, reference) / len(reference)``
    over rouge-score's lower-cased, stemmed word tokens (``RougeScorer(["rougeL"], use_stemmer=True)``, as in
    TOFU); an empty reference scores 0."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references.")
    scorer = _rouge_l_scorer()
    return [float(scorer.score(ref, pred)["rougeL"].recall) for pred, ref in zip(predictions, references)]


def mu_rouge(retain_rouge_l: float, real_authors_rouge_l: float, world_facts_rouge_l: float) -> float:
    """MU-ROUGE (T3's utility figure): the harmonic mean of the three mean ROUGE-L recalls,

        MU-ROUGE = 3 / (1/R_retain + 1/R_real_authors + 1/R_world_facts),   0 if any is 0.
    """
    values = [float(retain_rouge_l), float(real_authors_rouge_l), float(world_facts_rouge_l)]
    if any(v < 0 for v in values):
        raise ValueError(f"ROUGE-L recalls are non-negative, got {values}.")
    return 0.0 if 0 in values else len(values) / sum(1.0 / v for v in values)
