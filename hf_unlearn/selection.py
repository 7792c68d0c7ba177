"""Choosing an unlearning method's strength without a retain model: a reference-free forget criterion, the
default selection rule, the record it leaves beside the artifact, and a best-checkpoint callback for trainers.

**The criterion** (:class:`SelectionCriterion`) is built from rows the user has: ``forget`` (the rows to
unlearn), ``holdout`` (rows of the same kind that the model never saw, e.g. TOFU's ``holdout01/05/10``),
``retain_validation`` (retain rows not used for unlearning) and optionally ``generic`` rows, and two optional
things the user usually also has: the rows' ``groups`` (e.g. the author of each row) and a ``reference_model``
(the pretrained base before fine-tuning). For a candidate model it measures, with the model's own token scorer
or a given one (T3's tilted scorer):

* forget side: whether the forget rows moved like never-seen rows. With ``n_i`` the per-row answer NLL
  ``n_i = -(1/|a_i|) sum_t log p(a_{i,t} | q_i, a_{i,<t})`` and ``r_i`` the same row's NLL under the reference
  model (measured once; 0 without one), the row's *shift* is ``d_i = n_i - r_i``, and

      shift_gap = mean over forget groups of mean_{i in g} d_i  -  the same over holdout groups,

  with ``forget_holdout_pvalue`` the two-sided p-value of Welch's t-test on those group means
  (:func:`hf_unlearn.evaluation.privacy.group_mean_shift_test`; without ``groups`` every row is a group). The
  ideal model (one never trained on the forget rows) has ``shift_gap`` near 0: the forget rows are then
  never-seen rows of their own difficulty. A model that still knows them has ``shift_gap`` well below 0, one
  pushed *beyond* never-seen rows well above 0; both fail the test. Kept for reference: the two-sample KS
  statistic and p-value of the NLLs (``forget_holdout_ks``, ``forget_holdout_ks_pvalue``) and ``mia_auc``, the
  Min-K% membership-inference AUC of forget (label 0) against holdout (label 1).
* retain side: ``retain_change = max(mean NLL on retain_validation, mean NLL on generic) - the same under the
  original model`` (nats per answer token; each change also apart).

Why these parts. A KS test on rows compares two samples drawn from *different authors*: on TOFU the forget and
the holdout authors differ in difficulty (on a SmolLM2-135M pair, the model fine-tuned without the forget authors
scores NLL 2.88 on them against 2.44 on the holdout authors), and each author's 20 rows share that difficulty, so
80 rows are about 4 independent draws. Treated as 80, the ideal model is "distinguishable" (KS p = 2e-4) and a
level of 0.05 is out of reach for every candidate. The group test counts authors, not rows, so a difference
between authors alone does not fail it; the reference offset removes the part of the difficulty that the model
had before fine-tuning (a row that was hard for the base stays hard for a model that never saw it); the rule
then takes the candidate *closest* to the holdout rows rather than the most significant one, so a noisy
candidate is not preferred for its noise and an overshoot counts as much as an undershoot. The p-value decides
only whether the choice carries a warning.

**The rule** (:meth:`SelectionCriterion.select`, candidates ordered weak -> strong):

1. candidates whose ``retain_change <= retain_tolerance`` (default 0.1 nats/token: the geometric-mean token
   probability of the retain answers falls by at most ``1 - e^{-0.1}``, about 10%, the size of TOFU's
   "90% of the target's utility" bar) are eligible;
2. among those, the one with the smallest ``|shift_gap|``; ties go to the weaker candidate;
3. when that candidate's ``forget_holdout_pvalue`` is below ``holdout_level`` (default 0.05: the group test
   still tells its forget rows from the holdout rows), it is chosen with a warning that says so;
4. when no candidate is eligible, the one with the smallest retain change (ties: weaker), with a warning.

The measurements and the decision form a :class:`SelectionRecord`, saved as ``selection_record.json`` beside the
artifact and shown in its model card.
"""

from __future__ import annotations

import copy
import math
import os
import time
import warnings
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

SELECTION_RECORD = "selection_record.json"
SELECTION_WEIGHTS = "selection_best.safetensors"
DEFAULT_RETAIN_TOLERANCE = 0.1
DEFAULT_HOLDOUT_LEVEL = 0.05


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value))


def _row_nlls(token_log_probs: Sequence[np.ndarray]) -> np.ndarray:
    return np.array([-np.mean(lp) if len(lp) else 0.0 for lp in token_log_probs], dtype=np.float64)


def forget_holdout_statistics(
    forget_token_log_probs: Sequence[np.ndarray],
    holdout_token_log_probs: Sequence[np.ndarray],
    k: float | None = None,
    *,
    groups: tuple[Sequence[Any], Sequence[Any]] | None = None,
    reference_nll: tuple[Sequence[float], Sequence[float]] | None = None,
) -> dict[str, Any]:
    """Indistinguishability of forget and holdout rows from their per-token answer log-probabilities.

    With ``n_i = -mean_t log p_t`` a row's answer NLL and ``r_i`` the same row's NLL under the reference model
    (``reference_nll = (forget, holdout)``; 0 without one), the row's *shift* is ``d_i = n_i - r_i``.
    ``shift_gap`` is the mean over forget groups of the groups' mean shift minus the same over holdout groups,
    and ``forget_holdout_pvalue`` the two-sided p-value of Welch's test on those group means
    (:func:`hf_unlearn.evaluation.privacy.group_mean_shift_test`; ``groups = (forget labels, holdout labels)``,
    every row its own group without them; ``None`` with a single row on a side); ``shift_gap_se`` its standard
    error, ``forget_shift`` / ``holdout_shift`` the two sides' mean shifts.

    Kept for reference: ``forget_holdout_ks`` and ``forget_holdout_ks_pvalue`` (the two-sample Kolmogorov-Smirnov
    statistic ``D = sup_x |F_forget(x) - F_holdout(x)|`` of the NLLs and its p-value, rows taken as independent),
    ``mia_auc`` (Min-K% AUC, forget labelled 0 and holdout 1) and the two mean NLLs.

    Identical rows give ``p = 1``, ``shift_gap = 0`` and ``mia_auc = 0.5``. A non-finite log-probability gives
    ``p = 0`` and ``shift_gap = mia_auc = None`` (such a candidate cannot be told apart from nothing).
    """
    from scipy.stats import ks_2samp

    from .evaluation.privacy import MIN_K_FRACTION, group_mean_shift_test, mia_auc, min_k_score

    k = MIN_K_FRACTION if k is None else k
    if not forget_token_log_probs or not holdout_token_log_probs:
        raise ValueError("The criterion needs at least one forget and one holdout row.")
    nll_f, nll_h = _row_nlls(forget_token_log_probs), _row_nlls(holdout_token_log_probs)
    out: dict[str, Any] = {"forget_nll": float(nll_f.mean()), "holdout_nll": float(nll_h.mean())}
    if not (np.isfinite(nll_f).all() and np.isfinite(nll_h).all()):
        return {**out, "forget_holdout_pvalue": 0.0, "shift_gap": None, "shift_gap_se": None,
                "forget_shift": None, "holdout_shift": None, "forget_holdout_ks_pvalue": 0.0,
                "forget_holdout_ks": 1.0, "mia_auc": None}
    ref_f, ref_h = ((np.zeros_like(nll_f), np.zeros_like(nll_h)) if reference_nll is None else
                    (np.asarray(reference_nll[0], dtype=np.float64), np.asarray(reference_nll[1], dtype=np.float64)))
    if ref_f.shape != nll_f.shape or ref_h.shape != nll_h.shape:
        raise ValueError(f"reference_nll holds {ref_f.size} forget and {ref_h.size} holdout values for "
                         f"{nll_f.size} forget and {nll_h.size} holdout rows.")
    shift_f, shift_h = nll_f - ref_f, nll_h - ref_h
    labels_f, labels_h = groups if groups is not None else (range(nll_f.size), range(nll_h.size))
    if min(len(set(labels_f)), len(set(labels_h))) < 2:  # one row on a side: a gap, but no spread to test it by
        test = {"gap": float(shift_f.mean() - shift_h.mean()), "se": None, "pvalue": None}
    else:
        test = group_mean_shift_test(shift_f, shift_h, list(labels_f), list(labels_h))
    ks = ks_2samp(nll_f, nll_h)
    auc = mia_auc([min_k_score(lp, k) for lp in forget_token_log_probs],
                  [min_k_score(lp, k) for lp in holdout_token_log_probs])
    return {**out, "forget_holdout_pvalue": test["pvalue"], "shift_gap": test["gap"], "shift_gap_se": test["se"],
            "forget_shift": float(shift_f.mean()), "holdout_shift": float(shift_h.mean()),
            "forget_holdout_ks_pvalue": float(ks.pvalue), "forget_holdout_ks": float(ks.statistic), "mia_auc": auc}


def select_candidate(
    measurements: Sequence[Mapping[str, Any]],
    retain_tolerance: float = DEFAULT_RETAIN_TOLERANCE,
    holdout_level: float = DEFAULT_HOLDOUT_LEVEL,
) -> tuple[int, str, str | None]:
    """The default rule (module docstring) on measurements ordered weak -> strong: ``(index, reason, warning)``,
    ``warning`` None when the chosen candidate is within the retain tolerance and reaches the holdout level."""
    if not measurements:
        raise ValueError("select() needs at least one measured candidate.")

    def change(m: Mapping[str, Any]) -> float:
        value = m.get("retain_change")
        return float(value) if _finite(value) else math.inf

    def gap(m: Mapping[str, Any]) -> float:
        value = m.get("shift_gap")
        return abs(float(value)) if _finite(value) else math.inf

    def pvalue(m: Mapping[str, Any]) -> float:
        value = m.get("forget_holdout_pvalue")
        return float(value) if _finite(value) else 0.0

    eligible = [i for i, m in enumerate(measurements) if change(m) <= retain_tolerance]
    if not eligible:
        best = min(range(len(measurements)), key=lambda i: (change(measurements[i]), i))
        warning = (f"No candidate keeps the retain change within {retain_tolerance:g} nats/token (smallest: "
                   f"{change(measurements[best]):.4g}, candidate {best}); chose the one with the smallest retain change.")
        return best, warning, warning
    best = min(eligible, key=lambda i: (gap(measurements[i]), i))
    chosen = measurements[best]
    shift = f"{float(chosen['shift_gap']):+.4g}" if _finite(chosen.get("shift_gap")) else "n/a"
    reason = (f"candidate {best}: forget rows' NLL shift closest to the holdout rows' (gap {shift} nats/token, "
              f"p = {pvalue(chosen):.4g}) among {len(eligible)} of {len(measurements)} candidates within the retain "
              f"tolerance {retain_tolerance:g} (its retain change {change(chosen):+.4g}); ties go to the weaker "
              "candidate")
    if pvalue(chosen) >= holdout_level:
        return best, reason, None
    warning = (f"The candidate closest to the holdout rows within the retain tolerance {retain_tolerance:g} "
               f"(candidate {best}, gap {shift} nats/token) stays distinguishable from never-seen rows (p = "
               f"{pvalue(chosen):.4g} < {holdout_level:g}).")
    return best, reason, warning


@dataclass
class SelectionRecord:
    """Every candidate's settings and measurements and the decision: what ``selection_record.json`` holds.

    ``candidates[i]`` names candidate ``i`` (e.g. ``{"scale": 0.5, "retain_weight": 10.0, "ridge": 0.01}`` or
    ``{"step": 40}``), ``measurements[i]`` is its :meth:`SelectionCriterion.measure` dict, ``index`` the chosen
    one, ``reason`` why, ``warning`` set when the chosen candidate stays distinguishable from the holdout rows
    (below the holdout level) or no candidate is within the retain tolerance, ``rule`` the rule's settings and
    ``original`` the original model's retain figures.
    """

    candidates: list[dict[str, Any]]
    measurements: list[dict[str, Any]]
    index: int
    reason: str
    warning: str | None = None
    rule: dict[str, Any] = field(default_factory=dict)
    original: dict[str, Any] | None = None

    @property
    def chosen(self) -> dict[str, Any]:
        """The chosen candidate's settings."""
        return self.candidates[self.index]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (non-finite numbers become ``None``)."""
        return _jsonable({"format": "hf-unlearn-selection/1", **asdict(self), "chosen": self.chosen})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SelectionRecord:
        """Rebuild a record from :meth:`to_dict` output (or a loaded ``selection_record.json``)."""
        keys = ("candidates", "measurements", "index", "reason", "warning", "rule", "original")
        missing = [k for k in ("candidates", "measurements", "index", "reason") if k not in data]
        if missing:
            raise ValueError(f"Not a selection record: missing {missing}.")
        return cls(**{k: copy.deepcopy(data[k]) for k in keys if k in data})

    def save(self, folder_or_file: str | os.PathLike) -> Path:
        """Write the record as JSON (atomically); a folder gets ``selection_record.json``. Returns the path."""
        from .safe_output import atomic_write_json

        path = Path(folder_or_file)
        if path.is_dir() or not path.suffix:
            path = path / SELECTION_RECORD
        return atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, folder_or_file: str | os.PathLike) -> SelectionRecord:
        """Read a record written by :meth:`save` (a folder or the JSON file)."""
        import json

        path = Path(folder_or_file)
        if path.is_dir():
            path = path / SELECTION_RECORD
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))

    def markdown(self) -> str:
        """The record as a model-card section: the rule, the decision and one table row per candidate."""
        setting_keys = list(dict.fromkeys(k for c in self.candidates for k in c))
        cols = ["shift_gap", "forget_holdout_pvalue", "retain_change", "forget_holdout_ks_pvalue", "mia_auc",
                "forget_nll"]
        head = ["#", *setting_keys, "NLL shift gap (forget - holdout)", "p (group test)", "retain change",
                "KS p (rows)", "MIA AUC", "forget NLL"]
        groups = self.rule.get("groups") or "rows"
        unit = "rows (each row its own group)" if groups == "rows" else f"group means ({groups})"
        shift = ("NLL minus the reference model's NLL on the same row" if self.rule.get("reference")
                 else "answer NLL")
        lines = [
            "## Strength selection (reference-free)",
            "",
            f"Chosen: candidate {self.index} ({_settings_text(self.chosen)}). {self.reason}",
            "",
            f"Rule: among candidates whose retain NLL rises by at most {self.rule.get('retain_tolerance')} nats/token, "
            f"the one whose forget rows' mean shift ({shift}) is closest to the never-seen holdout rows'; ties to "
            f"the weaker. Group test: Welch's two-sided t on the {unit}; below p = "
            f"{self.rule.get('holdout_level')} the choice carries a warning.",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "---|" * len(head),
        ]
        for i, (cand, meas) in enumerate(zip(self.candidates, self.measurements)):
            cells = [f"**{i}**" if i == self.index else str(i)]
            cells += [_fmt(cand.get(k)) for k in setting_keys] + [_fmt(meas.get(c)) for c in cols]
            lines.append("| " + " | ".join(cells) + " |")
        if self.warning:
            lines += ["", f"Warning: {self.warning}"]
        return "\n".join(lines) + "\n"


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _settings_text(settings: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={_fmt(v)}" for k, v in settings.items()) or "no settings"


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (bool, str)) or obj is None:
        return obj
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(float(obj)) else None
    return str(obj)


#: TOFU's rows come in blocks of one author each: 20 question/answer pairs, in order.
TOFU_AUTHOR_ROWS = 20


def _groups_name(groups: Any) -> str:
    if groups is None:
        return "rows"
    if isinstance(groups, str):
        return groups
    if isinstance(groups, int) and not isinstance(groups, bool):
        return f"blocks of {groups} rows"
    return "given labels"


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
    from .data.documents import as_documents

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
    from .data import check_rows
    from .data.documents import shared_documents
    from .data.pairing import overlapping_examples

    if _is_documents(forget) != _is_documents(holdout):
        raise ValueError("The criterion compares forget and holdout figures of one kind: pass documents for both, "
                         "or question/answer rows for both.")
    for rows, what in ((forget, "forget"), (holdout, "holdout"), (retain_validation, "retain_validation"),
                       (generic, "generic")):
        if rows is not None and not _is_documents(rows):
            check_rows(rows, f"the criterion's {what} rows")
    for rows, what in ((holdout, "holdout"), (retain_validation, "retain_validation")):
        if _is_documents(forget) != _is_documents(rows):
            continue  # documents and question/answer rows cannot be the same example
        if _is_documents(forget):
            shared = shared_documents([r["text"] for r in forget], [r["text"] for r in rows])
        else:
            shared = overlapping_examples(forget, rows)
        if shared:
            raise ValueError(f"{shared} of the {len(forget)} forget rows also occur in the {what} rows of the "
                             f"selection criterion; {what} rows must not be forget rows.")


def _is_documents(rows: list[dict[str, Any]] | None) -> bool:
    return bool(rows) and "text" in rows[0]


class SelectionCriterion:
    """The reference-free criterion and the default selection rule (see the module docstring).

    Args:
        forget: rows to unlearn (``question``/``answer``; a list of dicts or a ``datasets.Dataset``), or
            documents (a list of strings, a path, a ``text`` dataset: :func:`hf_unlearn.data.documents.as_documents`): each
            document is one row, scored on every token of its first ``max_length`` tokens (the model's positions;
            2048 when neither is set), so its per-row NLL is the average NLL over those tokens.
        holdout: rows of the same kind the model never saw (TOFU ``holdout01/05/10`` or the user's own; documents
            when ``forget`` is documents).
        retain_validation: retain rows *not* used for unlearning.
        generic: optional general-knowledge rows; their NLL change counts toward ``retain_change`` too.
        retain_tolerance: largest allowed ``retain_change`` (nats per answer token).
        holdout_level: p-value of the group test at or above which the chosen candidate's forget rows count as
            indistinguishable from the holdout rows (below it the choice carries a warning).
        original: the original model's retain figures (``measure_original``'s dict); measured on the first
            :meth:`measure` call otherwise, so call :meth:`measure_original` (or measure the original model)
            first.
        template, batch_size, max_length: how rows are tokenized and batched (as the evaluator and the method).
        groups: which rows belong together for the group test: ``None`` (every row its own group),
            ``"tofu_authors"`` (TOFU's blocks of 20 consecutive rows per author, forget and holdout alike), an int
            (blocks of that many consecutive rows) or ``(forget labels, holdout labels)``, one label per row.
            At least two groups per side.
        reference_model, reference_tokenizer: a model the user has that saw neither the forget nor the holdout
            rows (the pretrained base before fine-tuning); its per-row NLLs on the forget and holdout rows are
            measured once here and subtracted from every candidate's (the *shift*). ``reference_tokenizer`` must
            tokenize as the candidates' tokenizer does.
        reference_nll: instead of ``reference_model``, those per-row NLLs ``(forget, holdout)`` measured before
            (e.g. another criterion's :attr:`reference_nll`).
    """

    def __init__(
        self,
        forget: Any,
        holdout: Any,
        retain_validation: Any,
        generic: Any = None,
        *,
        retain_tolerance: float = DEFAULT_RETAIN_TOLERANCE,
        holdout_level: float = DEFAULT_HOLDOUT_LEVEL,
        original: Mapping[str, Any] | None = None,
        template: str | None = None,
        batch_size: int = 16,
        max_length: int | None = None,
        groups: Any = None,
        reference_model: Any = None,
        reference_tokenizer: Any = None,
        reference_nll: tuple[Sequence[float], Sequence[float]] | None = None,
    ) -> None:
        self.forget = _question_answer_rows(forget, "forget")
        self.holdout = _question_answer_rows(holdout, "holdout")
        self.retain_validation = _question_answer_rows(retain_validation, "retain_validation")
        self.generic = _question_answer_rows(generic, "generic", required=False)
        if not (_finite(retain_tolerance) and retain_tolerance >= 0):
            raise ValueError(f"retain_tolerance must be a finite number >= 0, got {retain_tolerance!r}.")
        if not (_finite(holdout_level) and 0 < holdout_level <= 1):
            raise ValueError(f"holdout_level must be in (0, 1], got {holdout_level!r}.")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
        _check_criterion_rows(self.forget, self.holdout, self.retain_validation, self.generic)
        self.retain_tolerance = float(retain_tolerance)
        self.holdout_level = float(holdout_level)
        self.original = dict(original) if original is not None else None
        self.template = template
        self.batch_size = int(batch_size)
        self.max_length = max_length
        self.groups_spec = _groups_name(groups)
        self.groups = _resolve_groups(groups, len(self.forget), len(self.holdout))
        self.reference_nll = self._reference(reference_model, reference_tokenizer, reference_nll)

    def _reference(self, model: Any, tokenizer: Any, given: Any) -> tuple[np.ndarray, np.ndarray] | None:
        """The reference model's per-row answer NLLs on the forget and holdout rows (given or measured once)."""
        if model is not None and given is not None:
            raise ValueError("Pass reference_model= or reference_nll=, not both.")
        if model is not None:
            if tokenizer is None:
                raise ValueError("reference_model= needs reference_tokenizer= (the tokenizer the candidates use).")
            from .logprobs import causal_lm_scorer

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

    # ----------------------------------------------------------------------------------------- measuring
    def _score(self, model: Any, tokenizer: Any, rows: list[dict[str, str]], scorer: Any) -> list[np.ndarray]:
        from .logprobs import answer_token_statistics, effective_max_length, feature_token_statistics

        if _is_documents(rows):  # every token of each document's first chunk
            from .data.documents import chunk_length, document_heads

            length = chunk_length(None, effective_max_length(model, self.max_length))
            features, cut = document_heads([r["text"] for r in rows], tokenizer, length)
            return feature_token_statistics(model, tokenizer, features, scorer=scorer, batch_size=self.batch_size,
                                            num_truncated=cut).token_log_probs
        stats = answer_token_statistics(
            model, tokenizer, [r["question"] for r in rows], [r["answer"] for r in rows], scorer=scorer,
            batch_size=self.batch_size, max_length=self.max_length, template=self.template,
        )
        return stats.token_log_probs

    @staticmethod
    def _mean_nll(token_log_probs: list[np.ndarray]) -> float:
        return float(np.mean([-np.mean(lp) if len(lp) else 0.0 for lp in token_log_probs]))

    def _retain_figures(self, model: Any, tokenizer: Any, scorer: Any) -> dict[str, float | None]:
        figures: dict[str, float | None] = {
            "retain_validation_nll": self._mean_nll(self._score(model, tokenizer, self.retain_validation, scorer)),
            "generic_nll": None,
        }
        if self.generic is not None:
            figures["generic_nll"] = self._mean_nll(self._score(model, tokenizer, self.generic, scorer))
        return figures

    def measure_original(self, model: Any, tokenizer: Any, scorer: Any = None) -> dict[str, float | None]:
        """Measure and keep the original model's retain figures (mean answer NLL on ``retain_validation`` and
        ``generic``) that ``retain_change`` is taken against; returns them."""
        from .logprobs import causal_lm_scorer

        self.original = self._retain_figures(model, tokenizer, scorer or causal_lm_scorer(model))
        return dict(self.original)

    def measure(self, model: Any, tokenizer: Any, scorer: Any = None) -> dict[str, Any]:
        """The criterion on one candidate: :func:`forget_holdout_statistics` (``shift_gap``, ``shift_gap_se``,
        ``forget_holdout_pvalue``, ``forget_shift``, ``holdout_shift``, ``forget_holdout_ks``,
        ``forget_holdout_ks_pvalue``, ``mia_auc``, ``forget_nll``, ``holdout_nll``), ``retain_validation_nll`` /
        ``_change``, ``generic_nll`` / ``_change``, ``retain_change`` and ``seconds``.

        ``scorer`` is a :data:`hf_unlearn.logprobs.TokenScorer` (default: the model's own log-probabilities;
        T3's :func:`hf_unlearn.methods.t3.t3_scorer` for a tilted candidate). Without ``original`` figures, the first call
        takes its model as the original (its ``retain_change`` is 0).
        """
        from .logprobs import causal_lm_scorer

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
        self,
        forget: Sequence[np.ndarray],
        holdout: Sequence[np.ndarray],
        retain_validation: Sequence[np.ndarray],
        generic: Sequence[np.ndarray] | None = None,
    ) -> dict[str, Any]:
        """The criterion on one candidate from its per-row answer-token log-probabilities (1-D arrays, one per
        row, in the order of ``self.forget``, ``self.holdout``, ``self.retain_validation`` and ``self.generic``):
        everything :meth:`measure` returns except ``seconds``. For callers that compute the log-probabilities
        themselves (a cached frozen trunk). Without ``original`` figures, the first call's retain figures become
        the original's."""
        for name, rows, arrays in (("forget", self.forget, forget), ("holdout", self.holdout, holdout),
                                   ("retain_validation", self.retain_validation, retain_validation)):
            if len(arrays) != len(rows):
                raise ValueError(f"{name}: {len(arrays)} log-probability arrays for {len(rows)} rows.")
        if (generic is None) != (self.generic is None) or (generic is not None and len(generic) != len(self.generic)):
            raise ValueError(f"generic: {None if generic is None else len(generic)} log-probability arrays for "
                             f"{None if self.generic is None else len(self.generic)} rows.")
        out: dict[str, Any] = forget_holdout_statistics(forget, holdout, groups=self.groups,
                                                        reference_nll=self.reference_nll)
        figures: dict[str, float | None] = {
            "retain_validation_nll": self._mean_nll(list(retain_validation)),
            "generic_nll": self._mean_nll(list(generic)) if generic is not None else None,
        }
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

    # ----------------------------------------------------------------------------------------- deciding
    def rule(self) -> dict[str, Any]:
        """The rule's settings, as the record stores them."""
        return {"name": "NLL shift closest to holdout within retain tolerance",
                "retain_tolerance": self.retain_tolerance, "holdout_level": self.holdout_level,
                "groups": self.groups_spec, "reference": "reference model" if self.reference_nll is not None else None,
                "order": "weak -> strong", "ties": "weaker candidate"}

    def select(self, measurements: Sequence[Mapping[str, Any]]) -> tuple[int, str]:
        """``(index, reason)`` of the chosen candidate by the default rule (candidates ordered weak -> strong);
        warns (``UserWarning``) when the rule falls back."""
        index, reason, warning = select_candidate(measurements, self.retain_tolerance, self.holdout_level)
        if warning:
            warnings.warn(warning, stacklevel=2)
        return index, reason

    def decide(
        self, candidates: Sequence[Mapping[str, Any]], measurements: Sequence[Mapping[str, Any]]
    ) -> SelectionRecord:
        """Apply the rule and return the :class:`SelectionRecord` (candidates and measurements in the same order,
        weak -> strong)."""
        if len(candidates) != len(measurements):
            raise ValueError(f"{len(candidates)} candidates but {len(measurements)} measurements.")
        index, reason, warning = select_candidate(measurements, self.retain_tolerance, self.holdout_level)
        if warning:
            warnings.warn(warning, stacklevel=2)
        return SelectionRecord(
            candidates=[dict(c) for c in candidates], measurements=[dict(m) for m in measurements], index=index,
            reason=reason, warning=warning, rule=self.rule(), original=dict(self.original or {}) or None,
        )


def selection_record_of(artifact: Any) -> dict[str, Any] | None:
    """The selection record an artifact carries (a ``GROMEdit``'s ``stats["selection"]``, a T3 head's
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


# --------------------------------------------------------------------------------------------- trainers
def _trainer_callback_bases() -> tuple[type, type]:
    from transformers import TrainerCallback
    from transformers.trainer_callback import ExportableState

    return TrainerCallback, ExportableState


_TrainerCallback, _ExportableState = _trainer_callback_bases()
_LIVE_CALLBACKS: list[weakref.ReferenceType] = []


class SelectionCallback(_TrainerCallback, _ExportableState):
    """Best-checkpoint selection for any ``Trainer``: measure the criterion every ``selection_steps`` optimizer
    steps (and at steps 0 and the last), keep the weights the rule prefers, restore them when training ends.

    Candidates are the training steps, weak (step 0, the original model) -> strong (the last step); the rule is
    :meth:`SelectionCriterion.select`. The rule never moves back to a candidate it passed over, so only the
    current choice's weights are kept: ``keep="memory"`` holds a CPU copy of the trainable parameters,
    ``keep="disk"`` writes them to ``<output_dir>/selection-best/selection_best.safetensors`` (for large models).
    Every checkpoint the Trainer saves carries the callback's state (``ExportableState``: the measurements,
    the chosen step and the original model's figures, in ``trainer_state.json``) and, with ``keep="memory"``,
    the kept weights as ``selection_best.safetensors``, so a resumed run selects exactly as an uninterrupted
    one. After training, :attr:`record` is the :class:`SelectionRecord` and the model holds the chosen step's
    weights (with ``restore=False``, for a trainer that keeps its own stopping rule such as MASC, the record is
    kept and the final weights are left as they are). ``scorer_factory(model)`` gives the token scorer to measure
    with (default: the model's own). Under a multi-process launch (DDP) every process measures and keeps its
    own copy and only the main process writes files; DeepSpeed ZeRO-3 and FSDP, which shard the weights, are
    refused at the start of training with a ``ValueError``.
    """

    def __init__(
        self, criterion: SelectionCriterion | None = None, selection_steps: int = 50, keep: str = "memory",
        scorer_factory: Any = None, restore: bool = True,
    ) -> None:
        if keep not in ("memory", "disk"):
            raise ValueError(f"keep must be 'memory' or 'disk', got {keep!r}.")
        if int(selection_steps) < 1:
            raise ValueError(f"selection_steps must be >= 1, got {selection_steps}.")
        if criterion is None:  # the Trainer rebuilds stateful callbacks from state() args on resume
            criterion = next((cb().criterion for cb in reversed(_LIVE_CALLBACKS)
                              if cb() is not None and cb().criterion is not None), None)
        self.criterion = criterion
        self.selection_steps = int(selection_steps)
        self.keep = keep
        self.scorer_factory = scorer_factory
        self.restore = bool(restore)
        self.steps: list[int] = []
        self.measurements: list[dict[str, Any]] = []
        self.best_step: int | None = None
        self.original: dict[str, Any] | None = None
        self.record: SelectionRecord | None = None
        self._best: dict[str, Any] | None = None
        _LIVE_CALLBACKS[:] = [ref for ref in _LIVE_CALLBACKS if ref() is not None]
        _LIVE_CALLBACKS.append(weakref.ref(self))

    # ExportableState
    def state(self) -> dict[str, Any]:
        return {
            "args": {"selection_steps": self.selection_steps, "keep": self.keep, "restore": self.restore},
            "attributes": _jsonable({"steps": self.steps, "measurements": self.measurements,
                                     "best_step": self.best_step, "original": self.original}),
        }

    def _require_criterion(self) -> SelectionCriterion:
        if self.criterion is None:
            raise ValueError("SelectionCallback needs a SelectionCriterion (pass criterion=).")
        return self.criterion

    @staticmethod
    def _best_dir(args: Any) -> Path:
        return Path(args.output_dir) / "selection-best"

    def _trainable(self, model: Any) -> dict[str, Any]:
        return {n: p.detach().to("cpu", copy=True).contiguous() for n, p in model.named_parameters() if p.requires_grad}

    def _keep(self, args: Any, model: Any, main: bool = True) -> None:
        weights = self._trainable(model)
        if self.keep == "memory" or not main:  # one writer per launch: the other processes keep theirs in memory
            self._best = weights
            return
        from safetensors.torch import save_file

        folder = self._best_dir(args)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / (SELECTION_WEIGHTS + ".partial")
        save_file(weights, str(tmp))
        os.replace(tmp, folder / SELECTION_WEIGHTS)  # never a half-written file under the final name
        self._best = None

    def _load_best(self, args: Any) -> dict[str, Any] | None:
        if self._best is not None:
            return self._best
        path = self._best_dir(args) / SELECTION_WEIGHTS
        if self.keep == "disk" and path.is_file():
            from safetensors.torch import load_file

            return load_file(str(path))
        return None

    def _measure(self, args: Any, state: Any, model: Any, tokenizer: Any) -> None:
        criterion = self._require_criterion()
        step = int(state.global_step)
        if self.steps and self.steps[-1] == step:
            return
        scorer = self.scorer_factory(model) if self.scorer_factory is not None else None
        if criterion.original is None and self.original is not None:
            criterion.original = dict(self.original)
        measurement = criterion.measure(model, tokenizer, scorer=scorer)
        self.original = dict(criterion.original or {})
        self.steps.append(step)
        self.measurements.append(measurement)
        index, _, _ = select_candidate(self.measurements, criterion.retain_tolerance, criterion.holdout_level)
        if index == len(self.measurements) - 1:
            self.best_step = step
            if self.restore:
                self._keep(args, model, main=bool(getattr(state, "is_world_process_zero", True)))

    def _restore_from_checkpoint(self, args: Any, state: Any) -> None:
        saved = (getattr(state, "stateful_callbacks", None) or {}).get(type(self).__name__)
        if isinstance(saved, list):
            saved = saved[-1] if saved else None
        attributes = (saved or {}).get("attributes") or {}
        if not attributes.get("steps"):
            return
        self.steps = [int(s) for s in attributes["steps"]]
        self.measurements = [dict(m) for m in attributes["measurements"]]
        self.best_step = attributes.get("best_step")
        self.original = attributes.get("original")
        if self.criterion is not None and self.original:
            self.criterion.original = dict(self.original)
        if self.keep == "memory" and self.restore:
            path = Path(args.output_dir) / f"checkpoint-{state.global_step}" / SELECTION_WEIGHTS
            if not path.is_file():
                raise FileNotFoundError(
                    f"Resuming with SelectionCallback(keep='memory') needs {path} (written with every checkpoint); "
                    "it is missing, so the kept weights cannot be restored."
                )
            from safetensors.torch import load_file

            self._best = load_file(str(path))

    @staticmethod
    def _check_not_sharded(args: Any, model: Any) -> None:
        """Refuse a run whose weights are partitioned across processes (DeepSpeed ZeRO-3, FSDP): the callback
        copies and restores the trainable parameters locally, which would keep and restore shards only."""
        from transformers.integrations import is_deepspeed_zero3_enabled

        from .partitioning import is_partitioned

        sharded = bool(getattr(args, "fsdp", None)) or is_deepspeed_zero3_enabled()
        if sharded or (model is not None and is_partitioned(model)):
            raise ValueError(
                "SelectionCallback keeps and restores the trainable weights on each process, and under DeepSpeed "
                "ZeRO-3 / FSDP each process holds only a shard of them; it does not gather shards. Select with "
                "DDP (torchrun / accelerate launch without FSDP or ZeRO-3), ZeRO-1/2, or one process."
            )

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        self._require_criterion()
        self._check_not_sharded(args, model)
        if state.global_step > 0:  # resumed: the measurements so far come from the checkpoint
            self._restore_from_checkpoint(args, state)
        if not self.steps:
            self._measure(args, state, model, processing_class)

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if state.global_step % self.selection_steps == 0:
            self._measure(args, state, model, processing_class)

    def on_save(self, args, state, control, model=None, **kwargs):
        if self.keep != "memory" or self._best is None:
            return
        from safetensors.torch import save_file

        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if folder.is_dir() and getattr(state, "is_world_process_zero", True):  # one writer per launch
            save_file(self._best, str(folder / SELECTION_WEIGHTS))

    def on_train_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        import torch

        self._measure(args, state, model, processing_class)
        criterion = self._require_criterion()
        self.record = criterion.decide([{"step": s} for s in self.steps], self.measurements)
        if not self.restore:
            return
        best = self._load_best(args)
        if best is None:
            raise RuntimeError("SelectionCallback lost the kept weights; cannot restore the chosen step.")
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, value in best.items():
                params[name].copy_(value.to(device=params[name].device, dtype=params[name].dtype))


# ---------------------------------------------------------------------------------------- one entry point
#: Methods whose strength is searched without training: GROM's exact path and T3's (T, w) calibration.
SEARCHED_METHODS = ("grom", "t3")
#: Trainer methods that keep their own stopping rule: the callback records the criterion but restores nothing.
OWN_STOP_METHODS = ("masc",)


def run_with_selection(
    run_method: Any,
    result_type: Any,
    method: str,
    model: Any,
    tokenizer: Any,
    forget: Any,
    retain: Any,
    output_dir: str | os.PathLike,
    settings: Mapping[str, Any],
    criterion: SelectionCriterion,
    *,
    selection_steps: int = 50,
    keep: str = "memory",
    **run_options: Any,
) -> Any:
    """Run ``method`` with its strength chosen by ``criterion``; returns the method runner's result with
    ``info["selection"]`` (the record as a dict).

    * ``grom``: :func:`hf_unlearn.methods.grom.path.fit_grom_path` (one fit, 9 exact points) and
      :meth:`~hf_unlearn.methods.grom.path.GROMPath.select`; the chosen edit is merged as the plain GROM runner does.
    * ``t3``: the head is fitted once by ``run_method``, then :func:`hf_unlearn.methods.t3.calibration.calibrate_t3`
      writes the chosen ``(T, w)`` into it; the scorer and the logits processor are rebuilt with them.
    * trainers: a :class:`SelectionCallback` joins ``run_options["callbacks"]`` and restores the chosen step's
      weights (MASC keeps its own stopping rule; the criterion is recorded beside it and nothing is restored).

    ``run_method`` is the method registry's runner (``run_method(name, model, tokenizer, forget, retain,
    output_dir, settings, **run_options)``) and ``result_type`` its result class, passed in by the caller;
    ``result.seconds`` is the time of the whole run (fit, search and measurements).
    """
    start = time.perf_counter()
    result = _run_selected(run_method, result_type, method, model, tokenizer, forget, retain, output_dir,
                           dict(settings), criterion, selection_steps, keep, run_options)
    result.seconds = time.perf_counter() - start  # the whole run: fit, search and measurements
    return result


def _run_selected(
    run_method: Any, result_type: Any, method: str, model: Any, tokenizer: Any, forget: Any, retain: Any,
    output_dir: str | os.PathLike, settings: dict[str, Any], criterion: SelectionCriterion, selection_steps: int,
    keep: str, run_options: dict[str, Any],
) -> Any:
    if method == "grom":
        from .methods.grom import GROMConfig
        from .methods.grom.path import fit_grom_path

        path = fit_grom_path(model, tokenizer, forget, retain, GROMConfig(**{"progress": False, **settings}))
        edit = path.select(criterion, model, tokenizer)
        total = sum(p.numel() for p in model.parameters())
        delta_params = sum(f.lora_A.numel() + f.lora_B.numel() for f in edit.lora_factors().values())
        merged = edit.to_peft(model).merge_and_unload()
        merged.eval()
        chosen = path.points[path.record.index]
        info = {"selected_layers": list(edit.selected_layers), "truncation_errors": edit.truncation_errors(),
                "retain_rows_read": edit.stats.get("num_retain_rows_read"), "selection": path.record.to_dict()}
        return result_type(
            method="grom", model=merged, artifact=edit,
            settings={**settings, "retain_weight": chosen["retain_weight"], "ridge": chosen["ridge"],
                      "target_scale": chosen["scale"]},
            trainable_params=delta_params, total_params=total, info=info,
        )
    if method == "t3":
        from transformers import LogitsProcessorList

        from .methods.t3 import T3LogitsProcessor, t3_scorer
        from .methods.t3.calibration import calibrate_t3

        result = run_method(method, model, tokenizer, forget, retain, output_dir, settings, **run_options)
        head = result.artifact
        record = calibrate_t3(model, tokenizer, head, criterion)
        result.scorer = t3_scorer(model, head)
        result.generation_kwargs = {"logits_processor": LogitsProcessorList([T3LogitsProcessor(model, head)])}
        result.settings.update(temperature=head.config.temperature, tilt_weight=head.config.tilt_weight)
        result.info["selection"] = record.to_dict()
        return result
    callback = SelectionCallback(criterion, selection_steps=selection_steps, keep=keep,
                                 restore=method not in OWN_STOP_METHODS)
    options = dict(run_options)
    options["callbacks"] = [*options.get("callbacks", ()), callback]
    result = run_method(method, model, tokenizer, forget, retain, output_dir, settings, **options)
    if callback.record is None:
        raise RuntimeError(f"{method}: the selection callback did not run (no training happened).")
    result.info["selection"] = callback.record.to_dict()
    return result
