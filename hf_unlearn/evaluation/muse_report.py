"""The typed report of :func:`~hf_unlearn.evaluation.evaluate_muse` (MUSE's C1-C4, in percent), its JSON form and
its table."""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..jsonutil import read_json_file
from ..safe_output import atomic_write_json

MUSE_REPORT_FORMAT = "hf_unlearn.muse_report"

# Every figure of a MUSE report: key -> (title, definition).
MUSE_METRIC_DEFINITIONS: dict[str, tuple[str, str]] = {
    "verbmem_forget": (
        "VerbMem forget (C1)",
        "100 x mean ROUGE-L F1 of the greedy 128-token continuation of each forget prompt against its true continuation cut to 128 tokens. Lower = less verbatim memorisation.",
    ),
    "knowmem_forget": (
        "KnowMem forget (C2)",
        "100 x mean ROUGE-L F1 of the greedy answer (at most 32 new tokens after 10 in-context examples, cut at a blank line or 'Question') to the forget-set questions. Lower = less knowledge of the forget set.",
    ),
    "privleak": (
        "PrivLeak (C3)",
        "(AUC - AUC_retrain) / AUC_retrain x 100, AUC = P(Min-40% score of a forget text > that of a holdout text). Near 0 = like the retrained model; near -100 = the forget texts are recognisable as training data.",
    ),
    "knowmem_retain": (
        "KnowMem retain (C4)",
        "KnowMem on the retain-set questions: the utility kept. Higher = better.",
    ),
    "privleak_auc": ("PrivLeak AUC", "the model's Min-40% AUC, forget vs holdout texts (MUSE's convention)."),
    "reference_auc": ("reference AUC", "the retrained model's AUC PrivLeak is relative to."),
}

_FIGURES = ("verbmem_forget", "knowmem_forget", "privleak", "knowmem_retain", "privleak_auc", "reference_auc")


@dataclass(kw_only=True)
class MUSEReport:
    """The report of :func:`~hf_unlearn.evaluation.evaluate_muse`: the figures of :data:`MUSE_METRIC_DEFINITIONS`
    (``None`` when not measured), ``reference_source`` (where ``reference_auc`` comes from), ``num_examples`` and
    ``per_example`` (per part), ``settings``, ``hf_unlearn_version`` and ``extra`` (keys of a dict
    that are no field, kept as they are)."""

    model_name: str
    source: str
    verbmem_forget: float | None = None
    knowmem_forget: float | None = None
    privleak: float | None = None
    knowmem_retain: float | None = None
    privleak_auc: float | None = None
    reference_auc: float | None = None
    reference_source: str | None = None
    num_examples: dict[str, int] = field(default_factory=dict)
    per_example: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    hf_unlearn_version: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in _FIGURES:
            value = getattr(self, name)
            if value is not None and not (isinstance(value, numbers.Real) and not isinstance(value, bool)
                                          and math.isfinite(float(value))):
                raise ValueError(f"MUSEReport.{name} must be a finite number or None, got {value!r}.")
        for name in ("num_examples", "per_example", "settings", "extra"):
            if not isinstance(getattr(self, name), dict):
                raise ValueError(f"MUSEReport.{name} must be a dict, got {type(getattr(self, name)).__name__}.")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls) if f.name != "extra")

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON-ready dict: ``format``, every field, then :attr:`extra`'s keys."""
        out: dict[str, Any] = {"format": MUSE_REPORT_FORMAT}
        out.update({name: getattr(self, name) for name in self.field_names()})
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MUSEReport:
        """A report from its dict form (:meth:`to_dict`); ``ValueError`` for a non-mapping, another format, no
        ``model_name``/``source``, or a bad figure."""
        if not isinstance(data, Mapping):
            raise ValueError(f"A MUSE report must be a dict, got {type(data).__name__}.")
        fmt = data.get("format", MUSE_REPORT_FORMAT)
        if fmt != MUSE_REPORT_FORMAT:
            raise ValueError(f"Not a MUSE report (format {fmt!r}, expected {MUSE_REPORT_FORMAT!r}).")
        missing = [k for k in ("model_name", "source") if k not in data]
        if missing:
            raise ValueError(f"The MUSE report lacks {missing}.")
        names = cls.field_names()
        return cls(**{k: data[k] for k in names if k in data},
                   extra={k: v for k, v in data.items() if k not in names and k != "format"})

    def save(self, path: str | os.PathLike) -> Path:
        """Write :meth:`to_dict` as JSON to ``path`` atomically."""
        return atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> MUSEReport:
        """Read a report JSON written by :meth:`save` (or ``evaluate_muse(..., output_path=)``)."""
        return cls.from_dict(read_json_file(path, "MUSE report file "))

    def figures(self) -> dict[str, float | None]:
        """The report's figures by key (:data:`MUSE_METRIC_DEFINITIONS`' keys)."""
        return {k: getattr(self, k) for k in _FIGURES}


def is_muse_report(report: Any) -> bool:
    """Whether ``report`` is a :class:`MUSEReport` or the dict form of one."""
    return isinstance(report, MUSEReport) or (isinstance(report, Mapping) and report.get("format") == MUSE_REPORT_FORMAT)


def render_muse_report(report: MUSEReport | Mapping[str, Any]) -> str:
    """A report as a markdown table (figure, value, definition), with a header line naming model and data."""
    report = report if isinstance(report, MUSEReport) else MUSEReport.from_dict(report)
    head = f"model: {report.model_name} | data: {report.source} | reference AUC: {report.reference_source}"
    rows = ["| figure | value | definition |", "|---|---:|---|"]
    for key, value in report.figures().items():
        title, definition = MUSE_METRIC_DEFINITIONS[key]
        fmt = ".4f" if key.endswith("auc") else ".2f"
        cell = "n/a" if value is None else format(float(value), fmt)
        rows.append(f"| {title} | {cell} | {definition} |")
    return "\n".join([head, "", *rows])


#: The figures a model card's ``model-index`` carries from a MUSE report: key -> (metric type, pretty name).
MUSE_CARD_METRICS: dict[str, tuple[str, str]] = {
    "verbmem_forget": ("muse_verbmem_forget", "MUSE VerbMem on the forget set (ROUGE-L F1 x 100)"),
    "knowmem_forget": ("muse_knowmem_forget", "MUSE KnowMem on the forget set (ROUGE-L F1 x 100)"),
    "privleak": ("muse_privleak", "MUSE PrivLeak (Min-40% AUC vs. retrained model, %)"),
    "knowmem_retain": ("muse_knowmem_retain", "MUSE KnowMem on the retain set (utility, ROUGE-L F1 x 100)"),
}


def muse_card_results(report: MUSEReport | Mapping[str, Any]) -> list[tuple[str, str, str, float | None]]:
    """``(key, metric type, pretty name, value)`` of each :data:`MUSE_CARD_METRICS` figure of ``report`` (``None``
    for one not measured); ``ValueError`` when it measured none."""
    report = report if isinstance(report, MUSEReport) else MUSEReport.from_dict(report)
    rows = [(key, kind, pretty, getattr(report, key)) for key, (kind, pretty) in MUSE_CARD_METRICS.items()]
    if all(row[3] is None for row in rows):
        raise ValueError(f"The MUSE report has no value for any of {list(MUSE_CARD_METRICS)}.")
    return rows


def muse_card_section(results: list[tuple[str, str, str, float | None]], forget_split: str) -> str:
    """The markdown evaluation section of a model card for :func:`muse_card_results`' rows."""
    lines = [f"## Evaluation (MUSE-News, forget set `{forget_split}`)", "", "| metric | value |", "|---|---|"]
    lines += [f"| {pretty} | {'not computed' if value is None else format(float(value), '.6g')} |"
              for _, _, pretty, value in results]
    lines += ["", "VerbMem and KnowMem on the forget set should fall to a retrained model's level (lower is more "
              "forgetting); PrivLeak near 0 is a retrained model's behaviour, near -100 means the forget texts are "
              "still recognisable; KnowMem on the retain set is the utility kept (higher is better).", ""]
    return "\n".join(lines)
