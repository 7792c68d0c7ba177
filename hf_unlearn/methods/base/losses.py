"""Shared pieces of every unlearning objective: the NLL and KL retain terms, what the loss hook receives
(:class:`ScoredBatch`, :class:`LossDenominators`) and the logged values.

Conventions of every method's ``loss.py``: ``token_log_probs[b, t] = log pi(y_t | x, y_<t)`` on answer tokens, 0
elsewhere (:func:`hf_unlearn.logprobs.label_log_probs`); ``mask`` the ``[B, L]`` answer mask; token-level losses
are sums divided by ``num_tokens``, sequence-level ones by ``num_sequences`` (default: the batch's own counts; a
trainer passes a whole accumulation step's totals); every loss is minimised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...logprobs import answer_mask
from .pairing import RETAIN_PREFIX


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
    """Token-averaged negative log-likelihood:
    ``L_NLL = -(1/N) * sum_{b,t} mask_{b,t} * log pi_theta(y_{b,t} | x_b, y_{b,<t})``, ``N = num_tokens``.
    """
    return -(token_log_probs * mask).sum() / _denominator(num_tokens, mask.sum())


def kl_retain_loss(
    logits: torch.Tensor, ref_logits: torch.Tensor, labels: torch.Tensor,
    num_tokens: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Per-token ``KL(pi_ref || pi_theta)`` over the answer tokens (``[B, L, V]`` logits, position ``t - 1``
    predicting ``labels[:, t]``):

    ``L_KL = (1/N) * sum_{b,t} mask_{b,t} * sum_v pi_ref(v | ctx_{b,t}) * (log pi_ref(v | ctx) - log pi_theta(v | ctx))``

    Deviation: open-unlearning's ``compute_kl_divergence`` averages over every position of the padded batch
    (prompt and padding included, divided by batch x length); the package and its benchmark run this
    answer-position mean, which does not change with padding (``docs/methods/grad_diff.md``).
    """
    mask = answer_mask(labels)[:, 1:]
    log_p = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    log_ref = torch.log_softmax(ref_logits[:, :-1].float(), dim=-1)
    per_token = (log_ref.exp() * (log_ref - log_p)).sum(-1)
    return (per_token * mask).sum() / _denominator(num_tokens, mask.sum())


@dataclass
class ScoredBatch:
    """One forward pass over a (forget or retain) batch: ``logits``, ``labels``, ``token_log_probs`` (0 off the
    answer), the answer ``mask`` and the raw model ``outputs``."""

    logits: torch.Tensor
    labels: torch.Tensor
    token_log_probs: torch.Tensor
    mask: torch.Tensor
    outputs: Any = None

    @property
    def sequence_log_probs(self) -> torch.Tensor:
        """``[B]`` answer log-likelihoods ``log p(y | x)``."""
        return sequence_log_probs(self.token_log_probs, self.mask)

    @property
    def lengths(self) -> torch.Tensor:
        """``[B]`` number of scored answer tokens ``|y|``."""
        return self.mask.sum(-1)

    @property
    def mean_nll(self) -> torch.Tensor:
        """Average per-token NLL over the batch (for logging)."""
        return -(self.token_log_probs * self.mask).sum() / self.mask.sum().clamp(min=1)


@dataclass
class LossDenominators:
    """What to divide summed losses by so that micro-batches add up to the loss of the whole optimizer step: in
    training the totals of the accumulation step (over processes, divided by their number, when
    ``average_tokens_across_devices``), otherwise the batch's own counts."""

    forget_tokens: torch.Tensor
    forget_sequences: torch.Tensor
    retain_tokens: torch.Tensor
    retain_sequences: torch.Tensor


def batch_counts(batch: dict[str, Any]) -> torch.Tensor:
    """The four counts of :class:`LossDenominators` of a paired batch, float64 (0 for a missing half)."""
    counts = []
    for prefix in ("", RETAIN_PREFIX):
        labels = batch.get(prefix + "labels")
        if labels is None:
            counts += [0.0, 0.0]
        else:
            counts += [float(answer_mask(labels).sum()), float(labels.shape[0])]
    return torch.tensor(counts, dtype=torch.float64)


def scalar_on_device(value: torch.Tensor | float, device: torch.device | str) -> torch.Tensor:
    """A logged value as a detached 0-d float32 tensor on ``device`` (recording one forces no host sync)."""
    if torch.is_tensor(value):
        return value.detach().float().reshape(()).to(device)
    return torch.tensor(float(value), dtype=torch.float32, device=device)
