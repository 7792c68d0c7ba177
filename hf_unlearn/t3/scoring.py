"""Teacher-forced log-probabilities under the T3 distribution, and a TOFU-evaluator token scorer.

For every answer token ``y_t``::

    log q(y_t | x, y_<t) = log_softmax_{v in C_t}( log p(v | x, y_<t) / T + w log f(x, y_<t v) )[y_t]
    C_t = topk_k(p(. | x, y_<t)) U {y_t}

(the target is always a candidate so that every answer has a finite likelihood; when it is in the
top-k this is exactly the distribution :class:`T3LogitsProcessor` samples from). All candidates of
all positions are scored in one extra forward of the decoder that reuses the KV cache of the
teacher-forced pass (a tree attention mask places candidate ``v`` of position ``t`` at position
``t``, attending to ``x, y_<t`` and itself), chunked to bound memory.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache

from ..data.prompts import IGNORE_INDEX
from ..logprobs import TokenScorer
from .hidden import cache_kwargs, check_attention, crop_cache_to, layer_hidden, positions_from_mask
from .modeling import T3Classifier
from .processor import validate_t3_arguments
from .tilt import candidates_with_target, pool_candidates, tilted_log_probs, tree_attention_mask


@torch.no_grad()
def t3_log_probs(
    model: Any,
    classifier: T3Classifier,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    *,
    temperature: float = 2.0,
    top_k: int = 20,
    tilt_weight: float = 1.0,
    allow_temperature_below_one: bool = False,
    check_base_name: bool = True,
    max_candidate_tokens: int = 8192,
    return_details: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token T3 log-probabilities of ``labels`` (``[B, L]``, aligned like
    :func:`hf_unlearn.logprobs.label_log_probs`: ``out[:, t] = log q(labels[:, t] | input_ids[:, :t])``,
    0 where ``labels == -100`` and at ``t = 0``).

    Answer tokens (``labels != -100``) are the tokens the classifier pools over. With
    ``return_details`` also returns the per-position candidate ids, validity and log q
    (``[B, A, k+1]``) and the answer positions ``[B, A]`` (``-1`` = padding slot).
    """
    validate_t3_arguments(temperature, top_k, tilt_weight, allow_temperature_below_one)
    classifier.check_base(model, check_name=check_base_name)
    check_attention(model)
    device = input_ids.device
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if position_ids is None:
        position_ids = positions_from_mask(attention_mask)
    layer, pooling = int(classifier.config.layer), classifier.config.pooling
    batch, length = input_ids.shape

    cache = DynamicCache(config=model.config)
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=True,
        output_hidden_states=True,
        **cache_kwargs(model, cache),
    )
    logits, hidden = out.logits, out.hidden_states[layer]

    answer = (labels != IGNORE_INDEX) & attention_mask.bool()
    scored = answer.clone()
    scored[:, 0] = False
    n_pos = int(scored.sum(-1).max().item()) if scored.any() else 0
    result = torch.zeros(labels.shape, dtype=torch.float32, device=device)
    if n_pos == 0:
        return (result, {}) if return_details else result
    # Answer positions of each row, padded with -1.
    order = torch.sort((~scored).to(torch.int8), dim=-1, stable=True).indices[:, :n_pos]
    slot_valid = scored.gather(1, order)
    pos_idx = torch.where(slot_valid, order, torch.zeros_like(order))

    # Exclusive prefix sums of the answer tokens' hidden states (the y_<t part of the pooling).
    m = answer.unsqueeze(-1).to(torch.float32)
    h = hidden.float() * m
    sums_excl = h.cumsum(1) - h
    counts_excl = m.squeeze(-1).cumsum(1) - m.squeeze(-1)
    gather_h = pos_idx.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
    prefix_sum = sums_excl.gather(1, gather_h)
    prefix_count = counts_excl.gather(1, pos_idx)

    prev_logits = logits.gather(1, (pos_idx - 1).clamp_min(0).unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
    targets = labels.gather(1, pos_idx).masked_fill(~slot_valid, 0)
    cand_ids, cand_log_p, valid, target_slot = candidates_with_target(prev_logits, targets, top_k)
    k1 = cand_ids.shape[-1]

    dtype = model.dtype if model.dtype.is_floating_point else torch.float32
    chunk = max(1, int(max_candidate_tokens) // max(1, batch * k1))
    cand_hidden = []
    for start in range(0, n_pos, chunk):
        sl = slice(start, min(start + chunk, n_pos))
        a = sl.stop - sl.start
        tokens = cand_ids[:, sl].reshape(batch, a * k1)
        limit = torch.where(slot_valid[:, sl], pos_idx[:, sl], torch.zeros_like(pos_idx[:, sl]))
        limit = limit.repeat_interleave(k1, dim=1)
        self_col = (length + torch.arange(a * k1, device=device)).expand(batch, -1)
        key_valid = torch.cat([attention_mask.bool(), torch.ones_like(tokens, dtype=torch.bool)], dim=-1)
        mask = tree_attention_mask(key_valid, limit, self_col, dtype)
        pos = position_ids.gather(1, pos_idx[:, sl]).repeat_interleave(k1, dim=1)
        hc = layer_hidden(model, tokens, mask, pos, layer, past_key_values=cache)
        crop_cache_to(cache, length)
        cand_hidden.append(hc.reshape(batch, a, k1, -1))
    cand_hidden = torch.cat(cand_hidden, dim=1)

    pooled = pool_candidates(prefix_sum, prefix_count, cand_hidden, pooling)
    log_f = classifier.log_f(pooled.to(classifier.device)).to(device)
    log_q = tilted_log_probs(cand_log_p, log_f, temperature, tilt_weight, valid=valid)
    target_lp = log_q.gather(-1, target_slot.unsqueeze(-1)).squeeze(-1).masked_fill(~slot_valid, 0.0)
    result.scatter_(1, pos_idx, target_lp * slot_valid)
    # Padding slots scatter 0 onto position 0, which is never scored.
    result[:, 0] = 0.0
    if return_details:
        details = {
            "candidate_ids": cand_ids,
            "valid": valid & slot_valid.unsqueeze(-1),
            "log_q": log_q,
            "log_f": log_f,
            "positions": torch.where(slot_valid, pos_idx, torch.full_like(pos_idx, -1)),
            "target_slot": target_slot,
        }
        return result, details
    return result


def t3_scorer(
    model: Any,
    classifier: T3Classifier,
    temperature: float = 2.0,
    top_k: int = 20,
    tilt_weight: float = 1.0,
    **kwargs: Any,
) -> TokenScorer:
    """A :data:`hf_unlearn.logprobs.TokenScorer` scoring answers under T3 (for ``answer_log_likelihoods``
    and the TOFU evaluator's ``scorer=``). Arguments are validated once, here."""
    validate_t3_arguments(temperature, top_k, tilt_weight, kwargs.get("allow_temperature_below_one", False))
    classifier.check_base(model, check_name=kwargs.get("check_base_name", True))
    check_attention(model)

    def scorer(input_ids, attention_mask, position_ids, labels):
        return t3_log_probs(
            model, classifier, input_ids, labels, attention_mask, position_ids,
            temperature=temperature, top_k=top_k, tilt_weight=tilt_weight, **kwargs,
        )

    return scorer
