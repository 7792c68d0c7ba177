"""Choosing an unlearning method's strength without a retain model (docs/selection.md).

:class:`SelectionCriterion` measures a candidate on the user's ``forget``, ``holdout`` (never-seen rows of the same
kind), ``retain_validation`` and optional ``generic`` rows. With ``n_i`` the per-row answer NLL and ``r_i`` the same
row's NLL under an optional reference model (0 without one), the shift is ``d_i = n_i - r_i`` and::

    shift_gap          = mean over forget groups of mean_{i in g} d_i  -  the same over holdout groups
    equivalence_pvalue = max(P(T_df >= (gap + margin) / se), P(T_df <= (gap - margin) / se))   (TOST, Welch)
    retain_change      = max(mean NLL on retain_validation, on generic) - the same under the original model

**The rule** (:meth:`SelectionCriterion.select`, candidates weak -> strong): those with
``retain_change <= retain_tolerance`` are eligible; among them the smallest ``|shift_gap|`` (ties: weaker), with a
warning when its ``equivalence_pvalue`` is not below ``holdout_level``; with none eligible, the smallest retain
change, with a warning. The decision is a :class:`SelectionRecord` (``selection_record.json`` beside the artifact).
:class:`SelectionCallback` selects a trainer's best checkpoint by the same rule.
"""

from .callback import SelectionCallback
from .criterion import TOFU_AUTHOR_ROWS, SelectionCriterion, selection_record_of
from .record import (
    DEFAULT_HOLDOUT_LEVEL,
    DEFAULT_HOLDOUT_MARGIN,
    DEFAULT_RETAIN_TOLERANCE,
    SELECTION_RECORD,
    SELECTION_WEIGHTS,
    SelectionRecord,
    forget_holdout_statistics,
    select_candidate,
)

__all__ = [
    "DEFAULT_HOLDOUT_LEVEL", "DEFAULT_HOLDOUT_MARGIN", "DEFAULT_RETAIN_TOLERANCE", "SELECTION_RECORD",
    "SELECTION_WEIGHTS", "TOFU_AUTHOR_ROWS", "SelectionCallback", "SelectionCriterion", "SelectionRecord",
    "forget_holdout_statistics", "select_candidate", "selection_record_of",
]
