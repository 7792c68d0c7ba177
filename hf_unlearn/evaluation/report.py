"""TOFU reports on disk and on screen: atomic JSON, saved retain-reference truth ratios, tables.

:data:`METRIC_DEFINITIONS` defines every figure of a report (the CLI's ``--help`` and
:func:`render_report` print them); :func:`format_report_table` compares several reports side by side.
"""

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
    evaluated once. It records the forget split, source, model name and the report's provenance (prompt
    template, tokenizer, rows, dtype) for checking, the nine model-utility components and the
    membership-inference AUCs (privleak's reference).
    """
    ratios = checked_truth_ratios(report, "the report")
    mia = report.get("mia")
    payload = {
        "format": TRUTH_RATIOS_FORMAT,
        "model_name": report.get("model_name"),
        "source": report.get("source"),
        "forget_split": report.get("forget_split"),
        "num_examples": len(ratios),
        "forget_truth_ratios": ratios,
        "components": report.get("components"),
        "mia": {"auc": mia.get("auc")} if isinstance(mia, Mapping) else None,
        "provenance": report.get("provenance"),
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


# Every figure of a report: key -> (title, definition). Printed by render_report and `hf-unlearn eval --help`.
METRIC_DEFINITIONS: dict[str, tuple[str, str]] = {
    "forget_quality": (
        "forget quality",
        "p-value of the two-sample KS test between this model's and the retain model's per-question forget truth "
        "ratios (TOFU). High (>0.05) = indistinguishable from never having seen the forget set.",
    ),
    "ks_statistic": ("KS statistic", "D = sup_x |F_model(x) - F_retain(x)| of the forget truth ratios."),
    "model_utility": (
        "model utility",
        "harmonic mean of the nine components: probability, ROUGE-L recall and truth ratio on retain, real "
        "authors and world facts (TOFU). 0 if any is 0.",
    ),
    "mu_rouge": (
        "MU-ROUGE",
        "harmonic mean of the retain, real-authors and world-facts mean ROUGE-L recalls (T3's utility figure).",
    ),
    "forget_rouge_l": (
        "forget ROUGE-L",
        "mean ROUGE-L recall of the greedy answer (up to max_new_tokens) against the gold forget answer "
        "(rouge-score, Porter stemmer).",
    ),
    "forget_truth_ratio": (
        "forget truth ratio",
        "mean of min(tr, 1/tr), tr = exp(loss(paraphrased) - mean loss(perturbed)) per forget question "
        "(avg per-token NLLs); 1 = the model cannot tell true from false.",
    ),
    "forget_prob": ("forget prob", "mean exp(-avg NLL) of the forget answers given their questions."),
    "retain_rouge_l": ("retain ROUGE-L", "mean ROUGE-L recall of greedy answers on retain_perturbed."),
    "retain_prob": ("retain prob", "mean exp(-avg NLL) of the retain answers."),
    "retain_truth_ratio": ("retain truth ratio", "mean of max(0, 1 - tr) on retain_perturbed."),
    "extraction_strength": (
        "extraction strength",
        "mean over forget answers of 1 - k*/n, k* = the shortest answer prefix after which teacher-forced greedy "
        "predictions match every remaining token (open-unlearning).",
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
        "(score - ref) / ref * 100 with score = 1 - AUC(min-k) and ref = 1 - the retain model's AUC (0.5 when no "
        "retain reference). Near 0 = like the retain model; strongly negative = the forget set is recognisable.",
    ),
}

# (report key, column title, format)
TABLE_COLUMNS = (
    ("forget_quality", "forget quality", ".3g"),
    ("model_utility", "model utility", ".3f"),
    ("forget_rouge_l", "forget ROUGE-L", ".3f"),
    ("forget_truth_ratio", "forget truth ratio", ".3f"),
    ("forget_prob", "forget prob", ".3f"),
    ("retain_rouge_l", "retain ROUGE-L", ".3f"),
    ("retain_prob", "retain prob", ".3f"),
    ("mu_rouge", "MU-ROUGE", ".3f"),
    ("extraction_strength", "extraction strength", ".3f"),
    ("exact_memorization", "exact memorization", ".3f"),
    ("mia_min_k", "MIA AUC min-k", ".3f"),
    ("privleak", "privleak", ".1f"),
)

# render_report's rows, in order: (key, format)
REPORT_ROWS = (
    ("forget_quality", ".3g"), ("ks_statistic", ".3f"), ("model_utility", ".3f"), ("mu_rouge", ".3f"),
    ("forget_rouge_l", ".3f"), ("forget_truth_ratio", ".3f"), ("forget_prob", ".3f"),
    ("retain_rouge_l", ".3f"), ("retain_prob", ".3f"), ("retain_truth_ratio", ".3f"),
    ("extraction_strength", ".3f"), ("exact_memorization", ".3f"),
    ("mia_loss", ".3f"), ("mia_zlib", ".3f"), ("mia_min_k", ".3f"), ("mia_min_k_plus_plus", ".3f"),
    ("privleak", ".2f"),
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


def metric_definitions_text(width: int = 100) -> str:
    """Every figure's title and definition as plain text (for ``--help`` epilogs)."""
    import textwrap

    lines = []
    for title, definition in METRIC_DEFINITIONS.values():
        lines.extend(textwrap.wrap(f"{title}: {definition}", width=width, subsequent_indent="    "))
    return "\n".join(lines)


def render_report(report: Mapping[str, Any]) -> str:
    """One report of ``evaluate_tofu`` as a markdown table: figure, value and definition, every figure.

    Figures the report lacks (no retain reference, no holdout split, a custom scorer) show ``n/a``. A header
    line names the model, data, forget split, prompt template, max_examples and max_new_tokens, and the
    retain reference's source.
    """
    settings = report.get("settings") or {}
    ref = report.get("retain_reference")
    ref_text = "none (forget quality n/a, privleak against AUC 0.5)"
    if isinstance(ref, Mapping):
        prov = ref.get("provenance") or {}
        ref_text = f"{prov.get('format', '?')}: {prov.get('path') or prov.get('model_name') or 'in memory'}"
    elif ref:
        ref_text = str(ref)
    head = (
        f"model: {report.get('model_name')} | data: {report.get('source')} {report.get('forget_split')} | "
        f"template: {settings.get('template')} | max_examples: {settings.get('max_examples')} | "
        f"max_new_tokens: {settings.get('max_new_tokens')} | retain reference: {ref_text}"
    )
    rows = ["| figure | value | definition |", "|---|---:|---|"]
    for key, fmt in REPORT_ROWS:
        title, definition = METRIC_DEFINITIONS[key]
        rows.append(f"| {title} | {_cell(report, key, fmt)} | {definition.replace('|', chr(92) + '|')} |")
    return "\n".join([head, "", *rows])
