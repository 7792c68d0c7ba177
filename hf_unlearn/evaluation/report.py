"""TOFU reports: :class:`TOFUReport` (what :func:`~hf_unlearn.evaluation.evaluate_tofu` returns) and its JSON form,
saved retain-reference truth ratios, :data:`METRIC_DEFINITIONS` and the tables that print them."""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..jsonutil import read_json_file
from ..safe_output import atomic_write_json

TRUTH_RATIOS_FORMAT = "hf_unlearn.tofu_forget_truth_ratios"


def write_json_atomic(obj: Any, path: str | os.PathLike) -> Path:
    """Write ``obj`` as JSON to ``path`` through a temporary file and a rename (never half-written)."""
    return atomic_write_json(path, obj)


def save_truth_ratios(report: TOFUReport | Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Save a report's forget truth ratios, components, MIA AUCs and provenance as JSON: a retain reference
    that ``evaluate_tofu(..., retain_reference=path)`` reads. ``report`` is a :class:`TOFUReport` or its dict."""
    report = as_report(report)
    ratios = checked_truth_ratios({"forget_truth_ratios": report.forget_truth_ratios}, "the report")
    mia = report.mia
    payload = {
        "format": TRUTH_RATIOS_FORMAT, "model_name": report.model_name, "source": report.source,
        "forget_split": report.forget_split, "num_examples": len(ratios), "forget_truth_ratios": ratios,
        "components": report.components, "mia": {"auc": mia.get("auc")} if isinstance(mia, Mapping) else None,
        "provenance": report.provenance,
    }
    return write_json_atomic(payload, path)


def load_truth_ratios(path: str | os.PathLike) -> dict[str, Any]:
    """Read a file written by :func:`save_truth_ratios` (or a full report JSON)."""
    data = read_json_file(path, "Retain-reference truth ratios ")
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object with 'forget_truth_ratios'.")
    data["forget_truth_ratios"] = checked_truth_ratios(data, str(path))
    return data


def checked_truth_ratios(data: Mapping[str, Any], origin: str) -> list[float]:
    """The non-empty list of finite positive ``forget_truth_ratios`` in ``data``, else ``ValueError``."""
    ratios = data.get("forget_truth_ratios")
    if not isinstance(ratios, (list, tuple)) or not ratios:
        raise ValueError(f"{origin} has no non-empty 'forget_truth_ratios' list.")
    values = [float(r) for r in ratios]
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"{origin} holds truth ratios that are not finite positive numbers.")
    return values


# Every figure of a report: key -> (title, definition). Printed by render_report and `hf-unlearn eval --help`.
METRIC_DEFINITIONS: dict[str, tuple[str, str]] = {
    "forget_quality": (
        "forget quality",
        "p-value of the two-sample KS test between this model's and the retain model's per-question forget truth ratios (TOFU). High (>0.05) = indistinguishable from never having seen the forget set.",
    ),
    "ks_statistic": ("KS statistic", "D = sup_x |F_model(x) - F_retain(x)| of the forget truth ratios."),
    "model_utility": (
        "model utility",
        "harmonic mean of the nine components: probability, ROUGE-L recall and truth ratio on retain, real authors and world facts (TOFU). 0 if any is 0.",
    ),
    "mu_rouge": (
        "MU-ROUGE",
        "harmonic mean of the retain, real-authors and world-facts mean ROUGE-L recalls (T3's utility figure).",
    ),
    "forget_rouge_l": (
        "forget ROUGE-L",
        "mean ROUGE-L recall of the greedy answer (up to max_new_tokens) against the gold forget answer (rouge-score, Porter stemmer).",
    ),
    "forget_truth_ratio": (
        "forget truth ratio",
        "mean of min(tr, 1/tr), tr = exp(loss(paraphrased) - mean loss(perturbed)) per forget question (avg per-token NLLs); 1 = the model cannot tell true from false.",
    ),
    "forget_prob": ("forget prob", "mean exp(-avg NLL) of the forget answers given their questions."),
    "retain_rouge_l": ("retain ROUGE-L", "mean ROUGE-L recall of greedy answers on retain_perturbed."),
    "retain_prob": ("retain prob", "mean exp(-avg NLL) of the retain answers."),
    "retain_truth_ratio": ("retain truth ratio", "mean of max(0, 1 - tr) on retain_perturbed."),
    "extraction_strength": (
        "extraction strength",
        "mean over forget answers of 1 - k*/n, k* = the shortest answer prefix after which teacher-forced greedy predictions match every remaining token (open-unlearning).",
    ),
    "exact_memorization": (
        "exact memorization",
        "mean over forget answers of the fraction of answer tokens equal to the teacher-forced greedy prediction.",
    ),
    "mia_loss": ("MIA AUC loss", "ROC AUC of the answer's avg NLL, forget (0) vs holdoutNN (1); 0.5 = no signal."),
    "mia_zlib": ("MIA AUC zlib", "ROC AUC of avg NLL / zlib-compressed length of the answer text."),
    "mia_min_k": ("MIA AUC min-k", "ROC AUC of minus the mean of the lowest 40% answer-token log-probs."),
    "mia_min_k_plus_plus": (
        "MIA AUC min-k++",
        "ROC AUC of Min-K%++ (40%): token log-probs standardised by the next-token distribution's mean and std.",
    ),
    "privleak": (
        "privleak",
        "(score - ref) / ref * 100 with score = 1 - AUC(min-k) and ref = 1 - the retain model's AUC (0.5 when no retain reference). Near 0 = like the retain model; strongly negative = the forget set is recognisable.",
    ),
}

# format_report_table's columns (titles from METRIC_DEFINITIONS), and the formats of figures not shown as ".3f"
TABLE_COLUMNS = ("forget_quality", "model_utility", "forget_rouge_l", "forget_truth_ratio", "forget_prob",
                 "retain_rouge_l", "retain_prob", "mu_rouge", "extraction_strength", "exact_memorization", "mia_min_k",
                 "privleak")
_FORMATS = {"forget_quality": ".3g", "privleak": ".2f"}


def _cell(report: TOFUReport, key: str) -> str:
    value = report.figure(key)
    return "n/a" if value is None else format(float(value), _FORMATS.get(key, ".3f"))


def format_report_table(reports: Mapping[str, TOFUReport | Mapping[str, Any]]) -> str:
    """A markdown table with one row per named report (name -> :class:`TOFUReport` of ``evaluate_tofu``, or its
    dict form)."""
    if not reports:
        raise ValueError("format_report_table needs at least one report.")
    typed = {name: as_report(rep) for name, rep in reports.items()}
    header = "| model | " + " | ".join(METRIC_DEFINITIONS[key][0] for key in TABLE_COLUMNS) + " |"
    rule = "|---|" + "---:|" * len(TABLE_COLUMNS)
    rows = [f"| {name} | " + " | ".join(_cell(rep, key) for key in TABLE_COLUMNS) + " |" for name, rep in typed.items()]
    return "\n".join([header, rule, *rows])


def metric_definitions_text(width: int = 100) -> str:
    """Every figure's title and definition as plain text (for ``--help`` epilogs)."""
    import textwrap

    lines = []
    for title, definition in METRIC_DEFINITIONS.values():
        lines.extend(textwrap.wrap(f"{title}: {definition}", width=width, subsequent_indent="    "))
    return "\n".join(lines)


def render_report(report: TOFUReport | Mapping[str, Any]) -> str:
    """A report (or its dict form) as a header line and a markdown table of figure, value and definition;
    figures the report lacks show ``n/a``."""
    report = as_report(report)
    settings = report.settings or {}
    ref = report.retain_reference
    ref_text = "none (forget quality n/a, privleak against AUC 0.5)"
    if isinstance(ref, Mapping):
        prov = ref.get("provenance") or {}
        ref_text = f"{prov.get('format', '?')}: {prov.get('path') or prov.get('model_name') or 'in memory'}"
    elif ref:
        ref_text = str(ref)
    head = (
        f"model: {report.model_name} | data: {report.source} {report.forget_split} | "
        f"template: {settings.get('template')} | max_examples: {settings.get('max_examples')} | "
        f"max_new_tokens: {settings.get('max_new_tokens')} | retain reference: {ref_text}"
    )
    rows = ["| figure | value | definition |", "|---|---:|---|"]
    for key, (title, definition) in METRIC_DEFINITIONS.items():
        rows.append(f"| {title} | {_cell(report, key)} | {definition.replace('|', chr(92) + '|')} |")
    return "\n".join([head, "", *rows])


#: The flat attack figures of a report (:data:`hf_unlearn.evaluation.attacks.ATTACK_COLUMNS`' keys), present with
#: the ``attacks`` section when attacks ran.
ATTACK_FIELDS = (
    "attack_nf4_forget_rouge_l", "attack_int8_forget_rouge_l", "attack_nf4_recovered", "attack_int8_recovered",
    "attack_relearn_forget_nll", "attack_relearn_recovered", "attack_benign_recovered",
)

# Fields of TOFUReport that are not report keys.
_NOT_KEYS = ("extra", "_omitted")


@dataclass(eq=False, repr=False, kw_only=True)
class TOFUReport:
    """The report of :func:`~hf_unlearn.evaluation.evaluate_tofu`: every figure (:data:`METRIC_DEFINITIONS`' and
    :data:`~hf_unlearn.evaluation.attacks.ATTACK_COLUMNS`' keys) and section as a typed attribute. :meth:`to_dict`
    is the JSON-ready dict; :meth:`from_dict` reads one back, also from an older version: optional keys it lacks
    stay ``None`` and absent from :meth:`to_dict`, keys that are no field are kept in ``extra``."""

    model_name: str
    source: str
    forget_split: str
    retain_reference: dict[str, Any] | str | None = None
    forget_quality: float | None
    ks_statistic: float | None
    model_utility: float
    forget_rouge_l: float
    forget_truth_ratio: float
    forget_prob: float
    retain_rouge_l: float
    retain_prob: float
    retain_truth_ratio: float
    mu_rouge: float | None = None
    extraction_strength: float | None = None
    exact_memorization: float | None = None
    mia_loss: float | None = None
    mia_zlib: float | None = None
    mia_min_k: float | None = None
    mia_min_k_plus_plus: float | None = None
    privleak: float | None = None
    components: dict[str, float]
    forget_truth_ratios: list[float]
    mia: dict[str, Any] | None = None
    num_examples: dict[str, int] | None = None
    splits: dict[str, dict[str, Any]] | None = None
    provenance: dict[str, Any] | None = None
    settings: dict[str, Any] | None = None
    hf_unlearn_version: str | None = None
    attacks: dict[str, Any] | None = None
    attack_nf4_forget_rouge_l: float | None = None
    attack_int8_forget_rouge_l: float | None = None
    attack_nf4_recovered: float | None = None
    attack_int8_recovered: float | None = None
    attack_relearn_forget_nll: float | None = None
    attack_relearn_recovered: float | None = None
    attack_benign_recovered: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # Optional keys the source dict lacked (from_dict); None: only the attack keys, absent when no attack ran.
    _omitted: frozenset[str] | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("float", "float | None"):
                number = isinstance(value, numbers.Real) and not isinstance(value, bool)
                if not (number or (value is None and f.type == "float | None")):
                    raise ValueError(f"TOFUReport.{f.name} must be a number{' or None' if 'None' in f.type else ''}, got {value!r}.")
        for name, kind, noun in (("components", Mapping, "dict"), ("forget_truth_ratios", (list, tuple), "list"),
                                 ("extra", dict, "dict")):
            if not isinstance(getattr(self, name), kind):
                raise ValueError(f"TOFUReport.{name} must be a {noun}, got {type(getattr(self, name)).__name__}.")

    # -- the dict form ------------------------------------------------------------------------------------------
    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The report keys that are fields, in the order :meth:`to_dict` writes them."""
        return tuple(f.name for f in fields(cls) if f.name not in _NOT_KEYS)

    @classmethod
    def required_fields(cls) -> tuple[str, ...]:
        """The keys every report has (those of the first released reports); the others are optional."""
        return tuple(f.name for f in fields(cls)
                     if f.name not in _NOT_KEYS and f.default is MISSING and f.default_factory is MISSING)

    @classmethod
    def missing_fields(cls, data: Mapping[str, Any]) -> list[str]:
        """The required keys ``data`` lacks (empty for a complete report)."""
        return [name for name in cls.required_fields() if name not in data]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TOFUReport:
        """A report from its dict form; ``TOFUReport.from_dict(d).to_dict() == d``. Refused (``ValueError``):
        not a mapping, a required key missing, a figure that is not a number."""
        if isinstance(data, TOFUReport):
            return dataclasses.replace(data, extra=dict(data.extra))
        if not isinstance(data, Mapping):
            raise ValueError(f"A TOFU report must be a dict, got {type(data).__name__}.")
        missing = cls.missing_fields(data)
        if missing:
            raise ValueError(f"The report lacks the required field(s) {missing}; a TOFU report of evaluate_tofu has {list(cls.required_fields())}.")
        names = cls.field_names()
        return cls(**{k: data[k] for k in names if k in data},
                   extra={k: v for k, v in data.items() if k not in names},
                   _omitted=frozenset(k for k in names if k not in data))

    @classmethod
    def load(cls, path: str | os.PathLike) -> TOFUReport:
        """Read a report JSON (as :meth:`save` or ``evaluate_tofu(..., output_path=)`` write it)."""
        return cls.from_dict(read_json_file(path, "Report file "))

    def save(self, path: str | os.PathLike) -> Path:
        """Write :meth:`to_dict` as JSON to ``path`` atomically (never half-written)."""
        return write_json_atomic(self.to_dict(), path)

    def _absent(self, name: str) -> bool:
        if getattr(self, name) is not None:
            return False
        if self._omitted is None:
            return self.attacks is None and (name == "attacks" or name in ATTACK_FIELDS)
        return name in self._omitted

    def _keys(self) -> list[str]:
        return [n for n in _FIELD_ORDER if not self._absent(n)] + list(self.extra)

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON-ready dict: every field's key (the optional ones the report lacks left out), in
        ``evaluate_tofu``'s order, then :attr:`extra`'s keys. Nested values are shared, not copied."""
        return {k: getattr(self, k) if k in _FIELD_NAMES else self.extra[k] for k in self._keys()}

    def has(self, key: str) -> bool:
        """Whether the report holds ``key`` (a field it has, even ``None``, or an :attr:`extra` key)."""
        return (key in _FIELD_NAMES and not self._absent(key)) or key in self.extra

    def figure(self, key: str) -> float | None:
        """A figure by name: a field (:data:`METRIC_DEFINITIONS`' keys, the attack figures), else one of the nine
        :attr:`components`, else an :attr:`extra` figure; ``None`` when the report lacks it."""
        if key in _FIELD_NAMES:
            value = getattr(self, key)
        else:
            value = self.extra.get(key)
        if value is None and isinstance(self.components, Mapping):
            value = self.components.get(key)
        return value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TOFUReport):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # a report is mutable

    def __repr__(self) -> str:
        shown = ("model_name", "source", "forget_split", "forget_quality", "model_utility", "forget_rouge_l")
        return f"TOFUReport({', '.join(f'{k}={getattr(self, k)!r}' for k in shown)}, ...)"


_FIELD_ORDER = TOFUReport.field_names()
_FIELD_NAMES = frozenset(_FIELD_ORDER)


def as_report(report: TOFUReport | Mapping[str, Any]) -> TOFUReport:
    """``report`` as a :class:`TOFUReport`: returned as is, or read from its dict form (:meth:`TOFUReport.from_dict`)."""
    return report if isinstance(report, TOFUReport) else TOFUReport.from_dict(report)
