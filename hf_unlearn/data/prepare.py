"""One way from question/answer rows to tokenized features: :func:`prepare_qa`.

Every row goes through :func:`hf_unlearn.data.tokenize_qa` with the same ``template``, so the features are the ones
the trainers train on and the evaluator scores: ``{"input_ids", "attention_mask", "labels", "prompt_length"}``
per row (``labels`` is ``-100`` on prompt tokens, lists are unpadded; :func:`hf_unlearn.data.collate_qa` pads
them). What happens to an example longer than ``max_length`` is an explicit policy (``truncation``):

* ``"answer"`` (default): the end of the answer is cut so that the sequence has ``max_length`` tokens and the
  prompt is kept whole; a prompt that leaves no room for one answer token (``prompt_length + 1 > max_length``)
  is refused with a :class:`PromptTooLongError` naming the row. This is ``tokenize_qa(..., max_length)``.
* ``"end"``: the token lists are cut to their first ``max_length`` entries and nothing is refused;
  ``prompt_length`` stays the prompt's full token length, so a row whose prompt fills ``max_length`` comes back
  with no answer label (callers that need one check ``labels``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from .prompts import PromptTemplate, resolve_template, tokenize_qa

Truncation = Literal["answer", "end"]
TRUNCATIONS: tuple[str, ...] = ("answer", "end")

__all__ = ["TRUNCATIONS", "PromptTooLongError", "Truncation", "prepare_qa"]


class PromptTooLongError(ValueError):
    """A row's prompt leaves no room for an answer token within ``max_length`` (``truncation="answer"``).

    ``index`` is the row's position in the input and ``reason`` the message of
    :func:`hf_unlearn.data.tokenize_qa`; the error's text is ``"row {index}: {reason}"``.
    """

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"row {index}: {reason}")
        self.index = index
        self.reason = reason


def _check_row(i: int, row: Any) -> None:
    if not isinstance(row, Mapping):
        raise ValueError(
            f"row {i} is a {type(row).__name__}, not a dict: rows need 'question' and 'answer' string fields."
        )
    missing = [k for k in ("question", "answer") if k not in row]
    if missing:
        raise ValueError(
            f"row {i} has no {' / '.join(repr(k) for k in missing)} field; rows need 'question' and 'answer' "
            f"string fields, got {sorted(str(k) for k in row)}."
        )
    for k in ("question", "answer"):
        if not isinstance(row[k], str):
            raise ValueError(f"row {i}: {k!r} must be a string, got {type(row[k]).__name__} ({row[k]!r:.40}).")
        try:
            row[k].encode("utf-8")
        except UnicodeEncodeError as err:
            raise ValueError(f"row {i}: {k!r} holds a lone surrogate ({row[k][err.start]!r} at character {err.start}), "
                             "which is not valid Unicode text.") from None


def prepare_qa(
    rows: Iterable[Mapping[str, Any]], tokenizer: Any, *, template: str | PromptTemplate | None = None,
    max_length: int | None = None, truncation: Truncation = "answer", validate: bool = True,
    return_truncated: bool = False,
) -> list[dict[str, Any]] | tuple[list[dict[str, Any]], int]:
    """Tokenized features of question/answer ``rows`` (a list of dicts or a ``datasets.Dataset``), in order.

    ``template``: a preset name, a :class:`~hf_unlearn.data.PromptTemplate` or ``None`` (the tokenizer's chat
    template when it has one, else ``plain``). ``max_length``: the longest sequence kept (``None``: no limit);
    what happens to a longer one is ``truncation`` (see the module docstring: ``"answer"`` cuts the answer end and
    refuses a prompt that leaves no answer token, ``"end"`` cuts the lists and refuses nothing). ``validate``:
    check every row (a mapping with string ``question`` and ``answer``) before any tokenization, raising a
    ``ValueError`` naming the first bad row; ``False`` hands the rows to ``tokenize_qa`` as they are (for callers
    that check their rows themselves). ``return_truncated``: also return how many rows were longer than
    ``max_length`` (a pair ``(features, truncated)``).
    """
    if truncation not in TRUNCATIONS:
        raise ValueError(f"truncation must be one of {', '.join(map(repr, TRUNCATIONS))}, got {truncation!r}.")
    rows = list(rows)
    if validate:
        for i, row in enumerate(rows):
            _check_row(i, row)
    t = resolve_template(tokenizer, template) if rows else template
    features: list[dict[str, Any]] = []
    truncated = 0
    for i, row in enumerate(rows):
        f = tokenize_qa(tokenizer, row["question"], row["answer"], template=t)
        n = len(f["input_ids"])
        if max_length is not None and n > max_length:
            truncated += 1
        if max_length is not None and truncation == "answer" and (n > max_length or f["prompt_length"] + 1 > max_length):
            try:
                f = tokenize_qa(tokenizer, row["question"], row["answer"], max_length, template=t)
            except ValueError as err:
                raise PromptTooLongError(i, str(err)) from err
        elif max_length is not None and truncation == "end" and n > max_length:
            f = {k: (v[:max_length] if isinstance(v, list) else v) for k, v in f.items()}
        features.append(f)
    return (features, truncated) if return_truncated else features
