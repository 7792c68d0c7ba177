"""Token-level forget objectives of the baseline menu: WGA, SatImp, CE-U and UNDIAL, as pure functions.

Conventions are those of :mod:`hf_unlearn.methods.base.losses`: ``token_log_probs`` / ``mask`` are ``[B, L]`` in
label coordinates (``token_log_probs[b, t] = log pi(labels[b, t] | < t)`` on the answer mask, 0 elsewhere), token
losses are sums over the scored tokens divided by ``num_tokens`` (default: the batch's count), and every loss is a
quantity to minimise. The objectives that need the whole next-token distribution (CE-U, UNDIAL) take ``[B, L, V]``
logits and the ``[B, L]`` labels, with the distribution at position ``t - 1`` predicting ``labels[:, t]``.
"""

from __future__ import annotations

import torch

from ..base.losses import _denominator, answer_mask

__all__ = ["ceu_loss", "ceu_mask", "satimp_loss", "soft_target_cross_entropy", "undial_loss", "wga_loss"]


def wga_loss(
    token_log_probs: torch.Tensor, mask: torch.Tensor, beta: float = 1.0,
    num_tokens: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Weighted Gradient Ascent (Wang et al. 2025, "Rethinking LLM Unlearning Objectives: A Gradient Perspective
    and Go Beyond", arXiv 2502.19301; open-unlearning ``src/trainer/utils.py:compute_wga_loss``).

    ``L_WGA = -(1/N) * sum_{b,t} mask_{b,t} * sg(p_{b,t})^beta * CE_{b,t}``, with ``CE = -log pi_theta(y_t | x, y_<t)``
    and ``p = exp(-CE)`` the token's probability, detached (``sg``). Gradient ascent on each forget token, weighted
    by how likely the model still finds it: tokens already forgotten (``p -> 0``) stop pulling, which keeps the
    ascent from running away. ``beta >= 0`` sets how sharply (``beta = 0`` is plain gradient ascent).
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
    """SatImp, saturation-importance reweighted gradient ascent (Yang et al. 2025, "Exploring Criteria of Loss
    Reweighting to Enhance LLM Unlearning", arXiv 2505.11953; open-unlearning
    ``src/trainer/utils.py:compute_satimp_loss``).

    ``L_SatImp = -(1/N) * sum_{b,t} mask_{b,t} * sg(p_{b,t})^beta1 * (1 - sg(p_{b,t}))^beta2 * CE_{b,t}``, with
    ``CE`` and the detached token probability ``p = exp(-CE)`` as in :func:`wga_loss`. The first factor
    (saturation) drops tokens already forgotten, the second (importance) drops tokens the model is certain of, so
    the ascent concentrates on tokens of intermediate likelihood. ``beta1, beta2 >= 0``.
    """
    if beta1 < 0 or beta2 < 0:
        raise ValueError(f"SatImp needs beta1, beta2 >= 0, got {beta1}, {beta2}.")
    p = token_log_probs.detach().exp()
    weight = p.pow(beta1) * (1.0 - p).clamp(min=0.0).pow(beta2)
    return (weight * token_log_probs * mask).sum() / _denominator(num_tokens, mask.sum())


def soft_target_cross_entropy(
    logits: torch.Tensor, target_logits: torch.Tensor, num_tokens: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """``(1/N) * sum_i H(q_i, pi_theta(. | ctx_i))`` over ``[N, V]`` rows, with ``H(q, p) = -sum_v q_v log p_v``,
    ``q = softmax(target_logits)`` (no gradient) and ``pi_theta = softmax(logits)``, in float32. A target logit of
    ``-inf`` gives that entry probability 0 and no term. ``N = num_tokens`` defaults to the number of rows."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    q = torch.softmax(target_logits.detach().float(), dim=-1)
    per_token = -torch.where(q > 0, q * log_p, torch.zeros_like(log_p)).sum(-1)
    return per_token.sum() / _denominator(num_tokens, logits.new_tensor(float(logits.shape[0])))


def _predicting(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The rows of ``values[:, :-1]`` (``[B, L, ...]``) that predict the label positions of ``mask`` (``[B, L]``)."""
    return values[:, :-1][mask[:, 1:]]


def ceu_mask(labels: torch.Tensor, skip_first: int = 1) -> torch.Tensor:
    """The answer mask (:func:`~hf_unlearn.methods.base.losses.answer_mask`) without the first ``skip_first``
    scored tokens of each answer: ``[B, L]`` boolean, the positions CE-U trains on."""
    mask = answer_mask(labels)
    return mask & (mask.cumsum(-1) > skip_first)


def ceu_loss(
    logits: torch.Tensor, labels: torch.Tensor, skip_first: int = 1, num_tokens: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Cross-Entropy Unlearning, CE-U (Yang 2025, "CE-U: Cross Entropy Unlearning", arXiv 2503.01224;
    open-unlearning ``src/trainer/unlearn/ceu.py``).

    ``L_CE-U = (1/N) * sum_{b,t} m_{b,t} * H(q_{b,t}, pi_theta(. | ctx_{b,t}))`` with
    ``q = softmax(sg(z) - inf * onehot(y_t))``: the model's own detached next-token distribution with the true token
    removed and the rest renormalised, so that each step moves probability from the true token to the alternatives
    in proportion to their current probability, rather than pushing the true token's log-probability down without
    bound as gradient ascent does. ``m`` is :func:`ceu_mask`: the answer tokens without the first ``skip_first`` of each
    answer (the paper's trick, footnote of its training settings; open-unlearning's
    ``ignore_first_n_answer_tokens=1``). ``N = num_tokens`` defaults to the number of those positions.
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
    """UNDIAL, self-distillation with adjusted logits (Dong et al. 2025, "UNDIAL: Self-Distillation with Adjusted
    Logits for Robust Unlearning in Large Language Models", arXiv 2402.10052; open-unlearning
    ``src/trainer/utils.py:compute_undial_loss``).

    ``L_UNDIAL = (1/N) * sum_{b,t} mask_{b,t} * H(softmax(z^ref_{b,t} - beta * onehot(y_{b,t})), pi_theta(. | ctx_{b,t}))``:
    the model is distilled towards the frozen initial model's distribution with the true token's logit lowered by
    ``beta`` (> 0), so it forgets the token by a fixed, bounded amount and keeps the rest of the distribution.

    Deviation from open-unlearning: the loss averages over the answer tokens only (``mask``, as in the paper);
    open-unlearning averages over every position of the sequence (prompt and padding too, where the label ``-100``
    lowers the logit of vocabulary entry ``V - 100``), which adds a distillation-to-itself term on the prompt.
    """
    if not beta > 0:
        raise ValueError(f"UNDIAL needs beta > 0, got {beta}.")
    mask = answer_mask(labels)
    target = _predicting(ref_logits, mask).detach().float()
    target = target.scatter_add(-1, labels[mask].unsqueeze(-1), target.new_full((target.shape[0], 1), -float(beta)))
    return soft_target_cross_entropy(_predicting(logits, mask), target, num_tokens)
