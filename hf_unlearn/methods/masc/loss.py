"""MASC's tensor math: the restricted margin, the hinges, the continuation mask, violation rates and the
confirmation statistic of its stopping rule.
"""

from __future__ import annotations

import math

import torch

from ..base.losses import _denominator, answer_mask

MASC_CONFIRM_RULES = ("mean", "hoeffding")


def masc_probability_from_threshold(tau: float) -> float:
    """The restricted probability of a margin threshold: ``rho = sigmoid(tau)`` (``tau = log(rho / (1 - rho))``)."""
    return 1.0 / (1.0 + math.exp(-float(tau)))


def restricted_margin(
    logits: torch.Tensor, labels: torch.Tensor, top_k: int, beta: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """MASC restricted margin at every answer position,
    ``m_t = b * z(y_t | c_t) - logsumexp_{v in S_k(c_t)} b * z(v | c_t)``, with ``b = beta > 0`` and ``S_k(c_t)``
    the ``k`` (in ``[1, V - 1]``) highest-logit tokens other than ``y_t``, chosen without gradient. Returns
    ``(margins [B, L] float32, mask [B, L] bool)``, margins 0 outside ``mask = answer_mask(labels)``.
    """
    vocab = logits.shape[-1]
    if not 1 <= int(top_k) <= vocab - 1:
        raise ValueError(f"top_k must be in [1, vocab_size - 1] = [1, {vocab - 1}], got {top_k}.")
    if not beta > 0:
        raise ValueError(f"margin_beta must be > 0, got {beta}.")
    mask = answer_mask(labels)
    valid = mask[:, 1:]
    margins = torch.zeros(labels.shape, dtype=torch.float32, device=logits.device)
    # only the positions that predict an answer token: [N, V] instead of [B, L, V]
    z = logits[:, :-1, :][valid].float()
    if beta != 1.0:
        z = z * beta
    target = labels[:, 1:][valid].unsqueeze(-1)
    target_z = z.gather(-1, target).squeeze(-1)
    with torch.no_grad():  # the k + 1 best, then the target dropped (or the last one when the target is not there)
        best = z.detach().topk(int(top_k) + 1, dim=-1).indices
        keep = best != target
        keep[:, -1] &= ~keep.all(-1)
        rivals = best[keep].view(-1, int(top_k))
    rival_lse = torch.logsumexp(z.gather(-1, rivals), dim=-1)
    margins[:, 1:][valid] = (target_z - rival_lse).to(margins.dtype)
    return margins, mask


def margin_hinge_loss(
    margins: torch.Tensor, mask: torch.Tensor, tau: float, num_tokens: torch.Tensor | float | None = None
) -> torch.Tensor:
    """MASC's plain hinge: ``L = (1/N) * sum_{b,t} mask_{b,t} * max(0, m_{b,t} - tau)``."""
    per_token = torch.relu(margins - tau) * mask
    return per_token.sum() / _denominator(num_tokens, mask.sum())


def violation_rate_tensor(margins: torch.Tensor, mask: torch.Tensor, tau: float) -> torch.Tensor:
    """``|{t in T : m_t > tau}| / max(|T|, 1)`` as a 0-d float64 tensor on the margins' device (no host sync)."""
    mask = mask.bool()
    violations = ((margins > tau) & mask).sum(dtype=torch.float64)
    return violations / mask.sum(dtype=torch.float64).clamp_min(1)


def buffered_hinge_loss(
    margins: torch.Tensor, mask: torch.Tensor, tau: float, eta: float,
    num_tokens: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """MASC buffered hinge, a surrogate ``>= 1`` of the violation indicator ``1[m_t > tau]``:
    ``L = (1/N) * sum_{b,t} mask_{b,t} * relu(m_{b,t} - (tau - eta)) / eta`` with ``eta > 0``.
    """
    if not eta > 0:
        raise ValueError(f"The MASC buffer eta must be > 0, got {eta}.")
    per_token = torch.relu(margins - (float(tau) - float(eta))) / float(eta) * mask
    return per_token.sum() / _denominator(num_tokens, mask.sum())


def sample_cut_ratios(
    batch_size: int, low: float = 0.2, high: float = 0.6, generator: torch.Generator | None = None
) -> torch.Tensor:
    """``[B]`` float64 cut ratios drawn uniformly from ``[low, high]``."""
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"Continuation cut ratios need 0 <= low <= high <= 1, got low={low}, high={high}.")
    u = torch.rand(int(batch_size), generator=generator, dtype=torch.float64)
    return low + u * (high - low)


def continuation_mask(
    mask: torch.Tensor, cut_ratios: torch.Tensor, min_prefix_tokens: int = 32, min_suffix_tokens: int = 32
) -> torch.Tensor:
    """MASC continuation penalty: the ``[B, L]`` answer positions of rank ``>= c_b`` (0-based), with
    ``c_b = clamp(floor(r_b * n_b), min_prefix_tokens, n_b - min_suffix_tokens)`` for ``n_b`` answer positions and
    cut ratio ``r_b``; an answer shorter than ``min_prefix_tokens + min_suffix_tokens`` is kept whole.
    """
    mask = mask.bool()
    n = mask.sum(-1)
    rank = mask.long().cumsum(-1) - 1
    ratios = cut_ratios.to(device=mask.device, dtype=torch.float64)
    cut = torch.floor(ratios * n.double()).long()
    cut = torch.minimum(cut, n - int(min_suffix_tokens)).clamp(min=int(min_prefix_tokens))
    cut = torch.where(n < int(min_prefix_tokens) + int(min_suffix_tokens), torch.zeros_like(cut), cut)
    return mask & (rank >= cut.unsqueeze(-1))


def per_example_violation_rates(margins: torch.Tensor, mask: torch.Tensor, tau: float) -> torch.Tensor:
    """``[B]`` per-example violation rates ``|{t in A_b : m_t > tau}| / |A_b|`` (0 when ``A_b`` is empty)."""
    mask = mask.bool()
    count = mask.sum(-1)
    violations = ((margins > tau) & mask).sum(-1)
    return torch.where(count > 0, violations.double() / count.clamp(min=1).double(), torch.zeros_like(count).double())


def hoeffding_upper_bound(mean: float, n: int, delta: float, check_index: int) -> tuple[float, float]:
    """Anytime Hoeffding upper confidence bound of MASC's confirmation stage,
    ``U_j = mean + sqrt(log(1 / delta_j) / (2 n))`` with ``delta_j = 6 delta / (pi^2 (j + 1)^2)`` for the
    ``j``-th confirmation (``j >= 1``; ``sum_j delta_j < delta``), ``mean`` the mean of ``n`` rates in ``[0, 1]``.
    Returns ``(U_j, delta_j)``."""
    if int(n) < 1:
        raise ValueError(f"The Hoeffding bound needs at least one example, got n={n}.")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1), got {delta}.")
    if int(check_index) < 1:
        raise ValueError(f"check_index (j) counts confirmations from 1, got {check_index}.")
    delta_j = 6.0 * float(delta) / (math.pi**2 * (int(check_index) + 1) ** 2)
    return float(mean) + math.sqrt(math.log(1.0 / delta_j) / (2.0 * int(n))), delta_j


def confirmation_statistic(
    rates: list[float] | torch.Tensor, rule: str, delta: float, check_index: int
) -> tuple[float, float, float | None]:
    """What the confirmation compares with ``alpha``: the mean of ``rates`` (``rule="mean"``) or its
    :func:`hoeffding_upper_bound`. Returns ``(statistic, mean, delta_j)``, ``delta_j`` ``None`` for ``"mean"``."""
    values = [float(r) for r in (rates.tolist() if torch.is_tensor(rates) else rates)]
    if not values:
        raise ValueError("The confirmation stage needs at least one example.")
    mean = sum(values) / len(values)
    if rule == "mean":
        return mean, mean, None
    if rule == "hoeffding":
        bound, delta_j = hoeffding_upper_bound(mean, len(values), delta, check_index)
        return bound, mean, delta_j
    raise ValueError(f"confirm_rule must be one of {list(MASC_CONFIRM_RULES)}, got {rule!r}.")
