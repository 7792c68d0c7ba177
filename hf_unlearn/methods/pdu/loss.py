"""PDU's objective as pure tensor functions (Entesari et al. 2025, arXiv 2506.05314): the forget term, the
Lagrangian and the dual update. Conventions: :mod:`hf_unlearn.methods.base.losses`.
"""

from __future__ import annotations

import torch

from ..base.losses import _denominator, answer_mask


def pdu_forget_loss(
    logits: torch.Tensor, labels: torch.Tensor, num_tokens: torch.Tensor | float | None = None
) -> torch.Tensor:
    """The forget term, the squared gap between the largest and the mean logit over the answer tokens:

    ``L_F = (1/N) * sum_{b,t} mask_{b,t} * (max_v z_{b,t-1}(v) - (1/V) * sum_v z_{b,t-1}(v))^2``

    ``z_{b,t-1}`` predicts answer token ``t`` (open-unlearning takes the answer tokens' own positions).
    """
    mask = answer_mask(labels)[:, 1:]
    z = logits[:, :-1].float()
    gap = z.amax(-1) - z.mean(-1)
    return (gap.pow(2) * mask).sum() / _denominator(num_tokens, mask.sum())


def pdu_loss(
    forget_term: torch.Tensor, retain_term: torch.Tensor, dual_weight: float, eps: float,
    forget_weight: float = 1.0,
) -> torch.Tensor:
    """The Lagrangian PDU descends on: ``L = forget_weight * L_F + w * (L_R - eps)``, ``w = dual_weight`` a
    constant here (it moves only by :func:`dual_update`)."""
    return forget_weight * forget_term + dual_weight * (retain_term - eps)


def dual_update(dual_weight: float, retain_loss: float, eps: float, step_size: float) -> float:
    """Projected dual ascent on the retain weight: ``w <- max(0, w + step_size * (L_R - eps))``."""
    return max(0.0, float(dual_weight) + float(step_size) * (float(retain_loss) - float(eps)))
