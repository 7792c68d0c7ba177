"""MASC: Margin Self-Correction (restricted margin, buffered hinge, violation rate, tau <-> rho).
"""

from __future__ import annotations

import torch

from .common import _denominator, answer_mask


def masc_threshold_from_probability(rho: float) -> float:
    """MASC margin threshold ``tau`` equivalent to a restricted probability ``rho``: ``tau = log(rho / (1 - rho))``.

    The restricted margin (:func:`restricted_margin`) compares the target with its ``k`` strongest rivals
    ``S_k``. With ``p_r(y) = exp(b z_y) / (exp(b z_y) + sum_{v in S_k} exp(b z_v))`` the target's probability under
    the softmax restricted to ``{y} U S_k``, the margin is its log-odds ``m = log(p_r / (1 - p_r))``, so
    ``m > tau`` exactly when ``p_r > rho``.
    """
    import math

    rho = float(rho)
    if not 0.0 < rho < 1.0:
        raise ValueError(f"margin_probability (rho) must lie in (0, 1), got {rho}.")
    return math.log(rho / (1.0 - rho))


def masc_probability_from_threshold(tau: float) -> float:
    """Inverse of :func:`masc_threshold_from_probability`: ``rho = sigmoid(tau) = 1 / (1 + exp(-tau))``."""
    import math

    return 1.0 / (1.0 + math.exp(-float(tau)))


def restricted_margin(
    logits: torch.Tensor, labels: torch.Tensor, top_k: int, beta: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """MASC restricted margin at every answer position.

    ``m_t = b * z(y_t | c_t) - logsumexp_{v in S_k(c_t)} b * z(v | c_t)``

    with ``z`` the logits, ``b = beta`` and ``S_k(c_t)`` the ``k`` highest-logit tokens other than the target
    ``y_t``, *selected without gradient* (the gradient still flows through their logits). The margin is
    shift-invariant in ``z``, so logits and log-probabilities give the same value.

    Alignment as in :func:`~hf_unlearn.logprobs.label_log_probs`: ``logits`` ``[B, L, V]`` come from ``input_ids``
    ``[B, L]`` and ``out[:, t]`` is the margin of ``labels[:, t]`` predicted from tokens ``< t``. Returns
    ``(margins [B, L] float32, mask [B, L] bool)`` with ``mask = answer_mask(labels)`` and margins 0 outside it.
    ``top_k`` must be in ``[1, V - 1]`` and ``beta > 0``.
    """
    vocab = logits.shape[-1]
    if not 1 <= int(top_k) <= vocab - 1:
        raise ValueError(f"top_k must be in [1, vocab_size - 1] = [1, {vocab - 1}], got {top_k}.")
    if not beta > 0:
        raise ValueError(f"margin_beta must be > 0, got {beta}.")
    z = logits[:, :-1, :].float() * beta
    mask = answer_mask(labels)
    valid = mask[:, 1:]
    safe = labels[:, 1:].masked_fill(~valid, 0).unsqueeze(-1)
    with torch.no_grad():
        rivals = z.detach().scatter(-1, safe, float("-inf")).topk(int(top_k), dim=-1).indices
    target_z = z.gather(-1, safe).squeeze(-1)
    rival_lse = torch.logsumexp(z.gather(-1, rivals), dim=-1)
    margins = torch.zeros(labels.shape, dtype=z.dtype, device=z.device)
    margins[:, 1:] = (target_z - rival_lse) * valid
    return margins, mask


def margin_hinge_loss(
    margins: torch.Tensor, mask: torch.Tensor, tau: float, num_tokens: torch.Tensor | float | None = None
) -> torch.Tensor:
    """MASC self-correction loss on forget answer tokens.

    ``L_MASC = (1/N) * sum_{b,t} mask_{b,t} * max(0, m_{b,t} - tau)`` with ``N = num_tokens`` (default: the answer
    tokens of the batch). Active only while ``m_t > tau``: a corrected position (``m_t <= tau``) contributes
    neither loss nor gradient, so the loss vanishes as the forget set is corrected. The full MASC objective adds
    ``lambda * KL(pi_0 || pi_theta)`` on retain answer tokens (:func:`kl_retain_loss`).
    """
    per_token = torch.relu(margins - tau) * mask
    return per_token.sum() / _denominator(num_tokens, mask.sum())


def masc_violation_counts(margins: torch.Tensor, mask: torch.Tensor, tau: float) -> tuple[int, int]:
    """``(|{t in T : m_t > tau}|, |T|)`` over the answer positions ``T`` (``mask``), to accumulate over batches."""
    mask = mask.bool()
    return int(((margins > tau) & mask).sum()), int(mask.sum())


def violation_rate(margins: torch.Tensor, mask: torch.Tensor, tau: float) -> float:
    """MASC violation rate ``|{t in T : m_t > tau}| / |T|``: the fraction of answer positions not yet corrected."""
    violations, positions = masc_violation_counts(margins, mask, tau)
    if positions == 0:
        raise ValueError("violation_rate needs at least one answer position (the mask is empty).")
    return violations / positions
