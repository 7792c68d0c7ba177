"""Baseline unlearning objectives: GradAscent, GradDiff (NLL or KL retain term), NPO, SimNPO, DPO (IdkDPO) and
:func:`baseline_loss`, the weighted sum the GradAscent/GradDiff/NPO/SimNPO trainers train. The token-level
objectives WGA, SatImp, CE-U and UNDIAL are in :mod:`hf_unlearn.methods.baselines.token_loss`. Conventions:
:mod:`hf_unlearn.methods.base.losses`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..base.losses import _denominator, nll_loss, sequence_log_probs


def grad_ascent_loss(
    token_log_probs: torch.Tensor, mask: torch.Tensor, num_tokens: torch.Tensor | float | None = None
) -> torch.Tensor:
    """Gradient ascent on the forget set: minimise ``-L_NLL(forget)``.

    ``L_GA = (1/N) * sum_{b,t} mask_{b,t} * log pi_theta(y_{b,t} | x_b, y_{b,<t})`` (Jang et al. 2023; the TOFU
    "grad_ascent" baseline of Maini et al. 2024). Minimising it pushes the forget answers' likelihood down without
    bound, which is why it is usually paired with a retain term (:func:`grad_diff_loss`).
    """
    return -nll_loss(token_log_probs, mask, num_tokens)


def grad_diff_loss(
    forget_token_log_probs: torch.Tensor,
    forget_mask: torch.Tensor,
    retain_loss: torch.Tensor,
    forget_weight: float = 1.0,
    retain_weight: float = 1.0,
    num_forget_tokens: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Gradient difference: ascend on the forget set, descend on the retain set.

    ``L_GD = forget_weight * L_GA(forget) + retain_weight * L_retain`` where ``L_GA = -L_NLL(forget)``
    (:func:`grad_ascent_loss`) and ``L_retain`` is the retain NLL (:func:`nll_loss`) or ``KL(pi_ref || pi_theta)``
    (:func:`kl_retain_loss`) (Liu et al. 2022; TOFU's "grad_diff"; open-unlearning calls the weights ``gamma``
    and ``alpha``).
    """
    forget = grad_ascent_loss(forget_token_log_probs, forget_mask, num_forget_tokens)
    return forget_weight * forget + retain_weight * retain_loss


def npo_loss(
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    beta: float,
    num_sequences: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Negative Preference Optimization on sequence log-likelihoods (Zhang et al. 2024, "Negative Preference
    Optimization: From Catastrophic Collapse to Effective Unlearning", eq. 3).

    ``L_NPO = -(2/beta) * (1/S) * sum_b log sigmoid(-beta * (log pi_theta(y_b|x_b) - log pi_ref(y_b|x_b)))``

    ``log_probs`` / ``ref_log_probs`` are ``[B]`` answer log-likelihoods (sums over answer tokens, see
    :func:`sequence_log_probs`) under the trained and the frozen reference model; ``S = num_sequences``. At
    ``theta = ref`` the loss is ``(2/beta) * log 2`` and its gradient is that of gradient ascent; as the forget
    likelihood falls the per-example weight ``sigmoid(beta * log-ratio)`` vanishes, which bounds the loss
    below by 0 (no catastrophic collapse). ``beta > 0`` is required.
    """
    if beta <= 0:
        raise ValueError(f"NPO needs beta > 0, got {beta}.")
    log_ratio = log_probs - ref_log_probs
    per_sequence = -(2.0 / beta) * F.logsigmoid(-beta * log_ratio)
    return per_sequence.sum() / _denominator(num_sequences, log_probs.new_tensor(float(log_probs.shape[0])))


def simnpo_loss(
    log_probs: torch.Tensor,
    lengths: torch.Tensor,
    beta: float,
    delta: float = 0.0,
    num_sequences: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Simple NPO, reference-free and length-normalised (Fan et al. 2024, "Simplicity Prevails: Rethinking Negative
    Preference Optimization for LLM Unlearning", eq. 4, forget term).

    ``L_SimNPO = -(2/beta) * (1/S) * sum_b log sigmoid(-(beta / |y_b|) * log pi_theta(y_b|x_b) - delta)``

    ``log_probs`` are ``[B]`` answer log-likelihoods, ``lengths`` the ``[B]`` answer lengths ``|y|`` in tokens,
    ``delta`` the reward margin (the paper's ``gamma``; 0 by default) and ``S = num_sequences``. The margin enters
    as in the paper, *outside* ``beta``; open-unlearning's ``delta`` is inside (``beta * (NLL_avg - delta)``), so
    its ``delta = d`` equals ``delta = beta * d`` here. The retain term (``alpha * L_NLL(retain)``, the paper's
    ``lambda``) is added by the trainer. ``beta > 0`` is required.
    """
    if beta <= 0:
        raise ValueError(f"SimNPO needs beta > 0, got {beta}.")
    avg_log_prob = log_probs / lengths.to(log_probs.dtype).clamp(min=1.0)
    per_sequence = -(2.0 / beta) * F.logsigmoid(-beta * avg_log_prob - delta)
    return per_sequence.sum() / _denominator(num_sequences, log_probs.new_tensor(float(log_probs.shape[0])))


def dpo_loss(
    win_log_probs: torch.Tensor,
    win_ref_log_probs: torch.Tensor,
    lose_log_probs: torch.Tensor,
    lose_ref_log_probs: torch.Tensor,
    beta: float,
    num_sequences: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Direct Preference Optimization with the forget answer as the rejected one (Rafailov et al. 2023, "Direct
    Preference Optimization: Your Language Model is Secretly a Reward Model", eq. 7; as an unlearning baseline with
    an "I don't know" preferred answer, TOFU's IdkDPO; open-unlearning ``src/trainer/utils.py:compute_dpo_loss``).

    ``L_DPO = -(2/beta) * (1/S) * sum_b log sigmoid(beta * ((log pi_theta(a_b|x_b) - log pi_ref(a_b|x_b))
    - (log pi_theta(y_b|x_b) - log pi_ref(y_b|x_b))))``

    ``win_*`` are the ``[B]`` log-likelihoods of the preferred answers ``a`` (an alternate or refusal answer),
    ``lose_*`` those of the forget answers ``y``, under the trained and the frozen reference model; ``S =
    num_sequences``. The factor ``2/beta`` is open-unlearning's (it makes the loss NPO's, :func:`npo_loss`, when the
    preferred-answer terms are dropped); DPO's paper has ``1``. At ``theta = ref`` the loss is ``(2/beta) * log 2``.
    ``beta > 0`` is required.
    """
    if beta <= 0:
        raise ValueError(f"DPO needs beta > 0, got {beta}.")
    margin = (win_log_probs - win_ref_log_probs) - (lose_log_probs - lose_ref_log_probs)
    per_sequence = -(2.0 / beta) * F.logsigmoid(beta * margin)
    return per_sequence.sum() / _denominator(num_sequences, lose_log_probs.new_tensor(float(lose_log_probs.shape[0])))


def baseline_loss(
    forget_loss: str,
    forget_token_log_probs: torch.Tensor,
    forget_mask: torch.Tensor,
    retain_loss: torch.Tensor | None = None,
    *,
    ref_log_probs: torch.Tensor | None = None,
    beta: float = 0.1,
    delta: float = 0.0,
    forget_weight: float = 1.0,
    retain_weight: float = 1.0,
    num_forget_tokens: torch.Tensor | float | None = None,
    num_forget_sequences: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """The objective of the baseline trainers (open-unlearning's convention), the formula they train.

    ``L = forget_weight * L_forget + retain_weight * L_retain`` (open-unlearning's ``gamma`` and ``alpha``) where
    ``L_forget`` is chosen by ``forget_loss``:

    * ``"grad_ascent"``: :func:`grad_ascent_loss` on the forget tokens (with a retain term this is
      :func:`grad_diff_loss`);
    * ``"npo"``: :func:`npo_loss` of the forget answers' log-likelihoods against ``ref_log_probs`` (``[B]``, the
      frozen reference's);
    * ``"simnpo"``: :func:`simnpo_loss` with the answer lengths ``|y| = sum_t forget_mask``;

    and ``L_retain`` is the already computed retain term (the retain NLL or ``KL(pi_ref || pi_theta)``); with
    ``retain_loss=None`` (no retain term) ``L = forget_weight * L_forget``.
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
