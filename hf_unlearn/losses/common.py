"""Shared pieces of every unlearning objective: the answer mask, sequence log-probabilities, the NLL and the
KL retain terms. Conventions: see :mod:`hf_unlearn.losses`.
"""

from __future__ import annotations

import torch

from ..data.prompts import IGNORE_INDEX


def answer_mask(labels: torch.Tensor) -> torch.Tensor:
    """Boolean ``[B, L]`` mask of the label positions that :func:`~hf_unlearn.logprobs.label_log_probs` scores.

    ``labels[b, t] != -100`` for ``t >= 1`` (position 0 has no context and is never scored).
    """
    mask = labels != IGNORE_INDEX
    mask[:, 0] = False
    return mask


def _denominator(value: torch.Tensor | float | int | None, default: torch.Tensor) -> torch.Tensor:
    if value is None:
        value = default
    return torch.as_tensor(value, dtype=torch.float32, device=default.device).clamp(min=1.0)


def sequence_log_probs(token_log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Answer log-likelihood of each sequence, ``log pi(y | x) = sum_t mask_t * log pi(y_t | x, y_<t)`` -> ``[B]``."""
    return (token_log_probs * mask).sum(-1)


def nll_loss(
    token_log_probs: torch.Tensor, mask: torch.Tensor, num_tokens: torch.Tensor | float | None = None
) -> torch.Tensor:
    """Token-averaged negative log-likelihood (the usual fine-tuning loss, used on the retain set).

    ``L_NLL = -(1/N) * sum_{b,t} mask_{b,t} * log pi_theta(y_{b,t} | x_b, y_{b,<t})`` with ``N = num_tokens``
    (default: the number of answer tokens in the batch).
    """
    return -(token_log_probs * mask).sum() / _denominator(num_tokens, mask.sum())


def kl_retain_loss(
    logits: torch.Tensor,
    ref_logits: torch.Tensor,
    labels: torch.Tensor,
    num_tokens: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Per-token ``KL(pi_ref || pi_theta)`` averaged over answer tokens (retain regulariser).

    ``L_KL = (1/N) * sum_{b,t} mask_{b,t} * sum_v pi_ref(v | ctx_{b,t}) * (log pi_ref(v | ctx) - log pi_theta(v | ctx))``

    ``logits`` / ``ref_logits`` are the ``[B, L, V]`` outputs of the trained and the frozen reference model on the
    same inputs; the distribution at position ``t - 1`` is the one that predicts ``labels[:, t]`` (same shift as
    :func:`~hf_unlearn.logprobs.label_log_probs`), and only positions predicting an answer token count. The
    direction (reference first) matches the forward KL used by TOFU's "KL" baseline and open-unlearning.
    """
    mask = answer_mask(labels)[:, 1:]
    log_p = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    log_ref = torch.log_softmax(ref_logits[:, :-1].float(), dim=-1)
    per_token = (log_ref.exp() * (log_ref - log_p)).sum(-1)
    return (per_token * mask).sum() / _denominator(num_tokens, mask.sum())
