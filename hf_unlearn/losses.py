"""Unlearning objectives as pure tensor functions, one per objective, the formula in each docstring.

Conventions shared by every function here:

* ``token_log_probs`` is ``[B, L]`` with ``token_log_probs[b, t] = log pi(y_t | x, y_<t)`` on answer tokens and
  0 elsewhere, exactly what :func:`hf_unlearn.scoring.label_log_probs` returns for the labels.
* ``mask`` is the matching ``[B, L]`` boolean answer mask (:func:`answer_mask`): true where a label is scored.
* Token-level losses are *sums over tokens divided by* ``num_tokens`` and sequence-level losses are *sums over
  sequences divided by* ``num_sequences``. Both default to the counts of the batch itself (a plain mean); a trainer
  passes the totals of a whole gradient-accumulation step so that micro-batches add up to the full-batch loss.
* Every loss is a quantity to *minimise*.

Trainer glue (which batch, which model, which reference) lives in :mod:`hf_unlearn.trainers`; nothing here touches
a model. Methods added by other modules (MASC, ATWU) follow below the baselines.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .data.prompts import IGNORE_INDEX

# ---------------------------------------------------------------------------------------------------------------
# Baselines: GradAscent, GradDiff (NLL or KL retain term), NPO, SimNPO
# ---------------------------------------------------------------------------------------------------------------


def answer_mask(labels: torch.Tensor) -> torch.Tensor:
    """Boolean ``[B, L]`` mask of the label positions that :func:`~hf_unlearn.scoring.label_log_probs` scores.

    ``labels[b, t] != -100`` for ``t >= 1`` (position 0 has no context and is never scored).
    """
    mask = labels != IGNORE_INDEX
    mask[:, 0] = False
    return mask


def _denominator(value: torch.Tensor | float | int | None, default: torch.Tensor) -> torch.Tensor:
    if value is None:
        value = default
    return torch.as_tensor(value, dtype=torch.float32, device=default.device).clamp(min=1.0)


def sequence_log_probs(token_log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Answer log-likelihood of each sequence, ``log pi(y | x) = sum_t mask_t * log pi(y_t | x, y_<t)`` -> ``[B]``."""
    return (token_log_probs * mask).sum(-1)


def nll_loss(
    token_log_probs: torch.Tensor, mask: torch.Tensor, num_tokens: torch.Tensor | float | None = None
) -> torch.Tensor:
    """Token-averaged negative log-likelihood (the usual fine-tuning loss, used on the retain set).

    ``L_NLL = -(1/N) * sum_{b,t} mask_{b,t} * log pi_theta(y_{b,t} | x_b, y_{b,<t})`` with ``N = num_tokens``
    (default: the number of answer tokens in the batch).
    """
    return -(token_log_probs * mask).sum() / _denominator(num_tokens, mask.sum())


def grad_ascent_loss(
    token_log_probs: torch.Tensor, mask: torch.Tensor, num_tokens: torch.Tensor | float | None = None
) -> torch.Tensor:
    """Gradient ascent on the forget set: minimise ``-L_NLL(forget)``.

    ``L_GA = (1/N) * sum_{b,t} mask_{b,t} * log pi_theta(y_{b,t} | x_b, y_{b,<t})`` (Jang et al. 2023; the TOFU
    "grad_ascent" baseline of Maini et al. 2024). Minimising it pushes the forget answers' likelihood down without
    bound, which is why it is usually paired with a retain term (:func:`grad_diff_loss`).
    """
    return -nll_loss(token_log_probs, mask, num_tokens)


def kl_retain_loss(
    logits: torch.Tensor,
    ref_logits: torch.Tensor,
    labels: torch.Tensor,
    num_tokens: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Per-token ``KL(pi_ref || pi_theta)`` averaged over answer tokens (retain regulariser).

    ``L_KL = (1/N) * sum_{b,t} mask_{b,t} * sum_v pi_ref(v | ctx_{b,t}) * (log pi_ref(v | ctx) - log pi_theta(v | ctx))``

    ``logits`` / ``ref_logits`` are the ``[B, L, V]`` outputs of the trained and the frozen reference model on the
    same inputs; the distribution at position ``t - 1`` is the one that predicts ``labels[:, t]`` (same shift as
    :func:`~hf_unlearn.scoring.label_log_probs`), and only positions predicting an answer token count. The
    direction (reference first) matches the forward KL used by TOFU's "KL" baseline and open-unlearning.
    """
    mask = answer_mask(labels)[:, 1:]
    log_p = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    log_ref = torch.log_softmax(ref_logits[:, :-1].float(), dim=-1)
    per_token = (log_ref.exp() * (log_ref - log_p)).sum(-1)
    return (per_token * mask).sum() / _denominator(num_tokens, mask.sum())


def grad_diff_loss(
    forget_token_log_probs: torch.Tensor,
    forget_mask: torch.Tensor,
    retain_loss: torch.Tensor,
    gamma: float = 1.0,
    alpha: float = 1.0,
    num_forget_tokens: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Gradient difference: ascend on the forget set, descend on the retain set.

    ``L_GD = gamma * L_GA(forget) + alpha * L_retain`` where ``L_GA = -L_NLL(forget)`` (:func:`grad_ascent_loss`)
    and ``L_retain`` is the retain NLL (:func:`nll_loss`) or ``KL(pi_ref || pi_theta)`` (:func:`kl_retain_loss`)
    (Liu et al. 2022; TOFU's "grad_diff"). ``gamma`` weights the forget term and ``alpha`` the retain term, as in
    open-unlearning.
    """
    forget = grad_ascent_loss(forget_token_log_probs, forget_mask, num_forget_tokens)
    return gamma * forget + alpha * retain_loss


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


# ---------------------------------------------------------------------------------------------------------------
# Method losses added by other modules go below this line.
# ---------------------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------------------
# ATWU: Alternating Token-Weighted Unlearning (learned token scores g in [0, 1]; high = forget-specific)
#
# Per-token tensors are ``[B, L]`` as above; ``scores[b, t] = g_t = sigmoid(<w, h_t> + b)`` comes from
# :class:`hf_unlearn.trainers.ATWUTokenScorer`. The forget losses are used twice: in ATWU's model step with the
# scores detached, and in its scorer step (model outputs detached) as a function of the scores.
# ---------------------------------------------------------------------------------------------------------------


def _atwu_float(x: torch.Tensor) -> torch.Tensor:
    """Half-precision (and boolean) inputs are computed in float32; float32/float64 are kept."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _atwu_check_shapes(mask: torch.Tensor, *tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.shape != mask.shape:
            raise ValueError(f"ATWU per-token tensors must have the mask's shape {tuple(mask.shape)}, got {tuple(t.shape)}.")


def satga_plus_exponent(scores: torch.Tensor, beta: float, c: float) -> torch.Tensor:
    """Saturation exponent of SATGA+: ``a_t = beta * (1 + c * (1 - g_t))``.

    ``beta > 0`` is the saturation strength of plain saturated gradient ascent: a token the scorer selects
    (``g_t = 1``) is weighted ``p_t^beta``. ``c >= 0`` is the *score contrast*: a rejected token (``g_t = 0``)
    saturates with exponent ``beta * (1 + c)``, i.e. it stops being pushed as soon as its probability leaves 1;
    ``c = 0`` removes the score's effect (plain saturated GA).

    Note on the form. The issue writes the exponent as ``beta * c * g_t``. Read literally, a *high* score then
    saturates a token *faster* (weight ``p^(beta c)`` at ``g = 1``, un-saturated ascent at ``g = 0``): a high score
    would mean "protect this token", the opposite of what ATWU's scores mean (forget-specific, selected under the
    token budget). We keep the construction (the score enters the exponent of the stop-gradient saturation
    weight) with the method's orientation: the exponent is affine and *decreasing* in ``g_t``.
    """
    if beta <= 0:
        raise ValueError(f"SATGA+ needs saturation beta > 0, got {beta}.")
    if c < 0:
        raise ValueError(f"SATGA+ needs score contrast c >= 0, got {c}.")
    return beta * (1.0 + c * (1.0 - scores))


def satga_plus_loss(
    token_log_probs: torch.Tensor,
    scores: torch.Tensor,
    mask: torch.Tensor,
    beta: float = 0.2,
    c: float = 20.0,
    num_tokens: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """SATGA+, score-injected saturated gradient ascent (ATWU's default forget loss).

    ``L = -(1/N) * sum_{b,t} mask_{b,t} * sg(p_{b,t})^{a_{b,t}} * l_{b,t}``, with ``l = -log pi_theta(y_t | x, y_<t)``,
    ``p = exp(-l)``, ``a = beta * (1 + c * (1 - g))`` (:func:`satga_plus_exponent`) and ``N = num_tokens``.

    Minimising ``L`` raises the token NLL (gradient ascent) with the per-token weight ``p^a``: tokens already
    forgotten (``p`` small) stop being pushed (saturation), and the lower their score the sooner. The stop-gradient
    acts on the model's probability only: with ``scores`` detached (ATWU's model step) the weight is a constant and
    ``dL/d log p_t = p_t^a_t / N``; with the model's outputs detached (ATWU's scorer step) the same function is
    differentiable in the score through the exponent, ``dL/dg_t = -beta * c * p_t^a_t * l_t^2 / N``.
    """
    _atwu_check_shapes(mask, token_log_probs, scores)
    nll = -_atwu_float(token_log_probs)
    weight = torch.exp(-satga_plus_exponent(_atwu_float(scores), beta, c) * nll.detach())
    return -(weight * nll * mask).sum() / _denominator(num_tokens, mask.sum())


def weighted_npo_loss(
    token_log_probs: torch.Tensor,
    ref_token_log_probs: torch.Tensor,
    scores: torch.Tensor,
    mask: torch.Tensor,
    beta: float = 0.1,
    num_sequences: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Token-weighted NPO.

    ``L = -(2/beta) * (1/S) * sum_b log sigmoid(-beta * sum_t mask_{b,t} * g_{b,t} * (log pi_theta(y_{b,t}|.) - log pi_ref(y_{b,t}|.)))``

    :func:`npo_loss` with each answer token's log-ratio weighted by its score (``S = num_sequences``); ``g = 1``
    everywhere recovers plain NPO and tokens with ``g = 0`` leave the loss.
    """
    if beta <= 0:
        raise ValueError(f"NPO needs beta > 0, got {beta}.")
    _atwu_check_shapes(mask, token_log_probs, ref_token_log_probs, scores)
    diff = _atwu_float(token_log_probs) - _atwu_float(ref_token_log_probs)
    log_ratio = (diff * _atwu_float(scores) * mask).sum(-1)
    per_sequence = -(2.0 / beta) * F.logsigmoid(-beta * log_ratio)
    return per_sequence.sum() / _denominator(num_sequences, log_ratio.new_tensor(float(log_ratio.shape[0])))


def weighted_simnpo_loss(
    token_log_probs: torch.Tensor,
    scores: torch.Tensor,
    mask: torch.Tensor,
    beta: float = 4.5,
    delta: float = 0.0,
    num_sequences: torch.Tensor | float | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Token-weighted SimNPO.

    ``L = -(2/beta) * (1/S) * sum_b log sigmoid(-(beta / |y_b|_g) * sum_t mask_{b,t} g_{b,t} log pi_theta(y_{b,t}|.) - delta)``
    with the score mass ``|y_b|_g = sum_t mask_{b,t} g_{b,t}`` (at least ``eps``) in place of the length.

    :func:`simnpo_loss` whose reward is the score-weighted mean token log-probability; ``g = 1`` recovers plain
    SimNPO. ``delta`` is the reward margin, outside ``beta`` as in :func:`simnpo_loss`.
    """
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

    ``H = -(1/N) * sum_{b,t} mask_{b,t} * (g log g + (1 - g) log(1 - g))``, ``g`` clamped to ``[eps, 1 - eps]``.
    Minimising ``entropy_weight * H`` pushes every score towards 0 or 1.
    """
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

    Its value is the squared gap between the *selected* fraction of answer tokens and ``budget`` (in ``(0, 1)``);
    through the straight-through estimator (:func:`straight_through_indicator`) its gradient moves every score by
    ``2 * (fraction - budget) / N`` (down when too many tokens are selected).
    """
    if not 0.0 < budget < 1.0:
        raise ValueError(f"budget must lie in (0, 1), got {budget}.")
    _atwu_check_shapes(mask, scores)
    selected = straight_through_indicator(_atwu_float(scores), threshold)
    fraction = (selected * mask).sum() / mask.sum().clamp(min=1)
    return (fraction - budget) ** 2


# ---------------------------------------------------------------------------------------------------------------
# MASC: Margin Self-Correction (restricted margin, hinge, violation rate, tau <-> rho)
# ---------------------------------------------------------------------------------------------------------------


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

    Alignment as in :func:`~hf_unlearn.scoring.label_log_probs`: ``logits`` ``[B, L, V]`` come from ``input_ids``
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
