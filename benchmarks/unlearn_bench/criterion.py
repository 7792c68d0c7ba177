"""The reference-free selection criterion in the comparison: its options for a pair (author groups, the
pretrained base's NLLs as reference) and how well its p-value ranks the rows as TOFU's forget quality does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def selection_criterion_options(
    pair: Any, forget_rows: list[dict[str, Any]], holdout_rows: list[dict[str, Any]],
    validation_rows: list[dict[str, Any]], tokenizer: Any, templates: set[str | None], device: str | None = None,
) -> dict[str | None, dict[str, Any]]:
    """The selection criterion's ``groups`` and ``reference_nll`` per prompt template, for a pair with a
    pretrained ``base`` (TOFU-small: real TOFU authors): ``groups="tofu_authors"`` when the forget and the holdout
    rows are whole authors (20 rows each, at least two a side), and the base's per-row NLLs on the forget and
    holdout rows, measured once per template, as the criterion's reference. A pair without a base (TOFU-tiny,
    trained from scratch on synthetic authors) gets neither. The base is loaded on ``device`` (the harness's)."""
    from hf_unlearn.selection import TOFU_AUTHOR_ROWS, SelectionCriterion

    base = getattr(pair, "base", None)
    if base is None:
        return {t: {} for t in templates}
    whole = all(len(r) % TOFU_AUTHOR_ROWS == 0 and len(r) >= 2 * TOFU_AUTHOR_ROWS for r in (forget_rows, holdout_rows))
    groups = "tofu_authors" if whole else None
    options: dict[str | None, dict[str, Any]] = {t: {"groups": groups} for t in templates}
    from hf_unlearn.demo import load_tiny

    model, _ = load_tiny(base, device)
    for template in templates:
        options[template]["reference_nll"] = SelectionCriterion(
            forget_rows, holdout_rows, validation_rows, template=template, groups=groups,
            reference_model=model, reference_tokenizer=tokenizer).reference_nll
    del model
    return options


def criterion_p_value(row: dict[str, Any]) -> float | None:
    """The reference-free criterion's forget-vs-holdout KS p-value of a row: the selected candidate's, or the
    anchor's own measurement."""
    figures = (row.get("selected") or {}).get("criterion") or row.get("criterion") or {}
    value = figures.get("forget_holdout_pvalue")
    return float(value) if isinstance(value, (int, float)) else None


def criterion_correlation(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Spearman's rank correlation between the criterion's p-value (:func:`criterion_p_value`) and TOFU's forget
    quality over the rows that have both (and no error): ``{"spearman", "n", "rows"}``, ``spearman`` None with
    fewer than 3 rows or a constant column."""
    pairs = [(r["method"], criterion_p_value(r), r.get("forget_quality")) for r in rows
             if r.get("error") is None and criterion_p_value(r) is not None
             and isinstance(r.get("forget_quality"), (int, float))]
    rho = None
    if len(pairs) >= 3 and len({p for _, p, _ in pairs}) > 1 and len({q for _, _, q in pairs}) > 1:
        from scipy.stats import spearmanr

        rho = float(spearmanr([p for _, p, _ in pairs], [q for _, _, q in pairs]).statistic)
    return {"spearman": rho, "n": len(pairs),
            "rows": [{"method": m, "criterion_pvalue": p, "forget_quality": q} for m, p, q in pairs]}
