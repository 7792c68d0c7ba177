"""Token-level forget objectives of the baseline menu: WGA, SatImp, CE-U and UNDIAL, as pure functions.
Conventions: :mod:`hf_unlearn.methods.base.losses`; CE-U and UNDIAL take ``[B, L, V]`` logits and ``[B, L]``
labels, the distribution at position ``t - 1`` predicting ``labels[:, t]``.
"""

from __future__ import annotations

import torch

from ..base.losses import _denominator, answer_mask


def wga_loss(
    token_log_probs: torch.Tensor, mask: torch.Tensor, beta: float = 1.0,
    num_tokens: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Weighted Gradient Ascent (Wang et al. 2025, arXiv 2502.19301).

    ``L_WGA = -(1/N) * sum_{b,t} mask_{b,t} * sg(p_{b,t})^beta * CE_{b,t}``, with ``CE = -log pi_theta(y_t | x, y_<t)``
    and ``p = exp(-CE)`` detached (``sg``); ``beta >= 0`` (``0``: plain gradient ascent).
    """
    if beta < 0:
        raise ValueError(f"WGA needs beta >= 0, got {beta}.")
    weight = token_log_probs.detach().exp().pow(beta)
    # -(w * CE) = w * log p
    return (weight * token_log_probs * mask).sum() / _denominator(num_tokens, mask.sum())


def satimp_loss(
    token_log_probs: torch.Tensor, mask: torch.Tensor, beta1: float = 5.0, beta2: float = 1.0,
    num_tokens: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """SatImp, saturation-importance reweighted gradient ascent (Yang et al. 2025, arXiv 2505.11953).

    ``L_SatImp = -(1/N) * sum_{b,t} mask_{b,t} * sg(p_{b,t})^beta1 * (1 - sg(p_{b,t}))^beta2 * CE_{b,t}``, ``CE``
    and ``p`` as in :func:`wga_loss`; ``beta1, beta2 >= 0``.
    """
    if beta1 < 0 or beta2 < 0:
        raise ValueError(f"SatImp needs beta1, beta2 >= 0, got {beta1}, {beta2}.")
    p = token_log_probs.detach().exp()
    weight = p.pow(beta1) * (1.0 - p).clamp(min=0.0).pow(beta2)
    return (weight * token_log_probs * mask).sum() / _denominator(num_tokens, mask.sum())


def soft_target_cross_entropy(
    logits: torch.Tensor, target_logits: torch.Tensor, num_tokens: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """``(1/N) * sum_i H(q_i, softmax(logits_i))`` over ``[N, V]`` rows, ``H(q, p) = -sum_v q_v log p_v``,
    ``q = softmax(target_logits)`` without gradient (a ``-inf`` target adds no term), in float32."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    q = torch.softmax(target_logits.detach().float(), dim=-1)
    per_token = -torch.where(q > 0, q * log_p, torch.zeros_like(log_p)).sum(-1)
    return per_token.sum() / _denominator(num_tokens, logits.new_tensor(float(logits.shape[0])))


def _predicting(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The rows of ``values[:, :-1]`` (``[B, L, ...]``) that predict the label positions of ``mask`` (``[B, L]``)."""
    return values[:, :-1][mask[:, 1:]]


def ceu_mask(labels: torch.Tensor, skip_first: int = 1) -> torch.Tensor:
    """The ``[B, L]`` answer mask without the first ``skip_first`` tokens of each answer (CE-U's positions)."""
    mask = answer_mask(labels)
    return mask & (mask.cumsum(-1) > skip_first)


def ceu_loss(
    logits: torch.Tensor, labels: torch.Tensor, skip_first: int = 1, num_tokens: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Cross-Entropy Unlearning, CE-U (Yang 2025, arXiv 2503.01224).

    ``L_CE-U = (1/N) * sum_{b,t} m_{b,t} * H(q_{b,t}, pi_theta(. | ctx_{b,t}))`` with
    ``q = softmax(sg(z) - inf * onehot(y_t))``, the model's own detached distribution without the true token;
    ``m`` is :func:`ceu_mask`.
    """
    if skip_first < 0:
        raise ValueError(f"CE-U's skip_first must be >= 0, got {skip_first}.")
    mask = ceu_mask(labels, skip_first)
    rows = _predicting(logits, mask)
    target = rows.detach().float().scatter(-1, labels[mask].unsqueeze(-1), float("-inf"))
    return soft_target_cross_entropy(rows, target, num_tokens)


def undial_loss(
    logits: torch.Tensor, ref_logits: torch.Tensor, labels: torch.Tensor, beta: float = 10.0,
    num_tokens: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """UNDIAL, self-distillation with adjusted logits (Dong et al. 2025, arXiv 2402.10052).

    ``L_UNDIAL = (1/N) * sum_{b,t} mask_{b,t} * H(softmax(z^ref_{b,t} - beta * onehot(y_{b,t})), pi_theta(. | ctx_{b,t}))``
    with ``beta > 0``, averaged over answer tokens only, as in the paper (open-unlearning averages over every
    position).
    """
    if not beta > 0:
        raise ValueError(f"UNDIAL needs beta > 0, got {beta}.")
    mask = answer_mask(labels)
    target = _predicting(ref_logits, mask).detach().float()
    target = target.scatter_add(-1, labels[mask].unsqueeze(-1), target.new_full((target.shape[0], 1), -float(beta)))
    return soft_target_cross_entropy(_predicting(logits, mask), target, num_tokens)
