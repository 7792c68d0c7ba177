"""The selection rule and its record: forget/holdout statistics of per-row NLLs, the rule that picks a
candidate, and :class:`SelectionRecord`, saved beside the artifact (``selection_record.json``)."""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..jsonutil import json_safe, read_json_file

SELECTION_RECORD = "selection_record.json"
SELECTION_WEIGHTS = "selection_best.safetensors"
DEFAULT_RETAIN_TOLERANCE = 0.1
DEFAULT_HOLDOUT_LEVEL = 0.05
#: The equivalence margin: within it (nats per answer token) a forget rows' shift counts as that of never-seen rows.
DEFAULT_HOLDOUT_MARGIN = 0.5


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value))


def _row_nlls(token_log_probs: Sequence[np.ndarray]) -> np.ndarray:
    return np.array([-np.mean(lp) if len(lp) else 0.0 for lp in token_log_probs], dtype=np.float64)


def forget_holdout_statistics(
    forget_token_log_probs: Sequence[np.ndarray], holdout_token_log_probs: Sequence[np.ndarray],
    k: float | None = None, *, groups: tuple[Sequence[Any], Sequence[Any]] | None = None,
    reference_nll: tuple[Sequence[float], Sequence[float]] | None = None,
    margin: float = DEFAULT_HOLDOUT_MARGIN,
) -> dict[str, Any]:
    """Indistinguishability of forget and holdout rows from their per-token answer log-probabilities.

    With the shift ``d_i = n_i - r_i`` (:mod:`hf_unlearn.selection`): ``shift_gap`` with its Welch ``shift_gap_se`` /
    ``shift_gap_df`` and two-sided ``forget_holdout_pvalue`` on the group means
    (:func:`hf_unlearn.evaluation.privacy.group_mean_shift_test`; ``None`` with one row on a side),
    ``forget_shift`` / ``holdout_shift``, ``equivalence_pvalue`` that ``|shift_gap| < margin``
    (:func:`hf_unlearn.evaluation.privacy.equivalence_pvalue`), and for reference the rows' KS statistic and p-value
    (``forget_holdout_ks``, ``forget_holdout_ks_pvalue``), the Min-K% ``mia_auc`` (forget 0, holdout 1) and the two
    mean NLLs. Identical rows give ``p = 1``, ``shift_gap = 0``, ``mia_auc = 0.5``; a non-finite log-probability
    gives ``p = 0`` and ``shift_gap = mia_auc = None``.
    """
    from scipy.stats import ks_2samp

    from ..evaluation.privacy import (
        MIN_K_FRACTION,
        group_mean_shift_test,
        mia_auc,
        min_k_score,
    )

    k = MIN_K_FRACTION if k is None else k
    if not forget_token_log_probs or not holdout_token_log_probs:
        raise ValueError("The criterion needs at least one forget and one holdout row.")
    nll_f, nll_h = _row_nlls(forget_token_log_probs), _row_nlls(holdout_token_log_probs)
    out: dict[str, Any] = {"forget_nll": float(nll_f.mean()), "holdout_nll": float(nll_h.mean())}
    if not (np.isfinite(nll_f).all() and np.isfinite(nll_h).all()):
        return {**out, "forget_holdout_pvalue": 0.0, "equivalence_pvalue": 1.0, "shift_gap": None,
                "shift_gap_se": None, "shift_gap_df": None, "forget_shift": None, "holdout_shift": None,
                "forget_holdout_ks_pvalue": 0.0, "forget_holdout_ks": 1.0, "mia_auc": None}
    ref_f, ref_h = ((np.zeros_like(nll_f), np.zeros_like(nll_h)) if reference_nll is None else
                    (np.asarray(reference_nll[0], dtype=np.float64), np.asarray(reference_nll[1], dtype=np.float64)))
    if ref_f.shape != nll_f.shape or ref_h.shape != nll_h.shape:
        raise ValueError(f"reference_nll holds {ref_f.size} forget and {ref_h.size} holdout values for "
                         f"{nll_f.size} forget and {nll_h.size} holdout rows.")
    shift_f, shift_h = nll_f - ref_f, nll_h - ref_h
    labels_f, labels_h = groups if groups is not None else (range(nll_f.size), range(nll_h.size))
    if min(len(set(labels_f)), len(set(labels_h))) < 2:  # one row on a side: a gap, but no spread to test it by
        test = {"gap": float(shift_f.mean() - shift_h.mean()), "se": None, "df": None, "pvalue": None}
    else:
        test = group_mean_shift_test(shift_f, shift_h, list(labels_f), list(labels_h))
    ks = ks_2samp(nll_f, nll_h)
    auc = mia_auc([min_k_score(lp, k) for lp in forget_token_log_probs],
                  [min_k_score(lp, k) for lp in holdout_token_log_probs])
    stats = {**out, "forget_holdout_pvalue": test["pvalue"], "shift_gap": test["gap"], "shift_gap_se": test["se"],
             "shift_gap_df": float(test["df"]) if _finite(test["df"]) else None,
             "forget_shift": float(shift_f.mean()), "holdout_shift": float(shift_h.mean()),
             "forget_holdout_ks_pvalue": float(ks.pvalue), "forget_holdout_ks": float(ks.statistic), "mia_auc": auc}
    return {**stats, "equivalence_pvalue": measurement_equivalence_pvalue(stats, margin)}


def select_candidate(
    measurements: Sequence[Mapping[str, Any]], retain_tolerance: float = DEFAULT_RETAIN_TOLERANCE,
    holdout_level: float = DEFAULT_HOLDOUT_LEVEL, holdout_margin: float = DEFAULT_HOLDOUT_MARGIN,
) -> tuple[int, str, str | None]:
    """The default rule (module docstring) on measurements ordered weak -> strong: ``(index, reason, warning)``,
    ``warning`` None when the chosen candidate is within the retain tolerance and its forget rows are shown to lie
    within ``holdout_margin`` of the holdout rows (:func:`measurement_equivalence_pvalue` below ``holdout_level``)."""
    if not measurements:
        raise ValueError("select() needs at least one measured candidate.")

    def change(m: Mapping[str, Any]) -> float:
        value = m.get("retain_change")
        return float(value) if _finite(value) else math.inf

    def gap(m: Mapping[str, Any]) -> float:
        value = m.get("shift_gap")
        return abs(float(value)) if _finite(value) else math.inf

    eligible = [i for i, m in enumerate(measurements) if change(m) <= retain_tolerance]
    if not eligible:
        best = min(range(len(measurements)), key=lambda i: (change(measurements[i]), i))
        warning = (f"No candidate keeps the retain change within {retain_tolerance:g} nats/token (smallest: "
                   f"{change(measurements[best]):.4g}, candidate {best}); chose the one with the smallest retain change.")
        return best, warning, warning
    best = min(eligible, key=lambda i: (gap(measurements[i]), i))
    chosen = measurements[best]
    shift = f"{float(chosen['shift_gap']):+.4g}" if _finite(chosen.get("shift_gap")) else "n/a"
    p_equal = measurement_equivalence_pvalue(chosen, holdout_margin)
    reason = (f"candidate {best}: forget rows' NLL shift closest to the holdout rows' (gap {shift} nats/token, "
              f"equivalence p = {p_equal:.4g} for a margin of {holdout_margin:g}) among {len(eligible)} of "
              f"{len(measurements)} candidates within the retain tolerance {retain_tolerance:g} (its retain change "
              f"{change(chosen):+.4g}); ties go to the weaker candidate")
    if p_equal < holdout_level:
        return best, reason, None
    warning = (f"The candidate closest to the holdout rows within the retain tolerance {retain_tolerance:g} "
               f"(candidate {best}, gap {shift} nats/token) is not shown to lie within {holdout_margin:g} nats/token "
               f"of never-seen rows (equivalence p = {p_equal:.4g} >= {holdout_level:g}).")
    return best, reason, warning


def measurement_equivalence_pvalue(measurement: Mapping[str, Any],
                                   holdout_margin: float = DEFAULT_HOLDOUT_MARGIN) -> float:
    """The equivalence p-value of one measurement for ``holdout_margin``
    (:func:`hf_unlearn.evaluation.privacy.equivalence_pvalue` of its ``shift_gap``, ``shift_gap_se`` and
    ``shift_gap_df``); 1 when any of them is missing."""
    from ..evaluation.privacy import equivalence_pvalue

    values = [measurement.get(k) for k in ("shift_gap", "shift_gap_se", "shift_gap_df")]
    gap, se, df = (float(v) if _finite(v) else None for v in values)
    return equivalence_pvalue(gap, se, df, holdout_margin)


@dataclass
class SelectionRecord:
    """Every candidate's settings and measurements and the decision: what ``selection_record.json`` holds.

    ``candidates[i]`` names candidate ``i`` (e.g. ``{"scale": 0.5, "retain_weight": 10.0, "ridge": 0.01}`` or
    ``{"step": 40}``), ``measurements[i]`` is its :meth:`SelectionCriterion.measure` dict, ``index`` the chosen
    one, ``reason`` why, ``warning`` set when the chosen candidate is not shown to lie within the equivalence
    margin of the holdout rows (equivalence p at or above the holdout level) or no candidate is within the retain
    tolerance, ``rule`` the rule's settings and ``original`` the original model's retain figures.
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
        return json_safe({"format": "hf-unlearn-selection/1", **asdict(self), "chosen": self.chosen})

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
        from ..safe_output import atomic_write_json

        path = Path(folder_or_file)
        if path.is_dir() or not path.suffix:
            path = path / SELECTION_RECORD
        return atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, folder_or_file: str | os.PathLike) -> SelectionRecord:
        """Read a record written by :meth:`save` (a folder or the JSON file)."""
        path = Path(folder_or_file)
        return cls.from_dict(read_json_file(path / SELECTION_RECORD if path.is_dir() else path, "Selection record "))

    def markdown(self) -> str:
        """The record as a model-card section: the rule, the decision and one table row per candidate."""
        setting_keys = list(dict.fromkeys(k for c in self.candidates for k in c))
        cols = ["shift_gap", "shift_gap_se", "equivalence_pvalue", "forget_holdout_pvalue", "retain_change",
                "forget_holdout_ks_pvalue", "mia_auc", "forget_nll"]
        head = ["#", *setting_keys, "NLL shift gap (forget - holdout)", "its standard error", "equivalence p",
                "difference p", "retain change", "KS p (rows)", "MIA AUC", "forget NLL"]
        groups = self.rule.get("groups") or "rows"
        unit = "rows (each row its own group)" if groups == "rows" else f"group means ({groups})"
        shift = ("NLL minus the reference model's NLL on the same row" if self.rule.get("reference")
                 else "answer NLL")
        lines = [
            "## Strength selection (reference-free)",
            "",
            f"Chosen: candidate {self.index} ("
            f"{', '.join(f'{k}={_fmt(v)}' for k, v in self.chosen.items()) or 'no settings'}). {self.reason}",
            "",
            f"Rule: among candidates whose retain NLL rises by at most {self.rule.get('retain_tolerance')} nats/token, "
            f"the one whose forget rows' mean shift ({shift}) is closest to the never-seen holdout rows'; ties to "
            f"the weaker. Equivalence test: two one-sided Welch t-tests on the {unit} that the gap lies within "
            f"+-{self.rule.get('holdout_margin')} nats/token; at p >= {self.rule.get('holdout_level')} the choice "
            "carries a warning (the difference p is Welch's two-sided test, for reference).",
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
