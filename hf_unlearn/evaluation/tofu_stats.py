"""The TOFU statistics of one evaluation split (losses, probability, truth ratio, ROUGE-L; formulas in
:mod:`.tofu`), and the forget split's memorization and membership-inference figures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..data import (
    FORGET_SPLITS,
    HOLDOUT_FOR_FORGET,
    PromptTemplate,
    model_max_positions,
    resolve_template,
    tokenize_qa,
)
from ..logprobs import AnswerTokenStatistics, TokenScorer, answer_nll, multi_answer_nll
from . import metrics
from .generation import DEFAULT_MAX_NEW_TOKENS, generate_answers
from .memorization import exact_memorization, extraction_strength
from .privacy import (
    MIA_ATTACKS,
    MIN_K_FRACTION,
    loss_score,
    mia_auc,
    min_k_plus_plus_score,
    min_k_score,
    privleak,
    zlib_score,
)
from .rouge import rouge_l_recall


@dataclass(frozen=True)
class SplitSpec:
    """One evaluation split: report name, TOFU config, and whether a paraphrased answer is the truth."""

    name: str
    config: str
    paraphrased: bool
    aggregator: str


def evaluation_splits(forget_split: str) -> tuple[SplitSpec, ...]:
    """The four TOFU evaluation splits for ``forget_split`` (``forget01``/``forget05``/``forget10``)."""
    if forget_split not in FORGET_SPLITS:
        raise ValueError(f"Unknown forget split {forget_split!r}; use one of {list(FORGET_SPLITS)}.")
    return (
        SplitSpec("forget", f"{forget_split}_perturbed", True, "closer_to_1_better"),
        SplitSpec("retain", "retain_perturbed", True, "true_better"),
        SplitSpec("real_authors", "real_authors_perturbed", False, "true_better"),
        SplitSpec("world_facts", "world_facts_perturbed", False, "true_better"),
    )


def answer_probability(answer_nll: np.ndarray) -> np.ndarray:
    """Per-token answer probability ``exp(-avg NLL)`` (TOFU's forget/retain probability)."""
    return np.exp(-np.asarray(answer_nll, dtype=np.float64))


def normalized_answer_probability(answer_nll: np.ndarray, perturbed_nll: Sequence[np.ndarray]) -> np.ndarray:
    """``p_true / (p_true + sum_j p_false_j)`` with ``p = exp(-avg NLL)`` (real authors, world facts).

    Computed in log space: ``exp(-l - logsumexp([-l, -f_1, ..., -f_k]))``.
    """
    out = np.empty(len(answer_nll), dtype=np.float64)
    for i, (true, false) in enumerate(zip(answer_nll, perturbed_nll)):
        logits = -np.concatenate([[true], np.asarray(false, dtype=np.float64)])
        top = logits.max()
        out[i] = np.exp(logits[0] - top - np.log(np.exp(logits - top).sum()))
    return out


def evaluate_split(
    model: Any, tokenizer: Any, rows: Sequence[Mapping[str, Any]], spec: SplitSpec, *,
    scorer: TokenScorer | None = None, generation_kwargs: Mapping[str, Any] | None = None,
    batch_size: int = 16, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    template: str | PromptTemplate | None = None, answer_nll_values: np.ndarray | None = None,
    progress: bool = True, generate: bool = True,
) -> dict[str, Any]:
    """TOFU statistics of one split: aggregates and per-example values (see the module docstring).

    ``answer_nll_values`` (the answers' average NLLs, when already computed) skips scoring the answers again.
    ``generate=False`` scores only (probabilities and truth ratios, the inputs of forget quality): no greedy
    answers, ``rouge_l`` and the generations are ``None``.
    """
    template = resolve_template(tokenizer, template)
    questions = [r["question"] for r in rows]
    answers = [r["answer"] for r in rows]
    perturbed = [list(r["perturbed_answer"]) for r in rows]
    if any(len(p) == 0 for p in perturbed):
        raise ValueError(f"Split {spec.config!r} has a row with an empty 'perturbed_answer' list.")
    score = {"scorer": scorer, "batch_size": batch_size, "progress": progress, "template": template}
    if answer_nll_values is None:
        gt_nll = answer_nll(model, tokenizer, questions, answers, desc=f"{spec.name}: answers", **score)
    else:
        gt_nll = np.asarray(answer_nll_values, dtype=np.float64)
    false_nll = multi_answer_nll(model, tokenizer, questions, perturbed, desc=f"{spec.name}: perturbed", **score)
    if spec.paraphrased:  # the truth is the paraphrased answer; probability exp(-avg NLL)
        paraphrased = [r["paraphrased_answer"] for r in rows]
        true_nll = answer_nll(model, tokenizer, questions, paraphrased, desc=f"{spec.name}: paraphrased", **score)
        probs = answer_probability(gt_nll)
    else:
        true_nll = gt_nll
        probs = normalized_answer_probability(gt_nll, false_nll)
    tr = metrics.truth_ratio(true_nll, false_nll, spec.aggregator)
    generations = generate_answers(
        model, tokenizer, questions, batch_size=batch_size, max_new_tokens=max_new_tokens,
        generation_kwargs=generation_kwargs, template=template, progress=progress, desc=f"{spec.name}: generating",
    ) if generate else None
    rouge = rouge_l_recall(generations, answers) if generate else None
    num_truncated, limit = 0, model_max_positions(model)  # scored sequences longer than the model's positions
    if limit is not None:
        texts = answers + [a for p in perturbed for a in p] + (paraphrased if spec.paraphrased else [])
        qs = questions + [q for q, p in zip(questions, perturbed) for _ in p] + (questions if spec.paraphrased else [])
        num_truncated = sum(len(tokenize_qa(tokenizer, q, a, template=template)["input_ids"]) > limit
                            for q, a in zip(qs, texts))
    return {
        "config": spec.config, "num_examples": len(rows), "prob": float(np.mean(probs)),
        "rouge_l": float(np.mean(rouge)) if generate else None, "truth_ratio": float(tr["truth_ratio"]),
        "truth_ratio_aggregator": spec.aggregator,
        "num_truncated": num_truncated,
        "per_example": {
            "answer_nll": [float(v) for v in gt_nll], "true_nll": [float(v) for v in true_nll],
            "perturbed_nll": [[float(v) for v in f] for f in false_nll], "prob": [float(v) for v in probs],
            "truth_ratio": [float(v) for v in tr["truth_ratios"]], "rouge_l": rouge, "generation": generations,
        },
    }


def mia_scores(
    stats: AnswerTokenStatistics, tokenizer: Any, k: float = MIN_K_FRACTION
) -> dict[str, list[float] | None]:
    """Per-example attack scores (loss-like: higher = less likely a member) for each attack in ``MIA_ATTACKS``:
    loss, zlib (on the decoded answer tokens, special tokens dropped, as open-unlearning), Min-K% and Min-K%++
    (``None`` without full-vocabulary statistics, i.e. under a custom scorer)."""
    texts = [tokenizer.decode([int(t) for t in ids], skip_special_tokens=True) for ids in stats.token_ids]
    out: dict[str, list[float] | None] = {
        "loss": [loss_score(lp) for lp in stats.token_log_probs],
        "zlib": [zlib_score(lp, text) for lp, text in zip(stats.token_log_probs, texts)],
        "min_k": [min_k_score(lp, k) for lp in stats.token_log_probs], "min_k_plus_plus": None,
    }
    if stats.vocab_mean is not None and stats.vocab_var is not None:
        out["min_k_plus_plus"] = [
            min_k_plus_plus_score(lp, mu, var, k)
            for lp, mu, var in zip(stats.token_log_probs, stats.vocab_mean, stats.vocab_var)
        ]
    return out


def forget_memorization(
    forget_stats: AnswerTokenStatistics, forget_split: dict[str, Any]
) -> tuple[float | None, float | None]:
    """Verbatim memorization of the forget answers (teacher-forced greedy agreement): the mean extraction
    strength and exact memorization, ``(None, None)`` without greedy agreement (under a custom scorer). The
    per-example values are added to ``forget_split["per_example"]``."""
    if forget_stats.greedy_correct is None:
        return None, None
    es_values = [extraction_strength(g) for g in forget_stats.greedy_correct]
    em_values = [exact_memorization(g) for g in forget_stats.greedy_correct]
    forget_split["per_example"]["extraction_strength"] = es_values
    forget_split["per_example"]["exact_memorization"] = em_values
    return float(np.mean(es_values)), float(np.mean(em_values))


def mia_figures(
    forget_stats: AnswerTokenStatistics, holdout_stats: AnswerTokenStatistics | None, tokenizer: Any,
    forget_split: str, reference_auc: Mapping[str, float | None] | None,
) -> tuple[dict[str, Any] | None, dict[str, float | None], dict[str, float | None]]:
    """Membership inference of the forget answers (label 0) against the holdout answers (label 1): ``(details,
    AUC per attack, privleak per attack)``, the privleak ``(AUC - AUC_ref) / AUC_ref * 100`` against the retain
    model's ``reference_auc``. Without holdout statistics: ``None`` and ``None`` figures."""
    aucs: dict[str, float | None] = dict.fromkeys(MIA_ATTACKS)
    leak: dict[str, float | None] = dict.fromkeys(MIA_ATTACKS)
    if holdout_stats is None:
        return None, aucs, leak
    ref_aucs = reference_auc or {}
    forget_scores = mia_scores(forget_stats, tokenizer)
    holdout_scores = mia_scores(holdout_stats, tokenizer)
    for attack in MIA_ATTACKS:
        if forget_scores[attack] is not None and holdout_scores[attack] is not None:
            aucs[attack] = mia_auc(forget_scores[attack], holdout_scores[attack])
            leak[attack] = privleak(aucs[attack], ref_aucs.get(attack))
    mia = {
        "holdout_split": HOLDOUT_FOR_FORGET[forget_split], "num_forget": len(forget_stats.token_log_probs),
        "num_holdout": len(holdout_stats.token_log_probs), "k": MIN_K_FRACTION, "auc": aucs, "privleak": leak,
        "reference_auc": {a: ref_aucs.get(a) for a in MIA_ATTACKS},
        "per_example": {"forget": forget_scores, "holdout": holdout_scores},
    }
    return mia, aucs, leak
