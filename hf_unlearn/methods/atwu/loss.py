"""ATWU's objectives on learned token scores ``g`` in ``[0, 1]`` (high: forget-specific), per-token tensors
``[B, L]`` (conventions: :mod:`hf_unlearn.methods.base.losses`). The forget losses serve the model step (scores
detached) and the weighter step (model outputs detached)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..base.losses import _denominator, answer_mask


def _atwu_float(x: torch.Tensor) -> torch.Tensor:
    """Half-precision (and boolean) inputs are computed in float32; float32/float64 are kept."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _atwu_check_shapes(mask: torch.Tensor, *tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.shape != mask.shape:
            raise ValueError(f"ATWU per-token tensors must have the mask's shape {tuple(mask.shape)}, got {tuple(t.shape)}.")


SATGA_SELECTIONS = ("soft", "hard")


def satga_plus_exponent(scores: torch.Tensor, beta: float, c: float, selection: str = "soft") -> torch.Tensor:
    """Saturation exponent of SATGA+: ``a_t = beta * (1 + c * (1 - s_t))``.

    ``s_t = g_t`` (``selection="soft"``) or ``STE(1[g_t > 0.5])`` (``"hard"``, :func:`straight_through_indicator`).
    ``beta > 0``: the saturation of a selected token (``g_t = 1``); ``c >= 0``: the score contrast (a rejected
    token saturates with ``beta * (1 + c)``; ``c = 0`` is plain saturated gradient ascent). The exponent decreases
    in ``g_t``: a high score (forget-specific) keeps a token pushed longer."""
    if beta <= 0:
        raise ValueError(f"SATGA+ needs saturation beta > 0, got {beta}.")
    if c < 0:
        raise ValueError(f"SATGA+ needs score contrast c >= 0, got {c}.")
    if selection not in SATGA_SELECTIONS:
        raise ValueError(f"SATGA+ selection must be one of {list(SATGA_SELECTIONS)}, got {selection!r}.")
    s = straight_through_indicator(scores) if selection == "hard" else scores
    return beta * (1.0 + c * (1.0 - s))


SATGA_FORMS = ("gated", "exponent_only")


def satga_plus_weight(
    token_log_probs: torch.Tensor, scores: torch.Tensor, beta: float = 0.2, c: float = 5.0,
    form: str = "gated", selection: str = "soft",
) -> torch.Tensor:
    """Per-token weight of SATGA+'s ascent term (the model's probability under stop-gradient).

    ``form="gated"``: ``w_t = g_t * sg(p_t)^{a_t}``; ``form="exponent_only"``: ``w_t = sg(p_t)^{a_t}``; with
    ``a_t`` of :func:`satga_plus_exponent` (``selection`` chooses its score; the gate is always ``g_t``)."""
    if form not in SATGA_FORMS:
        raise ValueError(f"SATGA+ form must be one of {list(SATGA_FORMS)}, got {form!r}.")
    g = _atwu_float(scores)
    saturation = torch.exp(satga_plus_exponent(g, beta, c, selection) * _atwu_float(token_log_probs).detach())
    return g * saturation if form == "gated" else saturation


def satga_plus_loss(
    token_log_probs: torch.Tensor, scores: torch.Tensor, mask: torch.Tensor, beta: float = 0.2,
    c: float = 5.0, num_tokens: torch.Tensor | float | None = None, form: str = "gated", eps: float = 1e-6,
    selection: str = "soft",
) -> torch.Tensor:
    """SATGA+, score-gated saturated gradient ascent (ATWU's default forget loss).

    ``form="gated"`` (default)::

        L = -(sum_{b,t} mask_{b,t} * g_{b,t} * sg(p_{b,t})^{a_{b,t}} * l_{b,t}) / M,
        M = N * (sum_{b,t} mask_{b,t} g_{b,t}) / (sum_{b,t} mask_{b,t})

    with ``l = -log pi_theta(y_t | x, y_<t)``, ``p = exp(-l)``, ``a`` of :func:`satga_plus_exponent` and
    ``N = num_tokens`` (default: the batch's answer tokens, so that ``M`` is the selected score mass, at least
    ``eps``). ``form="exponent_only"``: ``L = -(1/N) sum mask * sg(p)^a * l``.
    """
    _atwu_check_shapes(mask, token_log_probs, scores)
    nll = -_atwu_float(token_log_probs)
    weight = satga_plus_weight(token_log_probs, scores, beta, c, form, selection)
    total = (weight * nll * mask).sum()
    if form == "exponent_only":
        return -total / _denominator(num_tokens, mask.sum())
    count = mask.sum().clamp(min=1)
    mass = (_atwu_float(scores) * mask).sum()
    if num_tokens is None:
        denominator = mass.clamp(min=eps)
    else:
        n = torch.as_tensor(num_tokens, dtype=mass.dtype, device=mass.device).clamp(min=1.0)
        denominator = (n * mass / count).clamp(min=eps)
    return -total / denominator


def weighted_npo_loss(
    token_log_probs: torch.Tensor, ref_token_log_probs: torch.Tensor, scores: torch.Tensor,
    mask: torch.Tensor, beta: float = 0.1, num_sequences: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Token-weighted NPO.

    ``L = -(2/beta) * (1/S) * sum_b log sigmoid(-beta * sum_t mask_{b,t} * g_{b,t} * (log pi_theta(y_{b,t}|.) - log pi_ref(y_{b,t}|.)))``

    ``S = num_sequences``; ``g = 1`` everywhere is plain NPO."""
    if beta <= 0:
        raise ValueError(f"NPO needs beta > 0, got {beta}.")
    _atwu_check_shapes(mask, token_log_probs, ref_token_log_probs, scores)
    diff = _atwu_float(token_log_probs) - _atwu_float(ref_token_log_probs)
    log_ratio = (diff * _atwu_float(scores) * mask).sum(-1)
    per_sequence = -(2.0 / beta) * F.logsigmoid(-beta * log_ratio)
    return per_sequence.sum() / _denominator(num_sequences, log_ratio.new_tensor(float(log_ratio.shape[0])))


def weighted_simnpo_loss(
    token_log_probs: torch.Tensor, scores: torch.Tensor, mask: torch.Tensor, beta: float = 4.5,
    delta: float = 0.0, num_sequences: torch.Tensor | float | None = None, eps: float = 1e-6,
) -> torch.Tensor:
    """Token-weighted SimNPO.

    ``L = -(2/beta) * (1/S) * sum_b log sigmoid(-(beta / |y_b|_g) * sum_t mask_{b,t} g_{b,t} log pi_theta(y_{b,t}|.) - delta)``
    with the score mass ``|y_b|_g = sum_t mask_{b,t} g_{b,t}`` (at least ``eps``) in place of the length.

    ``g = 1`` everywhere is plain SimNPO."""
    if beta <= 0:
        raise ValueError(f"SimNPO needs beta > 0, got {beta}.")
    _atwu_check_shapes(mask, token_log_probs, scores)
    w = _atwu_float(scores) * mask
    reward = (w * _atwu_float(token_log_probs)).sum(-1) / w.sum(-1).clamp(min=eps)
    per_sequence = -(2.0 / beta) * F.logsigmoid(-beta * reward - delta)
    return per_sequence.sum() / _denominator(num_sequences, reward.new_tensor(float(reward.shape[0])))


def score_entropy(
    scores: torch.Tensor, mask: torch.Tensor, num_tokens: torch.Tensor | float | None = None, eps: float = 1e-6
) -> torch.Tensor:
    """Mean binary entropy of the token scores (ATWU's entropy regulariser).

    ``H = -(1/N) * sum_{b,t} mask_{b,t} * (g log g + (1 - g) log(1 - g))``, ``g`` clamped to ``[eps, 1 - eps]``."""
    _atwu_check_shapes(mask, scores)
    g = _atwu_float(scores).clamp(eps, 1.0 - eps)
    h = -(g * torch.log(g) + (1.0 - g) * torch.log1p(-g))
    return (h * mask).sum() / _denominator(num_tokens, mask.sum())


def straight_through_indicator(scores: torch.Tensor, threshold: float = 0.5) -> torch.Tensor:
    """``STE(1[g > threshold])``: the hard 0/1 selection in the forward pass, the identity's gradient
    (``d/dg = 1``) in the backward pass: ``hard + g - sg(g)``."""
    hard = (scores > threshold).to(scores.dtype)
    return hard + scores - scores.detach()


def budget_penalty(scores: torch.Tensor, mask: torch.Tensor, budget: float, threshold: float = 0.5) -> torch.Tensor:
    """ATWU's token budget penalty ``(mean_t STE(1[g_t > threshold]) - budget)^2`` over the masked tokens.

    ``budget`` in ``(0, 1)``; through :func:`straight_through_indicator` its gradient moves every score by
    ``2 * (fraction - budget) / N``."""
    if not 0.0 < budget < 1.0:
        raise ValueError(f"budget must lie in (0, 1), got {budget}.")
    _atwu_check_shapes(mask, scores)
    selected = straight_through_indicator(_atwu_float(scores), threshold)
    fraction = (selected * mask).sum() / mask.sum().clamp(min=1)
    return (fraction - budget) ** 2


def retain_conflict(
    forget_logits: torch.Tensor, forget_labels: torch.Tensor, forget_states: torch.Tensor,
    retain_logits: torch.Tensor, retain_labels: torch.Tensor, retain_states: torch.Tensor,
) -> torch.Tensor:
    """How much unlearning each forget answer token costs the retain answers, through the output layer.

    With ``logits = W h`` (``h`` the last hidden state, ``W`` the output matrix), the gradient of one token's
    log-probability is ``grad_W log p(y | h) = (e_y - p) h^T``. Gradient ascent on forget token ``t`` moves
    ``W`` along ``-(e_{y_t} - p_t) h_t^T``, which changes the mean retain log-likelihood at first order by
    ``-c_t`` times the step, with

        c_t = < (e_{y_t} - p_t) h_t^T , mean_r (e_{y_r} - p_r) h_r^T >_F
            = mean_r [(e_{y_t} - p_t) . (e_{y_r} - p_r)] * [h_t . h_r]

    over the retain answer tokens ``r``. ``out[:, t]`` is label ``t``'s conflict (read from position ``t - 1``, as
    :func:`hf_unlearn.logprobs.label_log_probs` aligns), 0 off the answer. Inputs ``[B, L, V]``, ``[B, L]`` and
    ``[B, L, H]`` (detached; float32 math). Returns ``[B_f, L_f]`` float32."""
    def deltas(logits: torch.Tensor, labels: torch.Tensor, states: torch.Tensor):
        mask = answer_mask(labels)[:, 1:]
        p = torch.softmax(logits[:, :-1][mask].detach().float(), dim=-1)
        p[torch.arange(p.shape[0], device=p.device), labels[:, 1:][mask]] -= 1.0  # p - e_y: the sign cancels
        return p, states[:, :-1][mask].detach().float(), mask

    d_f, h_f, mask = deltas(forget_logits, forget_labels, forget_states)
    d_r, h_r, _ = deltas(retain_logits, retain_labels, retain_states)
    out = torch.zeros(forget_labels.shape, dtype=torch.float32, device=forget_logits.device)
    if d_f.shape[0] and d_r.shape[0]:
        out[:, 1:][mask] = ((d_f @ d_r.T) * (h_f @ h_r.T)).mean(dim=1)
    return out


def normalized_conflict(conflict: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``c_t / mean_s |c_s|`` over the masked tokens ``s`` (0 where ``mask`` is false, all 0 when every ``c`` is):
    the retain conflict on a scale of 1, whatever the model's logit and hidden-state scales."""
    mask = mask.bool()
    scale = conflict[mask].abs().mean() if mask.any() else conflict.new_zeros(())
    if not scale > 0:
        return torch.zeros_like(conflict)
    return torch.where(mask, conflict / scale, torch.zeros_like(conflict))
