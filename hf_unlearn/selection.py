"""Choosing an unlearning method's strength without a retain model: a reference-free forget criterion, the
default selection rule, the record it leaves beside the artifact, and a best-checkpoint callback for trainers.

**The criterion** (:class:`SelectionCriterion`) is built from rows the user has: ``forget`` (the rows to
unlearn), ``holdout`` (rows of the same kind that the model never saw, e.g. TOFU's ``holdout01/05/10``),
``retain_validation`` (retain rows not used for unlearning) and optionally ``generic`` rows. For a candidate
model it measures, with the model's own token scorer or a given one (T3's tilted scorer):

* forget side: how indistinguishable the forget rows are from the holdout rows. With ``n_i`` the per-example
  answer NLLs ``n_i = -(1/|a_i|) sum_t log p(a_{i,t} | q_i, a_{i,<t})``,

      forget_holdout_pvalue = KS two-sample p-value between {n_i : i in forget} and {n_j : j in holdout},

  the *reference-free forget quality* (TOFU's forget quality compares truth ratios with a retain model's; here
  the never-seen holdout rows play the retain model's part), and ``mia_auc``, the Min-K% membership-inference
  AUC of forget (label 0) against holdout (label 1) (:func:`hf_unlearn.evaluation.privacy.mia_auc`; 0.5 = no
  signal, near 1 = the forget rows are still recognised, near 0 = they are pushed *beyond* never-seen rows).
  A two-sided test penalises both an edit that leaves the forget rows memorised and one that overshoots;
* retain side: ``retain_change = max(mean NLL on retain_validation, mean NLL on generic) - the same under the
  original model`` (nats per answer token; each change also apart).

**The rule** (:meth:`SelectionCriterion.select`, candidates ordered weak -> strong):

1. candidates whose ``retain_change <= retain_tolerance`` (default 0.1 nats/token: the geometric-mean token
   probability of the retain answers falls by at most ``1 - e^{-0.1}``, about 10%, the size of TOFU's
   "90% of the target's utility" bar) are eligible;
2. among those, the one with the largest ``forget_holdout_pvalue``; equal p-values (KS p-values of a few rows
   are discrete) go to the weaker candidate;
3. when no eligible candidate reaches ``holdout_level`` (default p >= 0.05, i.e. a 5% KS test cannot tell the
   forget rows from the holdout rows), the strongest eligible candidate, with a warning that says so;
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


def forget_holdout_statistics(
    forget_token_log_probs: Sequence[np.ndarray], holdout_token_log_probs: Sequence[np.ndarray], k: float | None = None
) -> dict[str, float]:
    """Indistinguishability of forget and holdout rows from their per-token answer log-probabilities.

    Returns ``forget_holdout_pvalue`` and ``forget_holdout_ks`` (the two-sample Kolmogorov-Smirnov p-value and
    statistic ``D = sup_x |F_forget(x) - F_holdout(x)|`` of the per-example average NLLs
    ``n_i = -mean_t log p_t``), ``mia_auc`` (Min-K% AUC, forget labelled 0 and holdout 1) and the two mean NLLs.
    Identical distributions give ``p = 1`` and ``mia_auc = 0.5``. A non-finite log-probability gives
    ``p = 0`` and ``mia_auc = None`` (such a candidate cannot be told apart from nothing).
    """
    from scipy.stats import ks_2samp

    from .evaluation.privacy import MIN_K_FRACTION, mia_auc, min_k_score

    k = MIN_K_FRACTION if k is None else k
    if not forget_token_log_probs or not holdout_token_log_probs:
        raise ValueError("The criterion needs at least one forget and one holdout row.")
    nll_f = np.array([-np.mean(lp) if len(lp) else 0.0 for lp in forget_token_log_probs], dtype=np.float64)
    nll_h = np.array([-np.mean(lp) if len(lp) else 0.0 for lp in holdout_token_log_probs], dtype=np.float64)
    out = {"forget_nll": float(nll_f.mean()), "holdout_nll": float(nll_h.mean())}
    if not (np.isfinite(nll_f).all() and np.isfinite(nll_h).all()):
        return {**out, "forget_holdout_pvalue": 0.0, "forget_holdout_ks": 1.0, "mia_auc": None}
    test = ks_2samp(nll_f, nll_h)
    auc = mia_auc([min_k_score(lp, k) for lp in forget_token_log_probs],
                  [min_k_score(lp, k) for lp in holdout_token_log_probs])
    return {**out, "forget_holdout_pvalue": float(test.pvalue), "forget_holdout_ks": float(test.statistic),
            "mia_auc": auc}


def select_candidate(
    measurements: Sequence[Mapping[str, Any]],
    retain_tolerance: float = DEFAULT_RETAIN_TOLERANCE,
    holdout_level: float = DEFAULT_HOLDOUT_LEVEL,
) -> tuple[int, str, str | None]:
    """The default rule (module docstring) on measurements ordered weak -> strong: ``(index, reason, warning)``,
    ``warning`` None when a candidate within the retain tolerance reaches the holdout level."""
    if not measurements:
        raise ValueError("select() needs at least one measured candidate.")

    def change(m: Mapping[str, Any]) -> float:
        value = m.get("retain_change")
        return float(value) if _finite(value) else math.inf

    def pvalue(m: Mapping[str, Any]) -> float:
        value = m.get("forget_holdout_pvalue")
        return float(value) if _finite(value) else 0.0

    eligible = [i for i, m in enumerate(measurements) if change(m) <= retain_tolerance]
    if not eligible:
        best = min(range(len(measurements)), key=lambda i: (change(measurements[i]), i))
        warning = (f"No candidate keeps the retain change within {retain_tolerance:g} nats/token (smallest: "
                   f"{change(measurements[best]):.4g}, candidate {best}); chose the one with the smallest retain change.")
        return best, warning, warning
    top = max(pvalue(measurements[i]) for i in eligible)
    if top >= holdout_level:
        best = next(i for i in eligible if math.isclose(pvalue(measurements[i]), top, rel_tol=1e-9, abs_tol=1e-15))
        reason = (f"candidate {best}: forget rows most indistinguishable from holdout (KS p = {top:.4g} >= "
                  f"{holdout_level:g}) among {len(eligible)} of {len(measurements)} candidates within the retain "
                  f"tolerance {retain_tolerance:g} (its retain change {change(measurements[best]):+.4g}); ties go to the "
                  "weaker candidate")
        return best, reason, None
    best = eligible[-1]
    warning = (f"No candidate within the retain tolerance {retain_tolerance:g} reaches the holdout level (best KS p = "
               f"{top:.4g} < {holdout_level:g}): the forget rows stay distinguishable from never-seen rows; chose the "
               f"strongest candidate within the tolerance ({best}, retain change {change(measurements[best]):+.4g}).")
    return best, warning, warning


@dataclass
class SelectionRecord:
    """Every candidate's settings and measurements and the decision: what ``selection_record.json`` holds.

    ``candidates[i]`` names candidate ``i`` (e.g. ``{"scale": 0.5, "retain_weight": 10.0, "ridge": 0.01}`` or
    ``{"step": 40}``), ``measurements[i]`` is its :meth:`SelectionCriterion.measure` dict, ``index`` the chosen
    one, ``reason`` why, ``warning`` set when the rule fell back (no candidate reached the holdout level or the
    retain tolerance), ``rule`` the rule's settings and ``original`` the original model's retain figures.
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
        cols = ["forget_holdout_pvalue", "mia_auc", "retain_change", "forget_nll"]
        head = ["#", *setting_keys, "KS p (forget vs holdout)", "MIA AUC", "retain change", "forget NLL"]
        lines = [
            "## Strength selection (reference-free)",
            "",
            f"Chosen: candidate {self.index} ({_settings_text(self.chosen)}). {self.reason}",
            "",
            f"Rule: among candidates whose retain NLL rises by at most {self.rule.get('retain_tolerance')} nats/token, "
            "the one whose forget answers are most indistinguishable from never-seen holdout answers (two-sample KS "
            f"p-value of per-example NLLs); ties to the weaker; below p = {self.rule.get('holdout_level')} the "
            "strongest within the tolerance.",
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


def _question_answer_rows(rows: Any, what: str, required: bool = True) -> list[dict[str, str]] | None:
    if rows is None:
        if required:
            raise ValueError(f"SelectionCriterion needs {what} rows.")
        return None
    out = [{"question": r["question"], "answer": r["answer"]} for r in rows]
    if not out:
        raise ValueError(f"The {what} rows of the selection criterion are empty.")
    return out


class SelectionCriterion:
    """The reference-free criterion and the default selection rule (see the module docstring).

    Args:
        forget: rows to unlearn (``question``/``answer``; a list of dicts or a ``datasets.Dataset``).
        holdout: rows of the same kind the model never saw (TOFU ``holdout01/05/10`` or the user's own).
        retain_validation: retain rows *not* used for unlearning.
        generic: optional general-knowledge rows; their NLL change counts toward ``retain_change`` too.
        retain_tolerance: largest allowed ``retain_change`` (nats per answer token).
        holdout_level: KS p-value at which the forget rows count as indistinguishable from the holdout rows.
        original: the original model's retain figures (``measure_original``'s dict); measured on the first
            :meth:`measure` call otherwise, so call :meth:`measure_original` (or measure the original model)
            first.
        template, batch_size, max_length: how rows are tokenized and batched (as the evaluator and the method).
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
        self.retain_tolerance = float(retain_tolerance)
        self.holdout_level = float(holdout_level)
        self.original = dict(original) if original is not None else None
        self.template = template
        self.batch_size = int(batch_size)
        self.max_length = max_length

    # ----------------------------------------------------------------------------------------- measuring
    def _score(self, model: Any, tokenizer: Any, rows: list[dict[str, str]], scorer: Any) -> list[np.ndarray]:
        from .logprobs import answer_token_statistics

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
        """The criterion on one candidate: ``forget_holdout_pvalue``, ``forget_holdout_ks``, ``mia_auc``,
        ``forget_nll``, ``holdout_nll``, ``retain_validation_nll`` / ``_change``, ``generic_nll`` / ``_change``,
        ``retain_change`` and ``seconds``.

        ``scorer`` is a :data:`hf_unlearn.logprobs.TokenScorer` (default: the model's own log-probabilities;
        T3's :func:`hf_unlearn.methods.t3.t3_scorer` for a tilted candidate). Without ``original`` figures, the first call
        takes its model as the original (its ``retain_change`` is 0).
        """
        from .logprobs import causal_lm_scorer

        start = time.perf_counter()
        scorer = scorer or causal_lm_scorer(model)
        forget = self._score(model, tokenizer, self.forget, scorer)
        holdout = self._score(model, tokenizer, self.holdout, scorer)
        out: dict[str, Any] = forget_holdout_statistics(forget, holdout)
        figures = self._retain_figures(model, tokenizer, scorer)
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
        out["seconds"] = time.perf_counter() - start
        return out

    # ----------------------------------------------------------------------------------------- deciding
    def rule(self) -> dict[str, Any]:
        """The rule's settings, as the record stores them."""
        return {"name": "holdout-indistinguishable within retain tolerance", "retain_tolerance": self.retain_tolerance,
                "holdout_level": self.holdout_level, "order": "weak -> strong", "ties": "weaker candidate"}

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
    with (default: the model's own). One process (the weights are read and written locally).
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

    def _keep(self, args: Any, model: Any) -> None:
        weights = self._trainable(model)
        if self.keep == "memory":
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
                self._keep(args, model)

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

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        self._require_criterion()
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
        if folder.is_dir():
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
