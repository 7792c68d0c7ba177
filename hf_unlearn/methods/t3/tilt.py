"""Temper-Then-Tilt over the full vocabulary, as pure tensor functions:

    s_v = log_softmax(logits)_v / T + w * max(log sigmoid(g_t[v]), floor),    log q = log_softmax(s),

``g_t`` the guidance head's logits. Greedy decoding depends on ``T w`` only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def tilted_scores(
    base_logits: torch.Tensor, guidance_logits: torch.Tensor, temperature: float, tilt_weight: float,
    log_f_floor: float | None = None,
) -> torch.Tensor:
    """``s = log_softmax(base_logits) / T + w * max(logsigmoid(guidance_logits), floor)`` (float32)."""
    s = torch.log_softmax(base_logits.float(), dim=-1)
    if float(temperature) != 1.0:
        s.div_(float(temperature))
    if float(tilt_weight) != 0.0:
        log_f = F.logsigmoid(guidance_logits.float())
        if log_f_floor is not None:
            log_f = log_f.clamp_min(float(log_f_floor))
        s.add_(log_f, alpha=float(tilt_weight))
    return s


def tilted_log_probs(
    base_logits: torch.Tensor, guidance_logits: torch.Tensor, temperature: float, tilt_weight: float,
    log_f_floor: float | None = None,
) -> torch.Tensor:
    """``log q = log_softmax(s)`` of :func:`tilted_scores`."""
    return torch.log_softmax(
        tilted_scores(base_logits, guidance_logits, temperature, tilt_weight, log_f_floor), dim=-1
    )


def greedy_regret(
    base_logits: torch.Tensor, guidance_logits: torch.Tensor, settings: list[tuple[float, float]],
    log_f_floor: float | None = None,
) -> torch.Tensor:
    """What greedy decoding under each ``(T, w)`` gives up of the base, per position (``[N, K]``, float32):

        g_k = argmax_v ( log p_v / T_k + w_k * max(log sigmoid(guidance_v), floor) ),
        out[n, k] = max_v log p_v - log p_{g_k}.
    """
    log_p = torch.log_softmax(base_logits.float(), dim=-1)
    top = log_p.max(dim=-1).values
    out = torch.empty((log_p.shape[0], len(settings)), dtype=torch.float32, device=log_p.device)
    for k, (temperature, tilt_weight) in enumerate(settings):
        picked = tilted_scores(base_logits, guidance_logits, temperature, tilt_weight, log_f_floor).argmax(dim=-1)
        out[:, k] = top - log_p.gather(-1, picked[:, None]).squeeze(-1)
    return out
