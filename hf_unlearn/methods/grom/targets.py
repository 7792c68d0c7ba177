"""GROM targets ``D``: the output change each edited module should make at each forget key.

Everything is read through the *logit lens*: a change ``delta`` written into the residual stream at
any depth reaches the logits (to first order, ignoring later blocks) as ``U J_t delta``, where ``U``
is the unembedding and ``J_t`` the Jacobian of the final norm at the final residual ``h_t``. For the
LM head the output already is the logit vector (``U J_t`` is the identity).

* **Token suppression** (:func:`suppression_targets`): for a forget position predicting answer token
  ``y`` the gold *margin* ``m_t = z_y - logsumexp_{v != y} z_v`` has gradient
  ``w_t = J_t^T U^T (e_y - q_t)`` with ``q_t`` the model's distribution renormalised over ``v != y``.
  The minimum-norm change lowering the margin by ``Delta_t`` (first order) is
  ``D_t = -Delta_t w_t / ||w_t||^2`` with ``Delta_t = alpha_y * max(0, m_t + kappa) / k``: each token is
  asked to fall ``kappa`` nats *below* its best competitors, ``k`` edited modules sharing the work.
  The margin (not ``log p_y``) is used because a memorised token has ``p_y ~ 1`` and a vanishing
  log-probability gradient.
* **Specificity** (:func:`specificity_weights`): ``alpha_j = clip(1 - p_r(j) / p_f(j), 0, 1)^gamma``
  with ``p_f, p_r`` the smoothed frequencies of token ``j`` among forget and retain answer tokens (by
  default each the empirical rate mixed with a uniform share, so rates are compared): the share of the
  token's forget frequency not explained by ordinary (retain) use. A token seen only in
  forget answers gets ``alpha ~ 1``; one at least as common in retain answers (function words, EOS,
  shared templates) gets 0, so its key is asked to leave the output unchanged.
* **Representation corruption** (:func:`corruption_targets`): ``D_t = alpha_y * c * u``, ``u`` a fixed
  random unit direction of the output space, ``c`` a set multiple of the mean output norm; this
  scrambles what the edited module writes for forget content without aiming at particular tokens
  (for multiple-choice style knowledge, where no answer tokens should be singled out).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def specificity_weights(
    forget_counts: torch.Tensor,
    retain_counts: torch.Tensor,
    power: float = 1.0,
    smoothing: float = 0.5,
    mode: str = "fraction",
) -> torch.Tensor:
    """``alpha_j = clip(1 - p_r(j) / p_f(j), 0, 1)^gamma`` for tokens seen in forget answers, 0 for the others.

    ``p_f``, ``p_r`` are the smoothed frequencies of token ``j`` among the ``N_f`` forget and ``N_r`` retain
    answer tokens (counts ``c_f``, ``c_r`` over a vocabulary of ``V`` tokens), with ``beta = smoothing``:

    * ``mode="fraction"``: ``p_x(j) = (c_x(j) + beta N_x / V) / ((1 + beta) N_x)``, i.e. the empirical rate
      ``c_x(j) / N_x`` mixed with the uniform ``1 / V`` at weight ``beta / (1 + beta)``: the smoothing mass is
      the fraction ``beta`` of the set's own count, so ``alpha`` compares *rates* (multiplying every retain
      count by the same factor leaves it unchanged) whatever ``V`` is.
    * ``mode="pseudo_count"``: ``p_x(j) = (c_x(j) + beta) / (N_x + beta V)``; when ``beta V`` is much larger
      than ``N_x`` this compares raw counts ``(c_r + beta) / (c_f + beta)`` rather than rates.

    ``1 - p_r/p_f`` is the share of token ``j``'s forget-set frequency that its retain-set frequency does
    not explain: 1 for a token used only in forget answers, 0 for one at least as common in retain answers.
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
    """``J_t^T u_{y_t}``: the residual-stream direction whose dot product with a residual change is its
    direct (logit-lens) contribution to the gold-token logit."""
    return norm_vjp(norm, hidden, unembed[gold].float())


def margin_gradient_residual(
    norm: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    unembed: torch.Tensor,
    gold: torch.Tensor,
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
    """A fixed random unit vector of ``dim`` entries (Gaussian, seeded independently of global RNG state)."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(dim, generator=gen, dtype=torch.float64)
    return (u / u.norm()).to(dtype)
