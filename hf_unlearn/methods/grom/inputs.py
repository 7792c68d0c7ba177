"""What :func:`~hf_unlearn.methods.grom.fit.fit_grom` checks and tokenizes before its first forward pass."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ...data.documents import as_documents, chunk_documents, chunk_length, shared_documents
from ...data.overlap import overlapping_examples
from ...data.prepare import PromptTooLongError, prepare_qa
from ...data.prompts import IGNORE_INDEX, ensure_pad_token, model_max_positions
from ...partitioning import vocab_size
from .attribution import TargetModule, lm_head_is_tied, select_targets
from .config import GROMConfig


def retain_subsample(num_rows: int, sample: int | None, seed: int) -> list[int]:
    """Sorted indices of the retain rows GROM reads: every row when ``sample`` is None or ``>= num_rows``, else
    ``sample`` rows drawn without replacement by a generator seeded with ``seed`` (the same on every process)."""
    if sample is None or sample >= num_rows:
        return list(range(num_rows))
    gen = torch.Generator().manual_seed(seed)
    return sorted(torch.randperm(num_rows, generator=gen)[:sample].tolist())


def _tokenize_rows(
    tokenizer: Any, rows: list[dict[str, Any]], max_length: int | None, limit: int | None,
    template: str | None, what: str,
) -> list[dict[str, Any]]:
    """Every row tokenized and cut to ``min(max_length, limit)`` tokens; a prompt that fills it is refused."""
    bounds = [v for v in (max_length, limit) if v is not None]
    cut = min(bounds) if bounds else None
    why = "the model's maximum positions" if cut is not None and cut == limit else "GROMConfig.max_length"
    try:
        return prepare_qa(rows, tokenizer, template=template, max_length=cut, truncation="answer")
    except PromptTooLongError as err:
        raise ValueError(f"{what} example {err.index}: {err.reason} (GROM cuts every example to {cut} tokens, "
                         f"{why}).") from err.__cause__
    except ValueError as err:  # the template (e.g. 'chat' without a chat template), refused at the first example
        raise ValueError(f"{what} example 0: {err} (GROM cuts every example to {cut} tokens, {why}).") from err


def _rows(data: Any, what: str, allow_empty: bool = False) -> list[dict[str, Any]]:
    """The rows of ``data`` as dicts with string ``question`` and non-empty ``answer``, else a ValueError."""
    if isinstance(data, (str, bytes, Mapping)):
        raise ValueError(f"The {what} set must be a list of rows or a datasets.Dataset, got a {type(data).__name__}.")
    rows = []
    for i, r in enumerate(data if data is not None else []):
        if not isinstance(r, Mapping):
            raise ValueError(f"{what} row {i} is a {type(r).__name__} ({str(r)[:40]!r}), not a dict with 'question' and "
                             "'answer' fields (pass documents as hf_unlearn.data.documents_dataset(texts)).")
        missing = [k for k in ("question", "answer") if k not in r]
        if missing:
            raise ValueError(f"{what} row {i} has no {' / '.join(repr(k) for k in missing)} field; got "
                             f"{sorted(str(k) for k in r)}")
        for k in ("question", "answer"):
            if not isinstance(r[k], str):
                raise ValueError(f"{what} row {i}: {k!r} must be a string, got {type(r[k]).__name__} ({r[k]!r:.40}).")
        if not r["answer"].strip():
            raise ValueError(f"{what} row {i} has an empty answer: fill in or remove the row.")
        rows.append(dict(r))
    if not rows and not allow_empty:
        raise ValueError(f"The {what} set is empty.")
    return rows


def _check_disjoint(
    forget_rows: list[dict[str, Any]], retain_rows: list[dict[str, Any]], generic_rows: list[dict[str, Any]],
    docs: dict[str, list[str] | None],
) -> None:
    """Refuse forget examples (rows, or documents) that also occur in the retain set or in ``generic_retain``."""
    for what, rows in (("retain", retain_rows), ("generic_retain", generic_rows)):
        if docs["forget"] is not None and docs[what] is not None:
            overlap = shared_documents(docs["forget"], docs[what])
        else:
            overlap = overlapping_examples(forget_rows, rows) if forget_rows and rows else 0
        if overlap:
            where = "the retain set" if what == "retain" else what
            raise ValueError(f"{overlap} forget examples also occur in {where}; the sets must be disjoint.")


def _answer_token_counts(features: list[dict[str, Any]], vocab: int) -> torch.Tensor:
    tokens = [t for f in features for t in f["labels"][1:] if t != IGNORE_INDEX]
    return torch.bincount(torch.tensor(tokens, dtype=torch.long), minlength=vocab)[:vocab]


def _check_vocab(model: Any, tokenizer: Any, features: list[dict[str, Any]]) -> int:
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output embeddings (LM head): GROM needs a causal LM.")
    vocab = vocab_size(model)  # from the config when the head is partitioned (ZeRO-3 / FSDP)
    if len(tokenizer) > vocab:
        raise ValueError(f"Tokenizer/model vocabulary mismatch: the tokenizer has {len(tokenizer)} tokens, the LM "
                         f"head {vocab} rows.")
    top = max(max(f["input_ids"]) for f in features)
    if top >= vocab:
        raise ValueError(f"Token id {top} is outside the model's vocabulary ({vocab}): tokenizer/model mismatch.")
    return vocab


@dataclass
class _Prepared:
    """What :func:`_prepare` returns."""

    targets: list[TargetModule]
    layered: list[TargetModule]
    heads: list[TargetModule]
    candidates: list[int]
    band: int
    retain_indices: list[int]
    forget_feats: list[dict[str, Any]]
    retain_feats: list[dict[str, Any]]
    generic_feats: list[dict[str, Any]]
    f_counts: torch.Tensor
    r_counts: torch.Tensor
    limit: int | None
    untied_lm_head: str | None


def _prepare(
    model: Any, tokenizer: Any, forget: Any, retain: Any, config: GROMConfig, generic_retain: Any
) -> _Prepared:
    """Every check of :func:`fit_grom` before its first forward pass (rows, overlap, modules, prompts, vocabulary),
    and the tokenized examples and answer-token counts."""
    if not isinstance(config, GROMConfig):
        raise ValueError(f"config must be a GROMConfig, got {type(config).__name__}")
    docs = {what: as_documents(data, plain_lists=False)
            for what, data in (("forget", forget), ("retain", retain), ("generic_retain", generic_retain))}
    forget_rows = _rows(forget, "forget") if docs["forget"] is None else []
    retain_rows = _rows(retain, "retain") if docs["retain"] is None else []
    generic_rows = (_rows(generic_retain, "generic_retain", allow_empty=True)
                    if generic_retain is not None and docs["generic_retain"] is None else [])
    if generic_retain is not None and not generic_rows and docs["generic_retain"] is None:
        raise ValueError("generic_retain is empty: pass general rows, or None for no general term.")
    _check_disjoint(forget_rows, retain_rows, generic_rows, docs)
    ensure_pad_token(tokenizer)
    targets, layered, heads, candidates, band = select_targets(model, config)
    untied = heads[0].name if heads and lm_head_is_tied(model) else None

    limit = model_max_positions(model)
    tpl = config.prompt_template

    def features(what: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if docs[what] is not None:  # every token of every chunk is predicted: every position is a key
            return chunk_documents(docs[what], tokenizer, chunk_length(config.max_length, limit))
        return _tokenize_rows(tokenizer, rows, config.max_length, limit, tpl, what)

    forget_feats = features("forget", forget_rows)
    if docs["retain"] is None:
        retain_indices = retain_subsample(len(retain_rows), config.retain_sample, config.seed)
        retain_feats = features("retain", [retain_rows[i] for i in retain_indices])
    else:  # documents: the sample is drawn over the chunks
        retain_feats = features("retain", [])
        retain_indices = retain_subsample(len(retain_feats), config.retain_sample, config.seed)
        retain_feats = [retain_feats[i] for i in retain_indices]
    generic_feats = features("generic_retain", generic_rows)
    if not forget_feats:
        raise ValueError("The forget documents make no chunk of two tokens or more: there are no forget keys.")
    vocab = _check_vocab(model, tokenizer, forget_feats + retain_feats + generic_feats)
    f_counts = _answer_token_counts(forget_feats, vocab)
    r_counts = _answer_token_counts(retain_feats, vocab)
    if int(f_counts.sum()) == 0:
        raise ValueError("The forget set has no answer tokens (every label is -100, e.g. cut off by max_length).")
    return _Prepared(targets, layered, heads, candidates, band, retain_indices, forget_feats, retain_feats,
                     generic_feats, f_counts, r_counts, limit, untied)
