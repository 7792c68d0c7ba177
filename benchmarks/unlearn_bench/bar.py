"""The utility bar of the comparison and the setting it chooses for a method.

A setting keeps the target's utility when its model utility is at least :data:`UTILITY_KEEP` of the target's
(``"single"``), or when each side does: the harmonic mean of the retain-side components and that of the
general-side components, each at least :data:`UTILITY_KEEP` of the target's (``"split"``; :func:`utility_bar`).
:func:`choose_setting` picks the highest forget quality among the settings that keep it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

UTILITY_KEEP = 0.9  # the chosen setting keeps model utility >= 90% of the target's
RETAIN_BAR_COMPONENTS = ("retain_rouge_l", "retain_prob")
GENERAL_BAR_COMPONENTS = tuple(f"{split}_{stat}" for split in ("real_authors", "world_facts")
                               for stat in ("prob", "rouge_l", "truth_ratio"))


def _harmonic_mean(values: Sequence[Any]) -> float | None:
    """``n / sum_i 1/v_i`` of the values (0 when one is 0, as TOFU's model utility); ``None`` when one is missing
    or negative."""
    if any(v is None or not isinstance(v, (int, float)) or v != v or v < 0 for v in values):
        return None
    return 0.0 if any(v == 0 for v in values) else len(values) / sum(1.0 / v for v in values)


def side_utilities(row: dict[str, Any]) -> dict[str, float | None]:
    """The harmonic mean of a row's retain-side components (:data:`RETAIN_BAR_COMPONENTS`) and of its
    general-side components (:data:`GENERAL_BAR_COMPONENTS`): ``{"retain", "general"}``."""
    parts = row.get("components") or {}
    return {"retain": _harmonic_mean([parts.get(k) for k in RETAIN_BAR_COMPONENTS]),
            "general": _harmonic_mean([parts.get(k) for k in GENERAL_BAR_COMPONENTS])}


def utility_bar(row: dict[str, Any], target: dict[str, Any], keep: float = UTILITY_KEEP) -> dict[str, bool]:
    """Whether ``row`` keeps the target's utility, as one number and on each side separately.

    ``single``: ``model_utility >= keep * target's``. ``retain``: the harmonic mean of retain ROUGE-L and retain
    probability ``>= keep *`` the target's (the rows the forget set must not take with it). ``general``: the
    harmonic mean of the six real-author and world-fact components (probability, ROUGE-L, truth ratio)
    ``>= keep *`` the target's (general knowledge). ``split``: ``retain and general``. A figure missing on
    either side counts as not kept.

    Why a side's harmonic mean and not each component: a component near 0.1 (real-author ROUGE-L of a small model:
    0.107 for a model fine-tuned without the forget set against the target's 0.122, over 100 questions) moves by
    more than 10% by noise, so a per-component bar fails the very model unlearning aims at. In the side's
    harmonic mean ``n / sum_i 1/v_i`` (TOFU's model utility is the same mean over all nine) that component's 12%
    drop moves the general side by about 5%, while a side that collapses (one component near 0, or every one
    down by more than 10%) still fails.
    """
    def kept(value: Any, reference: Any) -> bool:
        return value is not None and reference is not None and value >= keep * reference

    sides, target_sides = side_utilities(row), side_utilities(target)
    retain = kept(sides["retain"], target_sides["retain"])
    general = kept(sides["general"], target_sides["general"])
    return {"single": kept(row.get("model_utility"), target.get("model_utility")), "retain": retain,
            "general": general, "split": retain and general}


def choose_setting(grid_rows: Sequence[dict[str, Any]], target_utility: float,
                   target_row: dict[str, Any] | None = None, bar: str = "single") -> int | None:
    """Index of the chosen grid row: highest forget quality among the rows that pass the utility bar.

    ``bar="single"``: model utility >= 90% of the target's (``target_utility``); ``bar="split"``: the retain side
    and the general side each (see :func:`utility_bar`, which needs ``target_row``). Rows that failed are skipped;
    when no row passes, the highest-utility row.
    """
    if bar not in ("single", "split"):
        raise ValueError(f"bar must be 'single' or 'split', got {bar!r}.")
    if bar == "split" and target_row is None:
        raise ValueError("The split utility bar compares components with the target's: pass target_row.")
    ok = [i for i, r in enumerate(grid_rows) if r.get("error") is None]
    if not ok:
        return None
    if bar == "split":
        keep = [i for i in ok if utility_bar(grid_rows[i], target_row)["split"]]
    else:
        keep = [i for i in ok if (grid_rows[i]["model_utility"] or 0) >= UTILITY_KEEP * target_utility]
    if keep:
        return max(keep, key=lambda i: (grid_rows[i]["forget_quality"] or 0, grid_rows[i]["model_utility"]))
    return max(ok, key=lambda i: grid_rows[i]["model_utility"] or 0)
