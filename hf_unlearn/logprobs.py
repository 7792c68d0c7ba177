"""The one place where answer log-likelihoods are computed.

A *token scorer* maps a padded batch to per-token log-probabilities of the labels::

    scorer(input_ids, attention_mask, position_ids, labels) -> Tensor[B, L]
    out[b, t] = log p(labels[b, t] | input_ids[b, :t])    (0 where labels[b, t] == -100)

:func:`causal_lm_scorer` is the plain scorer of a causal LM; other distributions (T3's tempered
and tilted one) provide their own scorer with the same signature, and everything built on
:func:`answer_log_likelihoods` (the TOFU evaluator, benchmarks) works with them unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from .data.prompts import IGNORE_INDEX, collate_qa, ensure_pad_token, tokenize_qa

TokenScorer = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def label_log_probs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token ``log softmax(logits)[label]`` aligned with ``labels`` (next-token shift inside).

    ``logits`` is ``[B, L, V]`` as returned by a causal LM for ``input_ids`` ``[B, L]``;
    the result is ``[B, L]`` with ``out[:, t] = log p(labels[:, t] | tokens < t)`` and 0 where the
    label is ``-100`` (and at ``t = 0``, which has no context).
    """
    shifted = logits[:, :-1, :].float()
    targets = labels[:, 1:]
    valid = targets != IGNORE_INDEX
    safe = targets.masked_fill(~valid, 0)
    picked = shifted.gather(-1, safe.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(shifted, dim=-1)
    out = torch.zeros(labels.shape, dtype=picked.dtype, device=picked.device)
    out[:, 1:] = picked * valid
    return out


def causal_lm_scorer(model: Any) -> TokenScorer:
    """The plain token scorer of a causal LM: teacher-forced ``log p_model(label)`` per token."""

    def scorer(input_ids, attention_mask, position_ids, labels):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        return label_log_probs(logits, labels)

    return scorer


@dataclass
class AnswerLogLikelihoods:
    """Sum of answer-token log-probabilities and answer-token counts, one entry per example."""

    sum_log_prob: np.ndarray
    num_tokens: np.ndarray

    @property
    def avg_nll(self) -> np.ndarray:
        """Average per-token negative log-likelihood of each answer."""
        return -self.sum_log_prob / np.maximum(self.num_tokens, 1)


def _model_device(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration):
        return torch.device("cpu")


@torch.no_grad()
def answer_log_likelihoods(
    model: Any,
    tokenizer: Any,
    questions: Sequence[str],
    answers: Sequence[str],
    *,
    scorer: TokenScorer | None = None,
    batch_size: int = 16,
    padding_side: str = "right",
    max_length: int | None = None,
    progress: bool = False,
    desc: str = "scoring answers",
) -> AnswerLogLikelihoods:
    """Teacher-forced log-likelihood of each ``answer`` given its ``question``.

    Examples are tokenized by :func:`hf_unlearn.data.tokenize_qa` (answer tokens only are
    scored), sorted by length to keep padding small, batched with ``padding_side`` padding and
    explicit position ids (so left and right padding give the same numbers), and scored by
    ``scorer`` (default :func:`causal_lm_scorer` of ``model``).
    """
    if len(questions) != len(answers):
        raise ValueError(f"{len(questions)} questions but {len(answers)} answers.")
    ensure_pad_token(tokenizer)
    scorer = scorer or causal_lm_scorer(model)
    device = _model_device(model)
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    features = [tokenize_qa(tokenizer, q, a, max_length=max_length) for q, a in zip(questions, answers)]
    order = sorted(range(len(features)), key=lambda i: len(features[i]["input_ids"]))
    sums = np.zeros(len(features), dtype=np.float64)
    counts = np.zeros(len(features), dtype=np.int64)
    starts = range(0, len(order), batch_size)
    for start in tqdm(starts, desc=desc, disable=not progress, leave=False):
        idx = order[start : start + batch_size]
        batch = collate_qa([features[i] for i in idx], tokenizer.pad_token_id, padding_side)
        batch = {k: v.to(device) for k, v in batch.items()}
        lp = scorer(batch["input_ids"], batch["attention_mask"], batch["position_ids"], batch["labels"])
        mask = batch["labels"] != IGNORE_INDEX
        mask[:, 0] = False
        sums[idx] = lp.double().sum(-1).cpu().numpy()
        counts[idx] = mask.sum(-1).cpu().numpy()
    if was_training and hasattr(model, "train"):
        model.train()
    return AnswerLogLikelihoods(sums, counts)


def answer_nll(model: Any, tokenizer: Any, questions: Sequence[str], answers: Sequence[str], **kwargs) -> np.ndarray:
    """Average per-token answer NLL for each (question, answer); see :func:`answer_log_likelihoods`."""
    return answer_log_likelihoods(model, tokenizer, questions, answers, **kwargs).avg_nll


def mean_answer_nll(model: Any, tokenizer: Any, rows: Sequence[Mapping[str, Any]], **kwargs) -> float:
    """Mean over ``rows`` (``question``/``answer``) of each answer's average per-token NLL (:func:`answer_nll`)."""
    return float(answer_nll(model, tokenizer, [r["question"] for r in rows], [r["answer"] for r in rows], **kwargs).mean())


def multi_answer_nll(
    model: Any, tokenizer: Any, questions: Sequence[str], answer_lists: Sequence[Sequence[str]], **kwargs
) -> list[np.ndarray]:
    """Average answer NLL for several answers per question (e.g. TOFU's perturbed answers),
    scored in one flattened pass; returns one array per question."""
    flat_q = [q for q, answers in zip(questions, answer_lists) for _ in answers]
    flat_a = [a for answers in answer_lists for a in answers]
    flat = answer_nll(model, tokenizer, flat_q, flat_a, **kwargs)
    out, pos = [], 0
    for answers in answer_lists:
        out.append(flat[pos : pos + len(answers)])
        pos += len(answers)
    return out
