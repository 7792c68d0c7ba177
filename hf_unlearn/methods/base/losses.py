"""Shared pieces of every unlearning objective: sequence log-probabilities, the NLL and the KL retain terms, and
what the trainer's loss hook receives (:class:`ScoredBatch`, :class:`LossDenominators`).

Conventions shared by every loss function of the methods (``hf_unlearn/methods/<name>/loss.py``):

* ``token_log_probs`` is ``[B, L]`` with ``token_log_probs[b, t] = log pi(y_t | x, y_<t)`` on answer tokens and
  0 elsewhere, exactly what :func:`hf_unlearn.logprobs.label_log_probs` returns for the labels.
* ``mask`` is the matching ``[B, L]`` boolean answer mask (:func:`answer_mask`, defined in
  :mod:`hf_unlearn.logprobs`): true where a label is scored.
* Token-level losses are *sums over tokens divided by* ``num_tokens`` and sequence-level losses are *sums over
  sequences divided by* ``num_sequences``. Both default to the counts of the batch itself (a plain mean); a trainer
  passes the totals of a whole gradient-accumulation step so that micro-batches add up to the full-batch loss.
* Every loss is a quantity to *minimise*.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...logprobs import answer_mask
from .pairing import RETAIN_PREFIX

__all__ = ["LossDenominators", "ScoredBatch", "answer_mask", "batch_counts", "kl_retain_loss", "nll_loss",
           "sequence_log_probs"]


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
    :func:`~hf_unlearn.logprobs.label_log_probs`), and only positions predicting an answer token count, so
    ``N`` (default) is the number of answer tokens. The direction (reference first) matches the forward KL used
    by TOFU's "KL" baseline and open-unlearning.

    open-unlearning's ``compute_kl_divergence`` differs in where it averages: it sums the same per-position KL
    over *every* position of the batch (the prompt, the answer, the padding, and the last position, which
    predicts nothing) and divides by ``B * L`` (``reduction="batchmean"`` on the flattened ``[B * L, V]``
    logits). Its value therefore depends on the prompt and padding lengths of the batch: on TOFU, where the
    answers are a fraction of the padded length, it weighs the answer positions less than this term at the same
    ``retain_weight``, and it also holds the prompt and padding positions to the reference. This form is the one
    the package and its benchmark run: the retain term then constrains exactly the distributions TOFU scores
    (the retain answers'), with a scale that does not change with how a batch is padded.
    """
    mask = answer_mask(labels)[:, 1:]
    log_p = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    log_ref = torch.log_softmax(ref_logits[:, :-1].float(), dim=-1)
    per_token = (log_ref.exp() * (log_ref - log_p)).sum(-1)
    return (per_token * mask).sum() / _denominator(num_tokens, mask.sum())


@dataclass
class ScoredBatch:
    """One forward pass over a (forget or retain) batch.

    ``token_log_probs[b, t] = log p(labels[b, t] | < t)`` on answer tokens (0 elsewhere), computed from ``logits``
    by :func:`hf_unlearn.logprobs.label_log_probs`; ``mask`` marks the scored positions; ``outputs`` is the raw model
    output (hidden states are there when the forward was asked for them).
    """

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
    """What to divide summed losses by so that micro-batches add up to the loss of the whole optimizer step.

    During training these are the totals over every micro-batch of the gradient-accumulation step (and over every
    process when ``average_tokens_across_devices``, divided by the number of processes since DDP averages
    gradients): ``sum(local) / denominator`` summed over micro-batches and averaged over processes equals the
    loss of one big batch. Outside training (evaluation, direct calls) they are the counts of the batch itself.
    """

    forget_tokens: torch.Tensor
    forget_sequences: torch.Tensor
    retain_tokens: torch.Tensor
    retain_sequences: torch.Tensor


def batch_counts(batch: dict[str, Any]) -> torch.Tensor:
    """The four counts of a paired batch that :class:`LossDenominators` holds, as float64 ``[forget answer
    tokens, forget sequences, retain answer tokens, retain sequences]`` (0 for a half the batch does not have)."""
    counts = []
    for prefix in ("", RETAIN_PREFIX):
        labels = batch.get(prefix + "labels")
        if labels is None:
            counts += [0.0, 0.0]
        else:
            counts += [float(answer_mask(labels).sum()), float(labels.shape[0])]
    return torch.tensor(counts, dtype=torch.float64)
