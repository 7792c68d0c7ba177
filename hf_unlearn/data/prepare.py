"""One way from question/answer rows to tokenized features: :func:`prepare_qa` (:func:`~hf_unlearn.data.tokenize_qa`
per row). An example longer than ``max_length`` follows ``truncation``: ``"answer"`` (default) cuts the answer end
and refuses (:class:`PromptTooLongError`) a prompt that leaves no answer token; ``"end"`` cuts the token lists and
refuses nothing (``prompt_length`` stays the full prompt's)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from .prompts import PromptTemplate, resolve_template, tokenize_qa

Truncation = Literal["answer", "end"]
TRUNCATIONS: tuple[str, ...] = ("answer", "end")


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
    """Tokenized features of question/answer ``rows``, in order; a longer row than ``max_length`` follows
    ``truncation`` (module docstring). ``validate`` checks every row first (``ValueError`` naming the first bad
    one); ``return_truncated`` also returns how many rows were longer (``(features, truncated)``)."""
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
