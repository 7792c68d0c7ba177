"""The reference-free criterion (:class:`SelectionCriterion`): what it measures on a candidate, and the
record an artifact carries (:func:`selection_record_of`)."""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..data.documents import is_document_rows
from .record import (
    DEFAULT_HOLDOUT_LEVEL,
    DEFAULT_HOLDOUT_MARGIN,
    DEFAULT_RETAIN_TOLERANCE,
    SELECTION_RECORD,
    SelectionRecord,
    _finite,
    _row_nlls,
    forget_holdout_statistics,
    select_candidate,
)

#: TOFU's rows come in blocks of one author each: 20 question/answer pairs, in order.
TOFU_AUTHOR_ROWS = 20


def _resolve_groups(groups: Any, n_forget: int, n_holdout: int) -> tuple[list[Any], list[Any]] | None:
    """Per-row group labels of the forget and holdout rows: ``None`` (every row its own group),
    ``"tofu_authors"`` (blocks of :data:`TOFU_AUTHOR_ROWS` consecutive rows), an int (blocks of that many
    consecutive rows) or ``(forget labels, holdout labels)``. Labels are taken per side (forget group ``a`` and
    holdout group ``a`` are different groups)."""
    if groups is None:
        return None
    if groups == "tofu_authors":
        groups = TOFU_AUTHOR_ROWS
    if isinstance(groups, str):
        raise ValueError(f"groups must be None, 'tofu_authors', a block size or (forget labels, holdout labels); "
                         f"got {groups!r}.")
    if isinstance(groups, int) and not isinstance(groups, bool):
        if groups < 1:
            raise ValueError(f"A group block size must be >= 1, got {groups}.")
        bad = [f"{side} ({n} rows)" for side, n in (("forget", n_forget), ("holdout", n_holdout)) if n % groups]
        if bad:
            raise ValueError(f"Groups of {groups} consecutive rows need a multiple of {groups} rows: {', '.join(bad)}.")
        labels = [i // groups for i in range(n_forget)], [i // groups for i in range(n_holdout)]
    else:
        try:
            forget_labels, holdout_labels = groups
        except (TypeError, ValueError):
            raise ValueError("groups as labels must be a pair (forget labels, holdout labels).") from None
        labels = list(forget_labels), list(holdout_labels)
        if len(labels[0]) != n_forget or len(labels[1]) != n_holdout:
            raise ValueError(f"groups hold {len(labels[0])} forget and {len(labels[1])} holdout labels for "
                             f"{n_forget} forget and {n_holdout} holdout rows.")
    for side, side_labels in zip(("forget", "holdout"), labels):
        if len(set(side_labels)) < 2:
            raise ValueError(f"The group-mean test needs at least two {side} groups, got {len(set(side_labels))}.")
    return labels


def _question_answer_rows(rows: Any, what: str, required: bool = True) -> list[dict[str, str]] | None:
    """``[{"question", "answer"}, ...]``, or ``[{"text"}, ...]`` for documents (a list of strings, a path, a
    ``text`` dataset: :func:`hf_unlearn.data.documents.as_documents`), one entry per document."""
    from ..data.documents import as_documents

    if rows is None:
        if required:
            raise ValueError(f"SelectionCriterion needs {what} rows.")
        return None
    docs = as_documents(rows)
    if docs is not None:
        return [{"text": d} for d in docs]
    out = [{"question": r["question"], "answer": r["answer"]} for r in rows]
    if not out:
        raise ValueError(f"The {what} rows of the selection criterion are empty.")
    return out


def _check_criterion_rows(forget: list[dict[str, Any]], holdout: list[dict[str, Any]],
                          retain_validation: list[dict[str, Any]], generic: list[dict[str, Any]] | None) -> None:
    """Refuse (``ValueError``) rows the command line refuses: a missing, empty, null or non-string question or
    answer (:func:`~hf_unlearn.data.check_rows`), and holdout or retain-validation rows that also occur in the
    forget set (the holdout rows must be unseen, and the retain rows are to be kept, not forgotten)."""
    from ..data import check_rows
    from ..data.documents import shared_documents
    from ..data.overlap import overlapping_examples

    if is_document_rows(forget) != is_document_rows(holdout):
        raise ValueError("The criterion compares forget and holdout figures of one kind: pass documents for both, "
                         "or question/answer rows for both.")
    for rows, what in ((forget, "forget"), (holdout, "holdout"), (retain_validation, "retain_validation"),
                       (generic, "generic")):
        if rows is not None and not is_document_rows(rows):
            check_rows(rows, f"the criterion's {what} rows")
    for rows, what in ((holdout, "holdout"), (retain_validation, "retain_validation")):
        if is_document_rows(forget) != is_document_rows(rows):
            continue  # documents and question/answer rows cannot be the same example
        if is_document_rows(forget):
            shared = shared_documents([r["text"] for r in forget], [r["text"] for r in rows])
        else:
            shared = overlapping_examples(forget, rows)
        if shared:
            raise ValueError(f"{shared} of the {len(forget)} forget rows also occur in the {what} rows of the "
                             f"selection criterion; {what} rows must not be forget rows.")


class SelectionCriterion:
    """The reference-free criterion and the default selection rule (:mod:`hf_unlearn.selection`).

    Args:
        forget, holdout: rows to unlearn and rows of the same kind the model never saw (``question``/``answer``
            rows, or documents: each scored on its first ``max_length`` tokens).
        retain_validation: retain rows *not* used for unlearning; ``generic``: optional general-knowledge rows.
        retain_tolerance: largest allowed ``retain_change``; holdout_level, holdout_margin: the equivalence test's
            level and margin (nats per answer token).
        original: the original model's retain figures (:meth:`measure_original`); else the first measured model's.
        groups: rows that belong together for the group test: ``None`` (every row its own group),
            ``"tofu_authors"`` (blocks of 20 rows), an int (blocks of that many rows) or ``(forget labels, holdout
            labels)``. At least two groups per side.
        reference_model, reference_tokenizer: a model that saw neither forget nor holdout rows; its per-row NLLs
            (or ``reference_nll``, ``(forget, holdout)`` measured before) are subtracted from every candidate's.
        device: where every scored model is moved first (``None``: where it is).
    """

    def __init__(
        self, forget: Any, holdout: Any, retain_validation: Any, generic: Any = None, *,
        retain_tolerance: float = DEFAULT_RETAIN_TOLERANCE, holdout_level: float = DEFAULT_HOLDOUT_LEVEL,
        holdout_margin: float = DEFAULT_HOLDOUT_MARGIN, original: Mapping[str, Any] | None = None,
        template: str | None = None, batch_size: int = 16, max_length: int | None = None, groups: Any = None,
        reference_model: Any = None, reference_tokenizer: Any = None,
        reference_nll: tuple[Sequence[float], Sequence[float]] | None = None, device: Any = None,
    ) -> None:
        from ..devices import resolve_device

        self.device = None if device is None else resolve_device(device)
        self.forget = _question_answer_rows(forget, "forget")
        self.holdout = _question_answer_rows(holdout, "holdout")
        self.retain_validation = _question_answer_rows(retain_validation, "retain_validation")
        self.generic = _question_answer_rows(generic, "generic", required=False)
        if not (_finite(retain_tolerance) and retain_tolerance >= 0):
            raise ValueError(f"retain_tolerance must be a finite number >= 0, got {retain_tolerance!r}.")
        if not (_finite(holdout_level) and 0 < holdout_level <= 1):
            raise ValueError(f"holdout_level must be in (0, 1], got {holdout_level!r}.")
        if not (_finite(holdout_margin) and holdout_margin > 0):
            raise ValueError(f"holdout_margin must be a finite number > 0, got {holdout_margin!r}.")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
        _check_criterion_rows(self.forget, self.holdout, self.retain_validation, self.generic)
        self.retain_tolerance = float(retain_tolerance)
        self.holdout_level = float(holdout_level)
        self.holdout_margin = float(holdout_margin)
        self.original = dict(original) if original is not None else None
        self.template = template
        self.batch_size = int(batch_size)
        self.max_length = max_length
        self.groups_spec = ("rows" if groups is None else groups if isinstance(groups, str) else
                            f"blocks of {groups} rows" if isinstance(groups, int) and not isinstance(groups, bool)
                            else "given labels")
        self.groups = _resolve_groups(groups, len(self.forget), len(self.holdout))
        self.reference_nll = self._reference(reference_model, reference_tokenizer, reference_nll)

    def _reference(self, model: Any, tokenizer: Any, given: Any) -> tuple[np.ndarray, np.ndarray] | None:
        """The reference model's per-row answer NLLs on the forget and holdout rows (given or measured once)."""
        if model is not None and given is not None:
            raise ValueError("Pass reference_model= or reference_nll=, not both.")
        if model is not None:
            if tokenizer is None:
                raise ValueError("reference_model= needs reference_tokenizer= (the tokenizer the candidates use).")
            from ..logprobs import causal_lm_scorer

            model.eval()
            scorer = causal_lm_scorer(model)
            given = (_row_nlls(self._score(model, tokenizer, self.forget, scorer)),
                     _row_nlls(self._score(model, tokenizer, self.holdout, scorer)))
        if given is None:
            return None
        ref_f, ref_h = (np.asarray(v, dtype=np.float64).reshape(-1) for v in given)
        if ref_f.size != len(self.forget) or ref_h.size != len(self.holdout):
            raise ValueError(f"reference_nll holds {ref_f.size} forget and {ref_h.size} holdout values for "
                             f"{len(self.forget)} forget and {len(self.holdout)} holdout rows.")
        if not (np.isfinite(ref_f).all() and np.isfinite(ref_h).all()):
            raise ValueError("The reference model's NLLs are not all finite.")
        return ref_f, ref_h

    def _score(self, model: Any, tokenizer: Any, rows: list[dict[str, str]], scorer: Any) -> list[np.ndarray]:
        from ..logprobs import (
            answer_token_statistics,
            effective_max_length,
            feature_token_statistics,
        )

        if self.device is not None:
            from ..devices import move_to_device

            move_to_device(model, self.device)
        if is_document_rows(rows):  # every token of each document's first chunk
            from ..data.documents import chunk_length, document_heads

            length = chunk_length(None, effective_max_length(model, self.max_length))
            features, cut = document_heads([r["text"] for r in rows], tokenizer, length)
            return feature_token_statistics(model, tokenizer, features, scorer=scorer, batch_size=self.batch_size,
                                            num_truncated=cut).token_log_probs
        stats = answer_token_statistics(
            model, tokenizer, [r["question"] for r in rows], [r["answer"] for r in rows], scorer=scorer,
            batch_size=self.batch_size, max_length=self.max_length, template=self.template,
        )
        return stats.token_log_probs

    def measure_original(self, model: Any, tokenizer: Any, scorer: Any = None) -> dict[str, float | None]:
        """Measure and keep the original model's retain figures (mean answer NLL on ``retain_validation`` and
        ``generic``) that ``retain_change`` is taken against; returns them."""
        from ..logprobs import causal_lm_scorer

        scorer = scorer or causal_lm_scorer(model)
        generic = None if self.generic is None else self._score(model, tokenizer, self.generic, scorer)
        return self.set_original_from_log_probs(self._score(model, tokenizer, self.retain_validation, scorer), generic)

    def measure(self, model: Any, tokenizer: Any, scorer: Any = None) -> dict[str, Any]:
        """The criterion on one candidate: :func:`forget_holdout_statistics`' figures, ``retain_validation_nll`` /
        ``_change``, ``generic_nll`` / ``_change``, ``retain_change`` and ``seconds``; ``scorer`` defaults to the
        model's log-probabilities. Without ``original`` figures, the first call's model is the original."""
        from ..logprobs import causal_lm_scorer

        start = time.perf_counter()
        scorer = scorer or causal_lm_scorer(model)
        out = self.measure_from_log_probs(
            self._score(model, tokenizer, self.forget, scorer),
            self._score(model, tokenizer, self.holdout, scorer),
            self._score(model, tokenizer, self.retain_validation, scorer),
            self._score(model, tokenizer, self.generic, scorer) if self.generic is not None else None,
        )
        out["seconds"] = time.perf_counter() - start
        return out

    def measure_from_log_probs(
        self, forget: Sequence[np.ndarray], holdout: Sequence[np.ndarray],
        retain_validation: Sequence[np.ndarray], generic: Sequence[np.ndarray] | None = None,
    ) -> dict[str, Any]:
        """:meth:`measure` (but ``seconds``) from per-row answer-token log-probabilities (1-D arrays, in the order of
        the criterion's rows), for callers that compute them themselves."""
        for name, rows, arrays in (("forget", self.forget, forget), ("holdout", self.holdout, holdout)):
            if len(arrays) != len(rows):
                raise ValueError(f"{name}: {len(arrays)} log-probability arrays for {len(rows)} rows.")
        figures = self._figures_of(retain_validation, generic)
        out: dict[str, Any] = forget_holdout_statistics(forget, holdout, groups=self.groups,
                                                        reference_nll=self.reference_nll,
                                                        margin=self.holdout_margin)
        if self.original is None:
            self.original = dict(figures)
        out.update(figures)
        changes = []
        for name in ("retain_validation", "generic"):
            now, before = figures[f"{name}_nll"], self.original.get(f"{name}_nll")
            if now is None:
                out[f"{name}_change"] = None
                continue
            delta = float(now) - float(before) if _finite(now) and _finite(before) else math.inf
            out[f"{name}_change"] = delta
            changes.append(delta)
        out["retain_change"] = max(changes)
        return out

    def _figures_of(
        self, retain_validation: Sequence[np.ndarray], generic: Sequence[np.ndarray] | None
    ) -> dict[str, float | None]:
        if len(retain_validation) != len(self.retain_validation):
            raise ValueError(f"retain_validation: {len(retain_validation)} log-probability arrays for "
                             f"{len(self.retain_validation)} rows.")
        if (generic is None) != (self.generic is None) or (generic is not None and len(generic) != len(self.generic)):
            raise ValueError(f"generic: {None if generic is None else len(generic)} log-probability arrays for "
                             f"{None if self.generic is None else len(self.generic)} rows.")
        return {"retain_validation_nll": float(_row_nlls(retain_validation).mean()),
                "generic_nll": float(_row_nlls(generic).mean()) if generic is not None else None}

    def set_original_from_log_probs(
        self, retain_validation: Sequence[np.ndarray], generic: Sequence[np.ndarray] | None = None
    ) -> dict[str, float | None]:
        """Keep the original model's retain figures from its per-row answer-token log-probabilities on
        ``retain_validation`` (and ``generic``), as :meth:`measure_original` does from the model; returns them."""
        self.original = self._figures_of(retain_validation, generic)
        return dict(self.original)

    def rule(self) -> dict[str, Any]:
        """The rule's settings, as the record stores them."""
        return {"name": "NLL shift closest to holdout within retain tolerance",
                "retain_tolerance": self.retain_tolerance, "holdout_level": self.holdout_level,
                "holdout_margin": self.holdout_margin, "level test": "equivalence (two one-sided Welch t-tests)",
                "groups": self.groups_spec, "reference": "reference model" if self.reference_nll is not None else None,
                "order": "weak -> strong", "ties": "weaker candidate"}

    def select(self, measurements: Sequence[Mapping[str, Any]]) -> tuple[int, str]:
        """``(index, reason)`` of the chosen candidate by the default rule (candidates ordered weak -> strong);
        warns (``UserWarning``) when the rule falls back."""
        record = self.decide([{}] * len(measurements), measurements)
        return record.index, record.reason

    def decide(
        self, candidates: Sequence[Mapping[str, Any]], measurements: Sequence[Mapping[str, Any]]
    ) -> SelectionRecord:
        """Apply the rule and return the :class:`SelectionRecord` (candidates and measurements in the same order,
        weak -> strong)."""
        if len(candidates) != len(measurements):
            raise ValueError(f"{len(candidates)} candidates but {len(measurements)} measurements.")
        index, reason, warning = select_candidate(measurements, self.retain_tolerance, self.holdout_level,
                                                   self.holdout_margin)
        if warning:
            warnings.warn(warning, stacklevel=2)
        return SelectionRecord(
            candidates=[dict(c) for c in candidates], measurements=[dict(m) for m in measurements], index=index,
            reason=reason, warning=warning, rule=self.rule(), original=dict(self.original or {}) or None,
        )


def selection_record_of(artifact: Any) -> dict[str, Any] | None:
    """The selection record an artifact carries (an edit's ``stats["selection"]``, a head's
    ``config.calibration``, an object's ``selection_record``), as a dict; ``None`` when it has none."""
    if isinstance(artifact, (str, os.PathLike)):
        path = Path(artifact) / SELECTION_RECORD
        return SelectionRecord.load(path).to_dict() if path.is_file() else None
    for getter in (lambda a: a.stats.get("selection"), lambda a: a.config.calibration,
                   lambda a: a.selection_record):
        try:
            value = getter(artifact)
        except AttributeError:
            continue
        if isinstance(value, SelectionRecord):
            return value.to_dict()
        if isinstance(value, Mapping) and "candidates" in value:
            return dict(value)
    return None


