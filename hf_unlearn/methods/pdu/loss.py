"""PDU's objective as pure tensor functions: the forget term, the Lagrangian and the dual update.
Conventions: :mod:`hf_unlearn.methods.base.losses`.

Source: Entesari et al. 2025, "Constrained Entropic Unlearning: A Primal-Dual Framework for Large Language
Models" (arXiv 2506.05314); the implementation of open-unlearning, ``src/trainer/unlearn/pdu.py``
(``PDU.compute_loss``, ``final_loss_value``) with ``configs/trainer/PDU.yaml``.
"""

from __future__ import annotations

import torch

from ..base.losses import _denominator, answer_mask

__all__ = ["dual_update", "pdu_forget_loss", "pdu_loss"]


def pdu_forget_loss(
    logits: torch.Tensor, labels: torch.Tensor, num_tokens: torch.Tensor | float | None = None
) -> torch.Tensor:
    """The forget term: the squared gap between the largest and the mean logit, over the answer tokens.

    ``L_F = (1/N) * sum_{b,t} mask_{b,t} * (max_v z_{b,t-1}(v) - (1/V) * sum_v z_{b,t-1}(v))^2``

    ``logits`` is ``[B, L, V]``, ``labels`` ``[B, L]`` (``mask`` = :func:`answer_mask`), ``N = num_tokens``. The gap
    is 0 exactly when the logits are all equal (the uniform distribution), so minimising it flattens the
    distributions of the forget answers: the paper's entropy-maximising forget loss in open-unlearning's form.
    Deviation, named: ``z_{b,t-1}`` is the distribution that *predicts* answer token ``t`` (the shift of every
    loss here); open-unlearning takes the logits at the answer tokens' own positions (``logits[labels != -100]``),
    which predict the token after each answer token. Computed in float32.
    """
    mask = answer_mask(labels)[:, 1:]
    z = logits[:, :-1].float()
    gap = z.amax(-1) - z.mean(-1)
    return (gap.pow(2) * mask).sum() / _denominator(num_tokens, mask.sum())


def pdu_loss(
    forget_term: torch.Tensor,
    retain_term: torch.Tensor,
    dual_weight: float,
    eps: float,
    forget_weight: float = 1.0,
) -> torch.Tensor:
    """The Lagrangian PDU descends on: ``L = forget_weight * L_F + w * (L_R - eps)``.

    ``forget_term`` is :func:`pdu_forget_loss`, ``retain_term`` the retain loss ``L_R`` (NLL or KL), ``w =
    dual_weight`` the current dual variable (a constant here: it moves only by :func:`dual_update`) and ``eps`` the
    constraint bound (open-unlearning's ``final_loss_value``: ``preferences . [L_F, L_R - eps]``). ``-w * eps``
    does not change the gradient; it makes the value the Lagrangian's.
    """
    return forget_weight * forget_term + dual_weight * (retain_term - eps)


def dual_update(dual_weight: float, retain_loss: float, eps: float, step_size: float) -> float:
    """Projected dual ascent on the retain weight: ``w <- max(0, w + step_size * (L_R - eps))``.

    ``w`` grows while the retain loss exceeds its bound and shrinks (not below 0) while it is under it
    (open-unlearning's ``final_loss_value``, ``dual_update_upon="step"``).
    """
    return max(0.0, float(dual_weight) + float(step_size) * (float(retain_loss) - float(eps)))
