"""TOFU reports on disk and on screen: atomic JSON, saved retain-reference truth ratios, a table."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..safe_output import atomic_write_json

TRUTH_RATIOS_FORMAT = "hf_unlearn.tofu_forget_truth_ratios"


def write_json_atomic(obj: Any, path: str | os.PathLike) -> Path:
    """Write ``obj`` as JSON to ``path`` through a temporary file and a rename (never half-written)."""
    return atomic_write_json(path, obj)


def save_truth_ratios(report: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Save a report's per-example forget truth ratios (a retain reference) as JSON.

    The file is what ``evaluate_tofu(..., retain_reference=path)`` reads, so a retain model is
    evaluated once. It records the forget split, source and model name for checking.
    """
    ratios = checked_truth_ratios(report, "the report")
    payload = {
        "format": TRUTH_RATIOS_FORMAT,
        "model_name": report.get("model_name"),
        "source": report.get("source"),
        "forget_split": report.get("forget_split"),
        "num_examples": len(ratios),
        "forget_truth_ratios": ratios,
    }
    return write_json_atomic(payload, path)


def load_truth_ratios(path: str | os.PathLike) -> dict[str, Any]:
    """Read a file written by :func:`save_truth_ratios` (or a full report JSON)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Retain-reference truth ratios not found: {path}.")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err.msg}).") from None
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


# (report key, column title, format)
TABLE_COLUMNS = (
    ("forget_quality", "forget quality", ".3g"),
    ("model_utility", "model utility", ".3f"),
    ("forget_rouge_l", "forget ROUGE-L", ".3f"),
    ("forget_truth_ratio", "forget truth ratio", ".3f"),
    ("forget_prob", "forget prob", ".3f"),
    ("retain_rouge_l", "retain ROUGE-L", ".3f"),
    ("retain_prob", "retain prob", ".3f"),
)


def _cell(report: Mapping[str, Any], key: str, fmt: str) -> str:
    value = report.get(key)
    if value is None:
        value = report.get("components", {}).get(key)
    if value is None:
        return "n/a"
    return format(float(value), fmt)


def format_report_table(reports: Mapping[str, Mapping[str, Any]]) -> str:
    """A markdown table with one row per named report (name -> report of ``evaluate_tofu``)."""
    if not reports:
        raise ValueError("format_report_table needs at least one report.")
    header = "| model | " + " | ".join(title for _, title, _ in TABLE_COLUMNS) + " |"
    rule = "|---|" + "---:|" * len(TABLE_COLUMNS)
    rows = [
        f"| {name} | " + " | ".join(_cell(rep, key, fmt) for key, _, fmt in TABLE_COLUMNS) + " |"
        for name, rep in reports.items()
    ]
    return "\n".join([header, rule, *rows])
