"""Teacher-forced log-probabilities under the T3 distribution, exact over the full vocabulary::

    log q(y_t | x, y_<t) = log_softmax_v( log_softmax(logits_{t-1})_v / T + w * max(log sigmoid(g_{t-1}[v]), floor) )[y_t]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ...data.prompts import IGNORE_INDEX
from ...logprobs import TokenScorer
from .hidden import HiddenStateHook, causal_mean_pool, check_length
from .modeling import T3Classifier
from .processor import validate_t3_arguments
from .tilt import greedy_regret, tilted_log_probs

#: Float32 ``[positions, V]`` tensors alive at once while one chunk of positions is scored.
BUFFERS_PER_POSITION = 6
#: Default memory budget of those buffers (small on the CPU, where a chunk then stays in cache).
CPU_SCORING_MEMORY = 32 * 2**20
ACCELERATOR_SCORING_MEMORY = 2**30


def chunk_positions(vocab_size: int, memory_bytes: int) -> int:
    """Scored positions per chunk: ``max(1, floor(memory_bytes / (BUFFERS_PER_POSITION * 4 * V)))``."""
    return max(1, int(memory_bytes) // (BUFFERS_PER_POSITION * 4 * int(vocab_size)))


def candidate_answer_log_probs(
    base_logits: torch.Tensor, guidance_logits: torch.Tensor, targets: torch.Tensor,
    settings: Sequence[tuple[float, float]], log_f_floor: float | None = None,
) -> torch.Tensor:
    """Every candidate's answer-token log-probability (``[N, K]``, float32) for positions ``n`` with answer tokens
    ``y_n = targets[n]`` and candidates ``(T_k, w_k) = settings[k]``::

        log p = log_softmax(base_logits),   log f = max(log sigmoid(guidance_logits), floor)
        s_k   = log p / T_k + w_k log f,    out[n, k] = s_k[y_n] - logsumexp_v s_k[v]

    with ``log p`` and ``log f`` computed once; ``(1, 0)`` is the base's own ``log p(y)``.
    """
    log_p = torch.log_softmax(base_logits.float(), dim=-1)
    picked_p = log_p.gather(-1, targets[:, None]).squeeze(-1)
    needs_f = any(float(w) != 0.0 for _, w in settings)
    log_f = F.logsigmoid(guidance_logits.float()) if needs_f else None
    if log_f is not None and log_f_floor is not None:
        log_f = log_f.clamp_min(float(log_f_floor))
    picked_f = log_f.gather(-1, targets[:, None]).squeeze(-1) if log_f is not None else None
    out = torch.empty((log_p.shape[0], len(settings)), dtype=torch.float32, device=log_p.device)
    for k, (temperature, tilt_weight) in enumerate(settings):
        t, w = float(temperature), float(tilt_weight)
        if t == 1.0 and w == 0.0:
            out[:, k] = picked_p
            continue
        s = log_p / t if t != 1.0 else log_p.clone()
        picked = picked_p / t if t != 1.0 else picked_p
        if w != 0.0:
            s.add_(log_f, alpha=w)
            picked = picked + w * picked_f
        out[:, k] = picked - torch.logsumexp(s, dim=-1)
    return out


def _base_pass(
    model: Any, classifier: T3Classifier, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward of the base: ``(logits [B, L, V], pooled states [B, L, H])`` of the head's layer."""
    check_length(model, input_ids.shape[1], "The scored input")
    captured: list[torch.Tensor] = []
    with HiddenStateHook(model, int(classifier.config.layer), lambda h, m: captured.append(h)):
        logits = model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).logits
    if not captured:
        raise RuntimeError("The T3 hook saw no forward of the base model's decoder.")
    if logits.shape[-1] != int(classifier.config.vocab_size):
        raise ValueError(f"The base returns {logits.shape[-1]} logits but the T3 head {classifier.config.vocab_size}.")
    return logits, causal_mean_pool(captured[-1], attention_mask)


def _answer_chunks(labels: torch.Tensor, logits: torch.Tensor, memory_bytes: int | None):
    """``(rows, cols, targets = labels[rows, cols + 1])`` of the scored positions, :func:`chunk_positions` at a time."""
    targets = labels[:, 1:]
    rows, cols = (targets != IGNORE_INDEX).nonzero(as_tuple=True)
    if memory_bytes is None:
        memory_bytes = CPU_SCORING_MEMORY if logits.device.type == "cpu" else ACCELERATOR_SCORING_MEMORY
    step = chunk_positions(logits.shape[-1], memory_bytes)
    for start in range(0, len(rows), step):
        b, t = rows[start : start + step], cols[start : start + step]
        yield b, t, targets[b, t]


@torch.no_grad()
def t3_log_probs(
    model: Any, classifier: T3Classifier, input_ids: torch.Tensor, labels: torch.Tensor,
    attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None, *,
    temperature: float | None = None, tilt_weight: float | None = None, log_f_floor: float | None = None,
    allow_temperature_below_one: bool = False, check_base_weights: bool = True, scoring_memory: int | None = None,
) -> torch.Tensor:
    """Per-token T3 log-probabilities of ``labels`` (``[B, L]``, aligned like ``label_log_probs``) scored
    in chunks that fit ``scoring_memory`` bytes. Another base and an input past its positions are refused."""
    temperature = classifier.config.temperature if temperature is None else temperature
    tilt_weight = classifier.config.tilt_weight if tilt_weight is None else tilt_weight
    log_f_floor = classifier.config.log_f_floor if log_f_floor is None else log_f_floor
    validate_t3_arguments(temperature, tilt_weight, allow_temperature_below_one, log_f_floor)
    classifier.check_finite()
    classifier.check_base(model, check_weights=check_base_weights)
    logits, pooled = _base_pass(model, classifier, input_ids, attention_mask, position_ids)
    result = torch.zeros(labels.shape, dtype=torch.float32, device=logits.device)
    head_device = classifier.device
    for b, t, y in _answer_chunks(labels, logits, scoring_memory):
        guidance = classifier(pooled[b, t].to(head_device)).logits.to(logits.device)
        log_q = tilted_log_probs(logits[b, t], guidance, temperature, tilt_weight, log_f_floor)
        result[b, t + 1] = log_q.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    return result


@torch.no_grad()
def t3_candidate_log_probs(
    model: Any, classifier: T3Classifier, input_ids: torch.Tensor, labels: torch.Tensor,
    attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None, settings: Sequence[tuple[float, float]],
    *, greedy_settings: Sequence[tuple[float, float]] = (), log_f_floor: float | None = None,
    scoring_memory: int | None = None,
) -> torch.Tensor:
    """``[B, L, K + G]`` from one forward of the base: the log-probabilities of ``labels`` under the ``K``
    ``settings``, then the greedy regrets of the ``G`` ``greedy_settings`` (settings and head checked by the caller).
    """
    log_f_floor = classifier.config.log_f_floor if log_f_floor is None else log_f_floor
    logits, pooled = _base_pass(model, classifier, input_ids, attention_mask, position_ids)
    k = len(settings)
    result = torch.zeros((*labels.shape, k + len(greedy_settings)), dtype=torch.float32, device=logits.device)
    head_device = classifier.device
    for b, t, y in _answer_chunks(labels, logits, scoring_memory):
        guidance = classifier(pooled[b, t].to(head_device)).logits.to(logits.device)
        if k:
            result[b, t + 1, :k] = candidate_answer_log_probs(logits[b, t], guidance, y, settings, log_f_floor)
        if greedy_settings:
            result[b, t + 1, k:] = greedy_regret(logits[b, t], guidance, list(greedy_settings), log_f_floor)
    return result


def t3_scorer(
    model: Any, classifier: T3Classifier, temperature: float | None = None, tilt_weight: float | None = None,
    **kwargs: Any,
) -> TokenScorer:
    """A :data:`hf_unlearn.logprobs.TokenScorer` under T3; ``kwargs`` go to :func:`t3_log_probs`."""
    temperature = classifier.config.temperature if temperature is None else temperature
    tilt_weight = classifier.config.tilt_weight if tilt_weight is None else tilt_weight
    log_f_floor = kwargs.get("log_f_floor")
    validate_t3_arguments(temperature, tilt_weight, kwargs.get("allow_temperature_below_one", False),
                          classifier.config.log_f_floor if log_f_floor is None else log_f_floor)
    classifier.check_finite()
    classifier.check_base(model, check_weights=kwargs.get("check_base_weights", True))

    def scorer(input_ids, attention_mask, position_ids, labels):
        return t3_log_probs(
            model, classifier, input_ids, labels, attention_mask, position_ids,
            temperature=temperature, tilt_weight=tilt_weight, **kwargs,
        )

    return scorer
