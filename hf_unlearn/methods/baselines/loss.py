"""Baseline unlearning objectives as pure functions: GradAscent, NPO, SimNPO, DPO and :func:`baseline_loss`, the
weighted sum the GradAscent/GradDiff/NPO/SimNPO trainers train. Conventions: :mod:`hf_unlearn.methods.base.losses`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..base.losses import _denominator, nll_loss, sequence_log_probs


def grad_ascent_loss(
    token_log_probs: torch.Tensor, mask: torch.Tensor, num_tokens: torch.Tensor | float | None = None
) -> torch.Tensor:
    """Gradient ascent on the forget set (Jang et al. 2023): minimise ``-L_NLL(forget)``.

    ``L_GA = (1/N) * sum_{b,t} mask_{b,t} * log pi_theta(y_{b,t} | x_b, y_{b,<t})``
    """
    return -nll_loss(token_log_probs, mask, num_tokens)


def npo_loss(
    log_probs: torch.Tensor, ref_log_probs: torch.Tensor, beta: float,
    num_sequences: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Negative Preference Optimization on sequence log-likelihoods (Zhang et al. 2024, eq. 3).

    ``L_NPO = -(2/beta) * (1/S) * sum_b log sigmoid(-beta * (log pi_theta(y_b|x_b) - log pi_ref(y_b|x_b)))``

    ``log_probs`` / ``ref_log_probs``: ``[B]`` answer log-likelihoods under the trained and the frozen model.
    """
    if beta <= 0:
        raise ValueError(f"NPO needs beta > 0, got {beta}.")
    log_ratio = log_probs - ref_log_probs
    per_sequence = -(2.0 / beta) * F.logsigmoid(-beta * log_ratio)
    return per_sequence.sum() / _denominator(num_sequences, log_probs.new_tensor(float(log_probs.shape[0])))


def simnpo_loss(
    log_probs: torch.Tensor, lengths: torch.Tensor, beta: float, delta: float = 0.0,
    num_sequences: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """SimNPO, reference-free and length-normalised (Fan et al. 2024, eq. 4, forget term).

    ``L_SimNPO = -(2/beta) * (1/S) * sum_b log sigmoid(-(beta / |y_b|) * log pi_theta(y_b|x_b) - delta)``

    ``lengths``: the ``[B]`` answer lengths ``|y|``; ``delta``: the reward margin, outside ``beta`` as in the paper.
    """
    if beta <= 0:
        raise ValueError(f"SimNPO needs beta > 0, got {beta}.")
    avg_log_prob = log_probs / lengths.to(log_probs.dtype).clamp(min=1.0)
    per_sequence = -(2.0 / beta) * F.logsigmoid(-beta * avg_log_prob - delta)
    return per_sequence.sum() / _denominator(num_sequences, log_probs.new_tensor(float(log_probs.shape[0])))


def dpo_loss(
    win_log_probs: torch.Tensor, win_ref_log_probs: torch.Tensor, lose_log_probs: torch.Tensor,
    lose_ref_log_probs: torch.Tensor, beta: float, num_sequences: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Direct Preference Optimization with the forget answer as the rejected one (Rafailov et al. 2023, eq. 7).

    ``L_DPO = -(2/beta) * (1/S) * sum_b log sigmoid(beta * ((log pi_theta(a_b|x_b) - log pi_ref(a_b|x_b))
    - (log pi_theta(y_b|x_b) - log pi_ref(y_b|x_b))))``

    ``win_*``: ``[B]`` log-likelihoods of the preferred answers ``a``, ``lose_*`` of the forget answers ``y``.
    """
    if beta <= 0:
        raise ValueError(f"DPO needs beta > 0, got {beta}.")
    margin = (win_log_probs - win_ref_log_probs) - (lose_log_probs - lose_ref_log_probs)
    per_sequence = -(2.0 / beta) * F.logsigmoid(beta * margin)
    return per_sequence.sum() / _denominator(num_sequences, lose_log_probs.new_tensor(float(lose_log_probs.shape[0])))


def baseline_loss(
    forget_loss: str, forget_token_log_probs: torch.Tensor, forget_mask: torch.Tensor,
    retain_loss: torch.Tensor | None = None, *, ref_log_probs: torch.Tensor | None = None, beta: float = 0.1,
    delta: float = 0.0, forget_weight: float = 1.0, retain_weight: float = 1.0,
    num_forget_tokens: torch.Tensor | float | None = None,
    num_forget_sequences: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """The baseline trainers' objective: ``L = forget_weight * L_forget + retain_weight * L_retain``.

    ``L_forget`` by ``forget_loss``: ``"grad_ascent"`` (:func:`grad_ascent_loss`), ``"npo"`` (:func:`npo_loss`
    against ``ref_log_probs``) or ``"simnpo"`` (:func:`simnpo_loss`); ``L_retain`` is the computed retain term,
    left out when ``retain_loss=None``.
    """
    if forget_loss == "grad_ascent":
        forget_term = grad_ascent_loss(forget_token_log_probs, forget_mask, num_forget_tokens)
    elif forget_loss in ("npo", "simnpo"):
        log_probs = sequence_log_probs(forget_token_log_probs, forget_mask)
        if forget_loss == "npo":
            if ref_log_probs is None:
                raise ValueError("The NPO objective needs `ref_log_probs` (the reference's answer log-likelihoods).")
            forget_term = npo_loss(log_probs, ref_log_probs, beta, num_forget_sequences)
        else:
            forget_term = simnpo_loss(log_probs, forget_mask.sum(-1), beta, delta, num_forget_sequences)
    else:
        raise ValueError(f"Unknown baseline forget loss {forget_loss!r}; expected 'grad_ascent', 'npo' or 'simnpo'.")
    loss = forget_weight * forget_term
    if retain_loss is not None:
        loss = loss + retain_weight * retain_loss
    return loss
