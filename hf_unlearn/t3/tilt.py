"""Temper-Then-Tilt: the tempered and tilted candidate distribution, as pure tensor functions.

T3 samples the next token from

    q(v | x, y_<t) = p(v | x, y_<t)^(1/T) * f(x, y_<t v)^w / Z,    v in C_t,

i.e. ``log q = log_softmax_{v in C_t}( log p(v) / T + w * log f(x, y_<t v) )``, where ``p`` is the
frozen base model, ``T >= 1`` the temperature (tempering flattens the memorised peaks that a tilt
alone cannot suppress), ``f = P(S = 1 | x, y)`` the retain-vs-forget classifier, ``w`` the tilt
weight (1 in the paper) and ``C_t`` the candidate set: the top-k tokens of the tempered
distribution (the same as the top-k of ``p``; for teacher-forced scoring the target token is
added when it is not among them). Tokens outside ``C_t`` have probability 0.
"""

from __future__ import annotations

import torch


def top_k_candidates(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k candidates of the tempered distribution and their base log-probabilities.

    ``logits`` is ``[..., V]``; returns ``(ids [..., k], log_p [..., k])`` with
    ``log_p = log_softmax(logits)[ids]``. Tempering by ``T > 0`` does not change the ranking, so
    the top-k of ``softmax(logits / T)`` are the top-k of ``logits``.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}.")
    k = min(int(top_k), logits.shape[-1])
    log_p = torch.log_softmax(logits.float(), dim=-1)
    cand_log_p, cand_ids = log_p.topk(k, dim=-1)
    return cand_ids, cand_log_p


def candidates_with_target(
    logits: torch.Tensor, targets: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Candidate set ``C_t = topk(p) U {target}`` for teacher-forced scoring.

    ``logits`` ``[..., V]`` and ``targets`` ``[...]``. Returns ``(ids [..., k+1], log_p [..., k+1],
    valid [..., k+1], target_slot [...])``: the first ``k`` slots are the top-k, the last holds the
    target and is invalid (a duplicate) when the target is already in the top-k; ``target_slot``
    indexes the slot holding the target.
    """
    ids, _ = top_k_candidates(logits, top_k)
    log_p_full = torch.log_softmax(logits.float(), dim=-1)
    ids = torch.cat([ids, targets.unsqueeze(-1)], dim=-1)
    cand_log_p = log_p_full.gather(-1, ids)
    in_top = ids[..., :-1] == targets.unsqueeze(-1)
    found = in_top.any(-1)
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[..., -1] = ~found
    k = ids.shape[-1] - 1
    target_slot = torch.where(found, in_top.float().argmax(-1), torch.full_like(targets, k))
    return ids, cand_log_p, valid, target_slot


def tilted_log_probs(
    cand_log_p: torch.Tensor,
    cand_log_f: torch.Tensor,
    temperature: float,
    tilt_weight: float = 1.0,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """``log q(v) = log_softmax_{v in C}( log p(v) / T + w * log f(v) )`` over the candidate axis.

    All inputs are ``[..., k]`` (``valid`` optional, False entries get ``-inf``). ``log p`` may be
    shifted by any per-row constant (e.g. raw logits): the softmax removes it.
    """
    z = cand_log_p.float() / float(temperature) + float(tilt_weight) * cand_log_f.float()
    if valid is not None:
        z = z.masked_fill(~valid, float("-inf"))
    return torch.log_softmax(z, dim=-1)


def scatter_to_vocab(cand_ids: torch.Tensor, cand_values: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Full-vocabulary scores: ``cand_values`` at ``cand_ids``, ``-inf`` everywhere else."""
    out = torch.full((*cand_ids.shape[:-1], vocab_size), float("-inf"), dtype=cand_values.dtype, device=cand_values.device)
    return out.scatter(-1, cand_ids, cand_values)


def pool_candidates(
    prefix_sum: torch.Tensor, prefix_count: torch.Tensor, cand_hidden: torch.Tensor, pooling: str
) -> torch.Tensor:
    """Pooled state of ``(x, y_<t v)`` for each candidate ``v``.

    ``prefix_sum`` ``[..., H]`` is the sum of the chosen layer's hidden states over the answer
    tokens ``y_<t``, ``prefix_count`` ``[...]`` their number, ``cand_hidden`` ``[..., k, H]`` the
    hidden state of each candidate placed at position ``t``. ``"mean"``:
    ``(sum_{s<t} h_s + h_v) / (n_<t + 1)``; ``"last"``: ``h_v``.
    """
    if pooling == "last":
        return cand_hidden.float()
    if pooling != "mean":
        raise ValueError(f"Unknown pooling {pooling!r}; use 'mean' or 'last'.")
    total = prefix_sum.float().unsqueeze(-2) + cand_hidden.float()
    return total / (prefix_count.float().unsqueeze(-1).unsqueeze(-1) + 1.0)


def prefix_pooled_states(hidden: torch.Tensor, answer_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """Pooled state of every answer prefix of a teacher-forced sequence.

    ``hidden`` ``[B, L, H]``, ``answer_mask`` ``[B, L]`` (True on answer tokens). Entry ``t`` is the
    pooled state of the prefix ending at token ``t``: ``"mean"``: ``sum_{s<=t, s answer} h_s /
    #{s<=t answer}`` (a cumulative sum, so all prefixes come from one forward pass); ``"last"``:
    ``h_t``. Entries at non-answer positions are meaningless (select with ``answer_mask``).
    """
    if pooling == "last":
        return hidden.float()
    if pooling != "mean":
        raise ValueError(f"Unknown pooling {pooling!r}; use 'mean' or 'last'.")
    m = answer_mask.unsqueeze(-1).float()
    sums = (hidden.float() * m).cumsum(dim=1)
    counts = m.cumsum(dim=1).clamp_min(1.0)
    return sums / counts


def tree_attention_mask(
    key_valid: torch.Tensor, limit: torch.Tensor, self_col: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Additive 4D attention mask ``[B, 1, Q, K]`` for scoring many continuations in one forward.

    Query ``q`` of row ``b`` may attend to key ``j`` iff ``(j < limit[b, q] and key_valid[b, j])``
    or ``j == self_col[b, q]`` (a token always sees itself, so no row is fully masked). A causal
    token at column ``i`` has ``limit = i + 1``, ``self_col = i``; a candidate placed after the
    first ``t`` tokens has ``limit = t`` and ``self_col`` = its own column. Allowed entries are 0,
    the others ``finfo(dtype).min``.
    """
    k = key_valid.shape[-1]
    cols = torch.arange(k, device=key_valid.device)
    allowed = (cols.view(1, 1, k) < limit.unsqueeze(-1)) & key_valid.unsqueeze(1)
    allowed = allowed | (cols.view(1, 1, k) == self_col.unsqueeze(-1))
    mask = torch.zeros(allowed.shape, dtype=dtype, device=key_valid.device)
    mask = mask.masked_fill(~allowed, torch.finfo(dtype).min)
    return mask.unsqueeze(1)
