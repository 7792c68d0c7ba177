"""Evaluator reports as model cards read them: a ``TOFUReport``, its dict or JSON file (read into a
``TOFUReport``), or any mapping with the card metrics (read by key, also under ``meta``/``metadata``/``config``);
the card metrics, and :func:`check_report_matches`. Importing this module imports no torch."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..evaluation.report import TOFUReport

#: Report keys written to the card's ``model-index``: key -> (metric type, pretty name).
REPORT_METRICS: dict[str, tuple[str, str]] = {
    "forget_quality": ("forget_quality", "Forget quality (KS-test p-value vs. retain model)"),
    "model_utility": ("model_utility", "Model utility"),
    "forget_rouge_l": ("rouge_l_recall", "Forget ROUGE-L recall"),
    "forget_truth_ratio": ("truth_ratio", "Forget truth ratio"),
}

#: Further report keys written to ``model-index`` when the report has them (open-unlearning's TOFU table, MU-ROUGE).
OPTIONAL_REPORT_METRICS: dict[str, tuple[str, str]] = {
    "mu_rouge": ("mu_rouge", "MU-ROUGE (harmonic mean of three ROUGE-L recalls)"),
    "extraction_strength": ("extraction_strength", "Forget extraction strength"),
    "exact_memorization": ("exact_memorization", "Forget exact memorization"),
    "mia_loss": ("mia_auc_loss", "MIA AUC (loss), forget vs holdout"),
    "mia_zlib": ("mia_auc_zlib", "MIA AUC (zlib), forget vs holdout"),
    "mia_min_k": ("mia_auc_min_k", "MIA AUC (min-k 40%), forget vs holdout"),
    "mia_min_k_plus_plus": ("mia_auc_min_k_plus_plus", "MIA AUC (min-k++ 40%), forget vs holdout"),
    "privleak": ("privleak", "Privleak (min-k AUC vs. retain model, %)"),
    # the attacks of hf_unlearn.evaluation.attacks (evaluate_tofu(..., attacks=...))
    "attack_nf4_forget_rouge_l": ("rouge_l_recall_nf4_attack", "Forget ROUGE-L recall after 4-bit NF4 quantization"),
    "attack_int8_forget_rouge_l": ("rouge_l_recall_int8_attack", "Forget ROUGE-L recall after 8-bit quantization"),
    "attack_nf4_recovered": ("recovered_fraction_nf4_attack", "Forget NLL gap recovered by 4-bit NF4 quantization"),
    "attack_int8_recovered": ("recovered_fraction_int8_attack", "Forget NLL gap recovered by 8-bit quantization"),
    "attack_relearn_forget_nll": ("forget_nll_relearn_attack", "Forget answer NLL after a relearning attack"),
    "attack_relearn_recovered": ("recovered_fraction_relearn_attack",
                                 "Forget NLL gap recovered by relearning on 10% of the forget rows"),
    "attack_benign_recovered": ("recovered_fraction_benign_finetune",
                                "Forget NLL gap recovered by benign fine-tuning on retain rows"),
}

_REPORT_SECTIONS = ("meta", "metadata", "config")


def _report_class() -> type[TOFUReport]:
    from ..evaluation.report import TOFUReport

    return TOFUReport


def _report_value(report: TOFUReport | Mapping[str, Any], *names: str) -> Any:
    """The first of ``names`` the report has a value for (top level first, then its ``meta``/``metadata``/``config``
    sections); ``None`` when it has none. A ``TOFUReport`` is read by attribute, then its ``extra`` keys."""
    if isinstance(report, _report_class()):
        for name in names:
            value = _report_entry(report, name)
            if value is not None:
                return value
        report = report.extra  # its meta/metadata/config sections, if any
    for name in names:
        if report.get(name) is not None:
            return report[name]
    for section in _REPORT_SECTIONS:
        sub = report.get(section)
        if isinstance(sub, Mapping):
            for name in names:
                if sub.get(name) is not None:
                    return sub[name]
    return None


def _same_model(a: str, b: str) -> bool:
    if os.path.exists(a) and os.path.exists(b):
        return os.path.realpath(a) == os.path.realpath(b)
    return a.rstrip("/") == b.rstrip("/")


def _load_report(
    report: TOFUReport | Mapping[str, Any] | str | os.PathLike | None,
) -> TOFUReport | dict[str, Any] | None:
    """A report as the cards read it: a ``TOFUReport`` as is; a whole report (dict or JSON file) as a ``TOFUReport``
    (:meth:`~hf_unlearn.evaluation.TOFUReport.from_dict`); any other mapping as a dict."""
    if report is None:
        return None
    report_class = _report_class()
    if isinstance(report, report_class):
        return report
    if isinstance(report, (str, os.PathLike)):
        path = Path(report)
        if not path.is_file():
            raise ValueError(f"Report file {path} does not exist.")
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"Report file {path} is not valid JSON: {err}") from err
    if not isinstance(report, Mapping):
        raise ValueError(f"A report must be a TOFUReport, a dict or a JSON file, got {type(report).__name__}.")
    if not report_class.missing_fields(report):
        return report_class.from_dict(report)
    return dict(report)


def report_dict(report: TOFUReport | Mapping[str, Any]) -> dict[str, Any]:
    """The report as the JSON-ready dict published as ``unlearning_report.json`` (``to_dict()`` of a ``TOFUReport``)."""
    to_dict = getattr(report, "to_dict", None)
    return to_dict() if callable(to_dict) else dict(report)


def _report_entry(report: TOFUReport | Mapping[str, Any], key: str) -> Any:
    """The report's top-level ``key`` (for a ``TOFUReport``: the field, else its ``extra`` key), ``None`` if absent."""
    if isinstance(report, _report_class()):
        return getattr(report, key) if key in report.field_names() else report.extra.get(key)
    return report.get(key)


def _has_key(report: TOFUReport | Mapping[str, Any], key: str) -> bool:
    if isinstance(report, _report_class()):
        if report.has(key):
            return True
        report = report.extra  # its meta/metadata/config sections, if any
    return key in report or any(
        isinstance(report.get(section), Mapping) and key in report[section] for section in _REPORT_SECTIONS
    )


def _metric_results(report: TOFUReport | Mapping[str, Any]) -> list[tuple[str, str, str, float | None]]:
    """(report key, metric type, pretty name, value) for the card metrics of a report: ``None`` for one the
    evaluator could not compute (left out of ``model-index``); a required key absent from the report is an error."""
    missing = [key for key in REPORT_METRICS if not _has_key(report, key)]
    if missing:
        raise ValueError(f"The report lacks {missing}; build_model_card needs {list(REPORT_METRICS)}.")
    rows = []
    optional = {k: v for k, v in OPTIONAL_REPORT_METRICS.items() if _has_key(report, k)}
    for key, (metric_type, pretty) in {**REPORT_METRICS, **optional}.items():
        raw = _report_value(report, key)
        if raw is None:
            rows.append((key, metric_type, pretty, None))
            continue
        try:
            value = float(raw)
        except (TypeError, ValueError) as err:
            raise ValueError(f"Report value {key}={raw!r} is not a number.") from err
        if not math.isfinite(value):
            raise ValueError(f"Report value {key}={raw!r} is not finite.")
        rows.append((key, metric_type, pretty, value))
    if all(row[3] is None for row in rows):
        raise ValueError(f"The report has no value for any of {list(REPORT_METRICS)}.")
    return rows


def check_report_matches(
    report: TOFUReport | Mapping[str, Any], base_model: str | None, forget_split: str | None, *, aliases: tuple[str, ...] = ()
) -> None:
    """Refuse (``ValueError``) a report whose ``base_model`` / ``base_model_name_or_path`` / ``model_name`` is
    neither ``base_model`` nor one of ``aliases``, or whose ``forget_split`` differs from the artifact's."""
    known = list(dict.fromkeys(str(m) for m in (base_model, *aliases) if m))
    for key in ("base_model", "base_model_name_or_path", "model_name"):
        named = _report_value(report, key)
        if named is not None and known and not any(_same_model(str(named), m) for m in known):
            raise ValueError(
                f"The report was computed for model {named!r} ({key}), but the artifact was made from base model "
                f"{' / '.join(repr(m) for m in known)}; refusing to publish mismatched numbers."
            )
    report_split = _report_value(report, "forget_split")
    if report_split is not None and forget_split is not None and str(report_split) != str(forget_split):
        raise ValueError(
            f"The report is for forget split {report_split!r}, but the artifact removed {forget_split!r}; "
            "refusing to publish mismatched numbers."
        )


def _quantization_rows(quantization: Mapping[str, Any]) -> dict[str, Any]:
    """Scalar entries of a quantization check; only the card metrics when it is a whole report."""
    scalars = {k: v for k, v in quantization.items() if v is None or isinstance(v, (str, int, float, bool))}
    if any(key in scalars for key in REPORT_METRICS):
        keep = (*REPORT_METRICS, "method", "quantization", "quant_type", "bits", "compute_dtype")
        scalars = {k: v for k, v in scalars.items() if k in keep}
    return {k: ("not computed" if v is None else v) for k, v in scalars.items()}

