"""Answer log-likelihoods. A *token scorer* maps a padded batch to per-token log-probabilities of the labels::

    scorer(input_ids, attention_mask, position_ids, labels) -> Tensor[B, L]
    out[b, t] = log p(labels[b, t] | input_ids[b, :t])    (0 where labels[b, t] == -100)"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from .data.prompts import (
    IGNORE_INDEX,
    PromptTemplate,
    collate_qa,
    ensure_pad_token,
    model_max_positions,
    tokenize_qa,
)
from .devices import device_of

TokenScorer = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def answer_mask(labels: torch.Tensor) -> torch.Tensor:
    """The scored tokens, ``[B, L]``: ``labels[b, t] != -100 and t >= 1`` (position 0 has no context)."""
    mask = labels != IGNORE_INDEX
    mask[:, 0] = False
    return mask


#: The most logits elements (positions x vocabulary) :func:`label_log_probs` upcasts to float32 at once when the
#: logits are half precision (256 MiB of float32).
UPCAST_CHUNK_ELEMENTS = 2**26


def label_log_probs(logits: torch.Tensor, labels: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """Per-token ``log softmax(logits)[label]``, ``[B, L]`` float32::

        out[:, t] = logits[:, t-1, y_t] - logsumexp_v logits[:, t-1, v]    (y_t = labels[:, t])

    on the positions of :func:`answer_mask`, 0 elsewhere; half-precision logits are upcast ``chunk_size`` positions at
    a time (same numbers, bounded memory)."""
    targets = labels[:, 1:]
    valid = answer_mask(labels)[:, 1:]
    safe = targets.masked_fill(~valid, 0)
    shifted = logits[:, :-1, :]
    steps = shifted.shape[1]
    if chunk_size is None:
        wide = shifted.element_size() >= 4  # float32 (kept) or float64 (its float32 copy is smaller)
        chunk_size = steps if wide else UPCAST_CHUNK_ELEMENTS // max(1, shifted.shape[0] * shifted.shape[2])
    chunk_size = max(1, min(int(chunk_size), steps))
    parts = []
    for start in range(0, max(steps, 1), chunk_size):
        part = shifted[:, start : start + chunk_size].float()
        gathered = part.gather(-1, safe[:, start : start + chunk_size].unsqueeze(-1)).squeeze(-1)
        parts.append(gathered - torch.logsumexp(part, dim=-1))
    picked = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    out = torch.zeros(labels.shape, dtype=picked.dtype, device=picked.device)
    out[:, 1:] = picked * valid
    return out


def causal_lm_scorer(model: Any) -> TokenScorer:
    """The token scorer of a causal LM: teacher-forced ``log p_model(label)`` per token."""

    def scorer(input_ids, attention_mask, position_ids, labels):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        return label_log_probs(logits, labels)

    return scorer


@dataclass
class AnswerLogLikelihoods:
    """Per example: the sum of answer-token log-probabilities and the answer-token count."""

    sum_log_prob: np.ndarray
    num_tokens: np.ndarray

    @property
    def avg_nll(self) -> np.ndarray:
        """``-sum_log_prob / num_tokens`` per answer."""
        return -self.sum_log_prob / np.maximum(self.num_tokens, 1)


def model_device(model: Any) -> torch.device:
    """The device of the model's first parameter (CPU without parameters)."""
    return torch.device(device_of(model))


@contextlib.contextmanager
def eval_mode(model: Any) -> Iterator[None]:
    """``model.eval()`` for the block, restoring training mode after."""
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    try:
        yield
    finally:
        if was_training and hasattr(model, "train"):
            model.train()


def effective_max_length(model: Any, max_length: int | None = None) -> int | None:
    """``max_length`` capped by the model's maximum positions (or whichever is known)."""
    limit = model_max_positions(model)
    if max_length is None:
        return limit
    if max_length < 2:
        raise ValueError(f"max_length must be >= 2 (one prompt and one answer token), got {max_length}.")
    return max_length if limit is None else min(max_length, limit)


def _features(
    model: Any, tokenizer: Any, questions: Sequence[str], answers: Sequence[str], max_length: int | None,
    template: str | PromptTemplate | None,
) -> tuple[list[dict[str, Any]], int]:
    """``tokenize_qa`` features (truncated to the model's positions) and how many were truncated."""
    if len(questions) != len(answers):
        raise ValueError(f"{len(questions)} questions but {len(answers)} answers.")
    limit = effective_max_length(model, max_length)
    features, truncated = [], 0
    for q, a in zip(questions, answers):
        f = tokenize_qa(tokenizer, q, a, template=template)
        if limit is not None and len(f["input_ids"]) > limit:
            f = tokenize_qa(tokenizer, q, a, max_length=limit, template=template)
            truncated += 1
        features.append(f)
    return features, truncated


def _batches(features: list[dict[str, Any]], batch_size: int, progress: bool, desc: str):
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
    order = sorted(range(len(features)), key=lambda i: len(features[i]["input_ids"]))
    for start in tqdm(range(0, len(order), batch_size), desc=desc, disable=not progress, leave=False):
        yield order[start : start + batch_size]


@torch.no_grad()
def answer_log_likelihoods(
    model: Any, tokenizer: Any, questions: Sequence[str], answers: Sequence[str], *,
    scorer: TokenScorer | None = None, batch_size: int = 16, padding_side: str = "right",
    max_length: int | None = None, template: str | PromptTemplate | None = None, progress: bool = False,
    desc: str = "scoring answers",
) -> AnswerLogLikelihoods:
    """Teacher-forced log-likelihood of each answer given its question (``tokenize_qa`` with
    ``template``, truncated to ``max_length`` capped by the model's positions), batched by length, scored by
    ``scorer`` (default :func:`causal_lm_scorer`)."""
    ensure_pad_token(tokenizer)
    features, _ = _features(model, tokenizer, questions, answers, max_length, template)
    scorer = scorer or causal_lm_scorer(model)
    device = model_device(model)
    sums = np.zeros(len(features), dtype=np.float64)
    counts = np.zeros(len(features), dtype=np.int64)
    with eval_mode(model):
        for idx in _batches(features, batch_size, progress, desc):
            batch = collate_qa([features[i] for i in idx], tokenizer.pad_token_id, padding_side)
            counts[idx] = answer_mask(batch["labels"]).sum(-1).numpy()  # on the host, before the batch moves
            batch = {k: v.to(device) for k, v in batch.items()}
            lp = scorer(batch["input_ids"], batch["attention_mask"], batch["position_ids"], batch["labels"])
            sums[idx] = lp.double().sum(-1).cpu().numpy()  # the batch's one copy to the host
    return AnswerLogLikelihoods(sums, counts)


@dataclass
class AnswerTokenStatistics:
    """Per-token statistics of each answer (answer tokens in order):

    * ``token_log_probs[i][t] = log p(y_t | x, y_<t)``; ``greedy_correct[i][t] = [argmax_v p(v) == y_t]``;
    * ``vocab_mean[i][t] = mu_t = sum_v p(v) log p(v)``, ``vocab_var[i][t] = sum_v p(v) log^2 p(v) - mu_t^2``.

    The last three need the full distribution: ``None`` under a custom scorer."""

    token_ids: list[np.ndarray]
    token_log_probs: list[np.ndarray]
    greedy_correct: list[np.ndarray] | None
    vocab_mean: list[np.ndarray] | None
    vocab_var: list[np.ndarray] | None
    num_truncated: int = 0

    @property
    def avg_nll(self) -> np.ndarray:
        """Average per-token NLL of each answer."""
        return np.array([-lp.sum() / max(len(lp), 1) for lp in self.token_log_probs], dtype=np.float64)


def vocab_statistics(logits: torch.Tensor, labels: torch.Tensor, chunk_size: int = 1024) -> dict[str, torch.Tensor]:
    """Next-token statistics aligned with ``labels`` as in :func:`label_log_probs`: ``{"log_prob",
    "greedy_correct", "mean": sum_v p log p, "var": sum_v p (log p)^2 - mean^2}``, each ``[B, L]`` float32 (0 / False
    off the answer positions), ``chunk_size`` positions at a time."""
    targets = labels[:, 1:]
    valid = answer_mask(labels)[:, 1:]
    rows = logits[:, :-1, :][valid]  # [N, V], the answer positions only
    picked = targets[valid]
    parts: dict[str, list[torch.Tensor]] = {"log_prob": [], "greedy_correct": [], "mean": [], "var": []}
    for start in range(0, rows.shape[0], chunk_size):
        logp = torch.log_softmax(rows[start : start + chunk_size].float(), dim=-1)
        p = logp.exp()
        plogp = torch.where(p > 0, p * logp, torch.zeros_like(p))
        mean = plogp.sum(-1)
        parts["log_prob"].append(logp.gather(-1, picked[start : start + chunk_size, None]).squeeze(-1))
        parts["greedy_correct"].append(logp.argmax(-1) == picked[start : start + chunk_size])
        parts["mean"].append(mean)
        parts["var"].append((plogp * logp).sum(-1) - mean.square())
    out = {}
    for key, chunks in parts.items():
        dtype = torch.bool if key == "greedy_correct" else torch.float32
        full = torch.zeros(labels.shape, dtype=dtype, device=labels.device)
        if chunks:
            full[:, 1:][valid] = torch.cat(chunks).to(dtype)
        out[key] = full
    return out


@torch.no_grad()
def answer_token_statistics(
    model: Any, tokenizer: Any, questions: Sequence[str], answers: Sequence[str], *,
    scorer: TokenScorer | None = None, batch_size: int = 16, max_length: int | None = None,
    template: str | PromptTemplate | None = None, progress: bool = False, desc: str = "scoring answer tokens",
) -> AnswerTokenStatistics:
    """:class:`AnswerTokenStatistics` in one pass, tokenized as :func:`answer_log_likelihoods`."""
    features, truncated = _features(model, tokenizer, questions, answers, max_length, template)
    return feature_token_statistics(model, tokenizer, features, scorer=scorer, batch_size=batch_size,
                                    progress=progress, desc=desc, num_truncated=truncated)


@torch.no_grad()
def feature_token_statistics(
    model: Any, tokenizer: Any, features: Sequence[Mapping[str, Any]], *, scorer: TokenScorer | None = None,
    batch_size: int = 16, progress: bool = False, desc: str = "scoring tokens", num_truncated: int = 0,
) -> AnswerTokenStatistics:
    """:class:`AnswerTokenStatistics` of tokenized examples (``input_ids`` and ``labels``)."""
    ensure_pad_token(tokenizer)
    features = [{"input_ids": list(f["input_ids"]), "labels": list(f["labels"])} for f in features]
    device = model_device(model)
    ids, lps, greedy, means, variances = ([np.zeros(0, dtype=d)] * len(features)
                                          for d in (np.int64, np.float64, bool, np.float64, np.float64))
    with eval_mode(model):
        for idx in _batches(features, batch_size, progress, desc):
            batch = collate_qa([features[i] for i in idx], tokenizer.pad_token_id, "right")
            host_ids, mask = batch["input_ids"], answer_mask(batch["labels"])  # on the host, before the batch moves
            batch = {k: v.to(device) for k, v in batch.items()}
            if scorer is None:
                logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                               position_ids=batch["position_ids"]).logits
                stats = vocab_statistics(logits, batch["labels"])
                lp = stats["log_prob"]
            else:
                stats = None
                lp = scorer(batch["input_ids"], batch["attention_mask"], batch["position_ids"], batch["labels"])
            # the batch's figures go to the host in one copy: [lp] or [lp, mean, var, greedy], float64
            columns = [lp] if stats is None else [lp, stats["mean"], stats["var"], stats["greedy_correct"]]
            host = torch.stack([c.double() for c in columns]).cpu().numpy()
            for row, i in enumerate(idx):
                m = mask[row].numpy()
                ids[i] = host_ids[row].numpy()[m]
                lps[i] = host[0, row][m]
                if stats is not None:
                    means[i], variances[i] = host[1, row][m], host[2, row][m]
                    greedy[i] = host[3, row][m] != 0
    full = scorer is None
    return AnswerTokenStatistics(ids, lps, greedy if full else None, means if full else None,
                                 variances if full else None, num_truncated)


def answer_nll(model: Any, tokenizer: Any, questions: Sequence[str], answers: Sequence[str], **kwargs) -> np.ndarray:
    """Average per-token answer NLL of each (question, answer)."""
    return answer_log_likelihoods(model, tokenizer, questions, answers, **kwargs).avg_nll


def mean_answer_nll(model: Any, tokenizer: Any, rows: Sequence[Mapping[str, Any]], **kwargs) -> float:
    """Mean over ``rows`` of each answer's average per-token NLL."""
    return float(answer_nll(model, tokenizer, [r["question"] for r in rows], [r["answer"] for r in rows], **kwargs).mean())


def multi_answer_nll(
    model: Any, tokenizer: Any, questions: Sequence[str], answer_lists: Sequence[Sequence[str]], **kwargs
) -> list[np.ndarray]:
    """Average answer NLL for several answers per question, in one pass; one array per question."""
    flat_q = [q for q, answers in zip(questions, answer_lists) for _ in answers]
    flat_a = [a for answers in answer_lists for a in answers]
    flat = answer_nll(model, tokenizer, flat_q, flat_a, **kwargs)
    ends = np.cumsum([0, *map(len, answer_lists)])
    return [flat[start:end] for start, end in zip(ends[:-1], ends[1:])]
