"""What :func:`~hf_unlearn.methods.t3.fit.fit_t3` does before it trains the head: the checks before any work, and
one no-grad pass of the frozen base keeping ``pool_t`` and ``y_{t+1}`` at every position whose next token is an
answer token.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
from tqdm.auto import tqdm

from ...data.documents import as_documents, chunk_documents, chunk_length, shared_documents
from ...data.overlap import overlapping_examples
from ...data.prepare import prepare_qa
from ...data.prompts import IGNORE_INDEX, collate_qa
from .config import T3ClassifierConfig
from .hidden import causal_mean_pool, layer_hidden, model_max_positions


def _rows(data: Any, name: str) -> list[dict[str, Any]]:
    if data is None:
        raise ValueError(f"The {name} set is missing.")
    rows = data if isinstance(data, list) else [dict(r) for r in data]
    if len(rows) == 0:
        raise ValueError(f"The {name} set is empty: T3 needs forget and retain examples to fit its head.")
    if "question" not in rows[0] or "answer" not in rows[0]:
        raise ValueError(f"{name} rows need 'question' and 'answer' fields, got {sorted(rows[0])}; pass documents "
                         "as hf_unlearn.data.documents_dataset(texts), a path or [{'text': ...}, ...].")
    return rows


def _tokenize(
    tokenizer: Any, rows: list[dict[str, Any]], limit: int | None, template: str | None
) -> tuple[list[dict[str, Any] | None], int, list[tuple[int, int]]]:
    """``(features, None where no answer token is left; number truncated; [(row, prompt length)])``."""
    out: list[dict[str, Any] | None] = []
    full: list[tuple[int, int]] = []
    feats, truncated = prepare_qa(
        rows, tokenizer, template=template, max_length=limit, truncation="end", validate=False, return_truncated=True
    )
    for i, f in enumerate(feats):
        if any(lab != IGNORE_INDEX for lab in f["labels"][1:]):
            out.append(f)
        else:
            out.append(None)
            full.append((i, int(f["prompt_length"])))
    return out, truncated, full


def _refuse_full_prompts(name: str, rows: list[dict[str, Any]], full: list[tuple[int, int]], limit: int | None) -> None:
    if not full:
        return
    shown = "; ".join(
        f"row {i} ({length} prompt tokens, question {str(rows[i]['question'])[:40]!r})" for i, length in full[:5]
    ) + (f"; and {len(full) - 5} more" if len(full) > 5 else "")
    raise ValueError(f"{len(full)} {name} row(s) leave no answer token within the first {limit} positions (the "
                     f"prompt alone fills them): {shown}; shorten the questions, raise max_length or remove the rows.")


@dataclass
class _Prepared:
    config: T3ClassifierConfig
    forget_rows: list[dict[str, Any]]
    retain_rows: list[dict[str, Any]]
    forget_feats: list[dict[str, Any]]
    retain_feats: list[dict[str, Any]]
    truncated: int
    limit: int | None


def _prepare(model: Any, tokenizer: Any, forget: Any, retain: Any, config: T3ClassifierConfig | None,
             overrides: dict[str, Any], fingerprint: bool) -> _Prepared:
    """Every check of :func:`fit_t3` before its first forward pass (settings, layer, rows, overlap, prompts that fill
    the positions: refused, never dropped) and the tokenized examples."""
    config = config or T3ClassifierConfig()
    if overrides:
        known = {f.name for f in fields(T3ClassifierConfig)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"fit_t3 got unknown settings {unknown}; T3ClassifierConfig fields are {sorted(known)}.")
        data = {k: v for k, v in config.to_dict().items() if k in known}
        data.update(overrides)
        config = T3ClassifierConfig(**data)
    config.check_for(model)
    forget_docs, retain_docs = as_documents(forget, plain_lists=False), as_documents(retain, plain_lists=False)
    forget_rows = _rows(forget, "forget") if forget_docs is None else []
    retain_rows = _rows(retain, "retain") if retain_docs is None else []
    if forget_docs is not None and retain_docs is not None:
        overlap = shared_documents(forget_docs, retain_docs)
    else:
        overlap = overlapping_examples(forget_rows, retain_rows)
    if overlap:
        raise ValueError(f"{overlap} forget examples also occur in the retain set; the sets must be disjoint.")
    limit = model_max_positions(model)
    if config.max_length is not None:
        limit = int(config.max_length) if limit is None else min(limit, int(config.max_length))

    def features(name: str, rows: list[dict[str, Any]], docs: list[str] | None) -> tuple[list[Any], list[Any], int]:
        """``(features, rows, truncated)``; a document chunk predicts every token and is one example."""
        if docs is not None:
            feats = chunk_documents(docs, tokenizer, chunk_length(None, limit))
            if not feats:
                raise ValueError(f"The {name} documents make no chunk of two tokens or more: nothing to fit on.")
            return feats, [{"text": name} for _ in feats], 0
        feats, cut, full = _tokenize(tokenizer, rows, limit, config.prompt_template)
        _refuse_full_prompts(name, rows, full, limit)
        return feats, rows, cut

    forget_feats, forget_rows, forget_cut = features("forget", forget_rows, forget_docs)
    retain_feats, retain_rows, retain_cut = features("retain", retain_rows, retain_docs)
    if fingerprint:
        config = config.for_base(model)
    return _Prepared(config, forget_rows, retain_rows, forget_feats, retain_feats, forget_cut + retain_cut, limit)


@torch.no_grad()
def cache_answer_states(
    model: Any, features: list[dict[str, Any] | None], layer: int, pad_token_id: int, *, batch_size: int = 16,
    progress: bool = True, desc: str = "caching pooled states", cache_device: str | torch.device | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(pool_t [N, H], y_{t+1} [N], example index [N])`` for every position ``t`` whose next token is an answer
    token, in the base's dtype on ``cache_device`` (default: the base's device)."""
    device = next(model.parameters()).device
    store = device if cache_device is None else torch.device(cache_device)
    keep = [i for i, f in enumerate(features) if f is not None]
    order = sorted(keep, key=lambda i: len(features[i]["input_ids"]))
    pooled_parts, token_parts, owner_parts = [], [], []
    for start in tqdm(range(0, len(order), batch_size), desc=desc, disable=not progress, leave=False):
        idx = order[start : start + batch_size]
        batch = collate_qa([features[i] for i in idx], pad_token_id, "right")
        batch = {k: v.to(device) for k, v in batch.items()}
        hidden = layer_hidden(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"], layer)
        pooled = causal_mean_pool(hidden, batch["attention_mask"])
        rows, cols = (batch["labels"][:, 1:] != IGNORE_INDEX).nonzero(as_tuple=True)
        pooled_parts.append(pooled[rows, cols].to(device=store, dtype=hidden.dtype))
        token_parts.append(batch["input_ids"][rows, cols + 1].to(store))
        owner_parts.append(torch.tensor(idx, device=device)[rows].to(store))
    if not pooled_parts:
        raise ValueError("No example has an answer token to fit on.")
    return torch.cat(pooled_parts), torch.cat(token_parts), torch.cat(owner_parts)


def cache_fit_states(
    model: Any, prep: _Prepared, pad_id: int, progress: bool, cache_device: str | torch.device | None = None
) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """:func:`cache_answer_states` of the prepared forget and retain examples, the base in eval mode."""
    config = prep.config
    was_training = model.training
    model.eval()
    try:
        kw = dict(batch_size=int(config.batch_size), progress=progress, cache_device=cache_device)
        forget = cache_answer_states(model, prep.forget_feats, config.layer, pad_id, desc="caching forget", **kw)
        retain = cache_answer_states(model, prep.retain_feats, config.layer, pad_id, desc="caching retain", **kw)
    finally:
        if was_training:
            model.train()
    return forget, retain
