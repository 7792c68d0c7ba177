"""GROM targets ``D``: the output change each edited module should make at each forget key, read through the logit
lens (a residual change ``delta`` reaches the logits as ``U J_t delta``, ``U`` the unembedding, ``J_t`` the final
norm's Jacobian at ``h_t``; the identity for the LM head).

* Token suppression: the gold margin ``m_t = z_y - logsumexp_{v != y} z_v`` has gradient
  ``w_t = J_t^T U^T (e_y - q_t)`` (``q_t`` the distribution renormalised over ``v != y``), and
  ``D_t = -Delta_t w_t / ||w_t||^2``, ``Delta_t = alpha_y max(0, m_t + kappa) / k`` for ``k`` edited modules.
* Specificity: ``alpha_j = clip(1 - p_r(j) / p_f(j), 0, 1)^gamma`` (smoothed forget / retain token frequencies).
* Representation corruption: ``D_t = alpha_y c u``, ``u`` a fixed random unit direction.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def specificity_weights(
    forget_counts: torch.Tensor, retain_counts: torch.Tensor, power: float = 1.0, smoothing: float = 0.5,
    mode: str = "fraction",
) -> torch.Tensor:
    """``alpha_j = clip(1 - p_r(j) / p_f(j), 0, 1)^gamma`` for tokens seen in forget answers, else 0, with
    ``p_x(j) = (c_x(j) + beta N_x / V) / ((1 + beta) N_x)`` (``"fraction"``) or
    ``p_x(j) = (c_x(j) + beta) / (N_x + beta V)`` (``"pseudo_count"``), ``beta = smoothing``.
    """
    cf = forget_counts.to(torch.float64)
    cr = retain_counts.to(torch.float64)
    vocab = cf.numel()
    if mode == "fraction":

        def freq(c: torch.Tensor) -> torch.Tensor:
            n = c.sum()
            if float(n) <= 0:  # an empty set: the uniform distribution
                return torch.full_like(c, 1.0 / vocab)
            return (c + smoothing * n / vocab) / ((1 + smoothing) * n)

        pf, pr = freq(cf), freq(cr)
    elif mode == "pseudo_count":
        pf = (cf + smoothing) / (cf.sum() + smoothing * vocab).clamp_min(1e-300)
        pr = (cr + smoothing) / (cr.sum() + smoothing * vocab).clamp_min(1e-300)
    else:
        raise ValueError(f"specificity smoothing mode must be 'fraction' or 'pseudo_count', got {mode!r}")
    excess = (1 - pr / pf.clamp_min(1e-300)).clamp(0, 1)
    excess = torch.where(cf > 0, excess, torch.zeros_like(excess))
    return excess**power


def margin_and_competitors(logits: torch.Tensor, gold: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gold margin ``m = z_y - logsumexp_{v != y} z_v`` (``[n]``) and ``q = softmax_{v != y}(z)`` (``[n, V]``)."""
    z = logits.float()
    rest = z.scatter(-1, gold[:, None], float("-inf"))
    lse = torch.logsumexp(rest, dim=-1)
    margin = z.gather(-1, gold[:, None]).squeeze(-1) - lse
    q = torch.softmax(rest, dim=-1)
    return margin, q


def norm_vjp(norm: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
    """``J_t^T v_t`` row by row: the vector-Jacobian product of the final norm at ``hidden`` (``[n, d]``)."""
    with torch.enable_grad():
        h = hidden.detach().float().requires_grad_(True)
        out = norm(h).float()
        (grad,) = torch.autograd.grad(out, h, grad_outputs=vectors.float().to(out.dtype))
    return grad.detach()


def logit_lens_rows(
    norm: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, unembed: torch.Tensor, gold: torch.Tensor
) -> torch.Tensor:
    """``J_t^T u_{y_t}``: the residual direction of the gold-token logit through the logit lens."""
    return norm_vjp(norm, hidden, unembed[gold].float())


def margin_gradient_residual(
    norm: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, unembed: torch.Tensor, gold: torch.Tensor,
    q: torch.Tensor,
) -> torch.Tensor:
    """``w_t = J_t^T U^T (e_y - q_t)``: residual-space gradient of the gold margin (``[n, d]``)."""
    u = unembed.float()
    return norm_vjp(norm, hidden, u[gold] - q.float() @ u)


def margin_gradient_logits(gold: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``w_t = e_y - q_t``: logit-space gradient of the gold margin (``[n, V]``), for an LM-head edit."""
    w = -q.float()
    return w.scatter_add(-1, gold[:, None], torch.ones_like(gold, dtype=w.dtype)[:, None])


def suppression_targets(
    directions: torch.Tensor, margin: torch.Tensor, alpha: torch.Tensor, kappa: float, share: int = 1
) -> torch.Tensor:
    """``D_t = -Delta_t w_t / ||w_t||^2`` with ``Delta_t = alpha_t max(0, m_t + kappa) / share`` (rows ``[s, d_out]``)."""
    drop = alpha.to(directions.dtype) * (margin.to(directions.dtype) + kappa).clamp_min(0) / share
    sq = (directions**2).sum(-1).clamp_min(1e-12)
    return -(drop / sq)[:, None] * directions


def corruption_targets(alpha: torch.Tensor, direction: torch.Tensor, scale: float) -> torch.Tensor:
    """``D_t = alpha_t * scale * u`` for a unit direction ``u`` (rows ``[s, d_out]``)."""
    u = direction / direction.norm().clamp_min(1e-12)
    return alpha.to(u.dtype)[:, None] * scale * u[None, :]


def random_direction(dim: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A seeded random unit vector (independent of the global RNG)."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(dim, generator=gen, dtype=torch.float64)
    return (u / u.norm()).to(dtype)
