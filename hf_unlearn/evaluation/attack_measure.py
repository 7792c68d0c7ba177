"""What the attacks measure on the caller's model and on each attacked copy (:func:`_measure`: ``forget_nll``,
``forget_rouge_l`` and a criterion's dict, through a :class:`~hf_unlearn.result.Decoding` made for each model), and
``recovered_fraction = (unlearned - attacked) / (unlearned - original)``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from accelerate.utils import is_peft_model

from ..data.documents import as_documents, chunk_length, document_heads, is_document_rows
from ..data.prompts import PromptTemplate
from ..logprobs import answer_nll as _answer_nll
from ..logprobs import effective_max_length, feature_token_statistics
from ..registry import decoding_of
from ..result import Decoding
from .generation import generate_answers
from .rouge import rouge_l_recall

MIN_GAP = 1e-6
"""Below this unlearning gap (NLL nats or ROUGE-L) a recovered fraction is undefined (``None``)."""


DEFAULT_ATTACK_MAX_NEW_TOKENS = 64
"""Greedy answer length of the attacks' ROUGE-L (TOFU answers are one or two sentences)."""


DECODING_KEPT = "base model attacked; decoding-time artifact kept, not refitted"

DecodingFactory = Callable[..., Decoding]
"""``decoding(model, check_base_weights=True) -> Decoding``: how to score and generate on one model (the caller's
or an attacked copy, which is checked with ``check_base_weights=False``)."""


def artifact_decoding(artifact: Any) -> DecodingFactory:
    """The :data:`DecodingFactory` of a decoding-time ``artifact``, by its method's ``decoding`` hook
    (:func:`hf_unlearn.registry.decoding_of`); the artifact is kept as fitted on every model. Refused (``ValueError``)
    for an artifact of no registered decoding-time method."""
    hook = decoding_of(artifact)
    if hook is None:
        raise ValueError(f"Cannot score through a {type(artifact).__name__}: it is not the artifact of a registered decoding-time method.")

    def decoding(model: Any, check_base_weights: bool = True) -> Decoding:
        return hook(model, artifact, check_base_weights=check_base_weights)

    return decoding


def _check_rows(rows: Sequence[Mapping[str, Any]], name: str, minimum: int = 1) -> list[Mapping[str, Any]]:
    """Question/answer rows as given, or documents (:func:`hf_unlearn.data.documents.as_documents`) as ``{"text"}`` rows."""
    docs = as_documents(rows)
    rows = [{"text": d} for d in docs] if docs is not None else list(rows)
    if len(rows) < minimum:
        raise ValueError(f"{name} needs at least {minimum} row(s), got {len(rows)}.")
    for i, row in enumerate(rows):
        if docs is None and (not isinstance(row, Mapping) or "question" not in row or "answer" not in row):
            raise ValueError(f"{name} row {i} needs 'question' and 'answer' fields.")
    return rows


def _check_model(model: Any) -> None:
    if getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False):
        raise ValueError("The attacks need the full-precision (merged) model, not an already quantized one.")
    if not is_peft_model(model) and not hasattr(model, "save_pretrained"):
        raise ValueError(f"The attacks need a transformers PreTrainedModel or a PeftModel, got {type(model).__name__}.")


@contextlib.contextmanager
def _scoring(model: Any, decoding: DecodingFactory | None,
             attacked: bool) -> Iterator[tuple[Any, dict[str, Any] | None]]:
    """``(scorer, generation_kwargs)`` of ``model``: plain, or ``decoding``'s on this very model (closed on exit).
    The base check runs on the caller's model; an ``attacked`` copy is the base changed on purpose."""
    if decoding is None:
        yield None, None
        return
    if not callable(decoding):
        raise ValueError("decoding must be a callable (model, check_base_weights=True) -> Decoding.")
    with decoding(model, check_base_weights=not attacked) as plan:
        yield plan.scorer, plan.generation_kwargs


def _measure(
    model: Any, tokenizer: Any, rows: Sequence[Mapping[str, Any]], *, decoding: DecodingFactory | None,
    criterion: Any, template: PromptTemplate, batch_size: int, max_new_tokens: int, rouge: bool,
    progress: bool, desc: str, attacked: bool = False,
) -> dict[str, Any]:
    """Forget NLL, forget ROUGE-L (when ``rouge``) and the criterion's dict of one model on ``rows``.

    For documents (``{"text"}`` rows) the forget NLL is the mean over documents of the average NLL of every token
    of each document's first chunk (:func:`_document_features`); ROUGE-L is ``None`` (there is no question to
    answer)."""
    with _scoring(model, decoding, attacked) as (scorer, generation_kwargs):
        if is_document_rows(rows):
            nll = feature_token_statistics(model, tokenizer, _document_features(model, tokenizer, rows), scorer=scorer,
                                           batch_size=batch_size, progress=progress, desc=f"{desc}: documents").avg_nll
        else:
            questions, answers = [r["question"] for r in rows], [r["answer"] for r in rows]
            nll = _answer_nll(model, tokenizer, questions, answers, scorer=scorer, batch_size=batch_size,
                              template=template, progress=progress, desc=f"{desc}: answers")
        out: dict[str, Any] = {"forget_nll": float(np.mean(nll)), "forget_rouge_l": None}
        if rouge and not is_document_rows(rows):
            generations = generate_answers(model, tokenizer, questions, batch_size=batch_size,
                                           max_new_tokens=max_new_tokens, generation_kwargs=generation_kwargs,
                                           template=template, progress=progress, desc=f"{desc}: generating")
            out["forget_rouge_l"] = float(np.mean(rouge_l_recall(generations, answers)))
        if criterion is not None:
            out["criterion"] = dict(criterion.measure(model, tokenizer, scorer=scorer))
    return out


def _document_features(model: Any, tokenizer: Any, rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each document's first chunk, loss on every token: its first ``min(max positions, 2048)`` tokens
    (:func:`hf_unlearn.data.documents.document_heads`)."""
    return document_heads([r["text"] for r in rows], tokenizer, chunk_length(None, effective_max_length(model)))[0]


def recovered_fraction(unlearned: float | None, attacked: float | None, original: float | None) -> float | None:
    """Share of the unlearning gap an attack recovered: ``(unlearned - attacked) / (unlearned - original)``, for
    losses and scores alike; ``None`` when a figure is missing or ``|unlearned - original| < MIN_GAP``."""
    if unlearned is None or attacked is None or original is None:
        return None
    gap = unlearned - original
    if abs(gap) < MIN_GAP:
        return None
    return float((unlearned - attacked) / gap)


def _recovery(before: Mapping[str, Any], after: Mapping[str, Any], original: Mapping[str, Any] | None) -> dict:
    return {f"recovered_fraction{suffix}": None if original is None else recovered_fraction(before[k], after[k], original[k])
            for suffix, k in (("", "forget_nll"), ("_rouge_l", "forget_rouge_l"))}


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")


def _check_criterion(criterion: Any) -> None:
    if criterion is not None and not callable(getattr(criterion, "measure", None)):
        raise ValueError("criterion must have a measure(model, tokenizer, scorer=None) method.")
