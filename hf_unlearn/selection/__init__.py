"""Choosing an unlearning method's strength without a retain model: a reference-free forget criterion, the
default selection rule, the record it leaves beside the artifact, and a best-checkpoint callback for trainers.

**The criterion** (:class:`SelectionCriterion`) is built from rows the user has: ``forget`` (the rows to
unlearn), ``holdout`` (rows of the same kind that the model never saw, e.g. TOFU's ``holdout01/05/10``),
``retain_validation`` (retain rows not used for unlearning) and optionally ``generic`` rows, and two optional
things the user usually also has: the rows' ``groups`` (e.g. the author of each row) and a ``reference_model``
(the pretrained base before fine-tuning). For a candidate model it measures, with the model's own token scorer
or a given one (a decoding-time method's tilted scorer):

* forget side: whether the forget rows moved like never-seen rows. With ``n_i`` the per-row answer NLL
  ``n_i = -(1/|a_i|) sum_t log p(a_{i,t} | q_i, a_{i,<t})`` and ``r_i`` the same row's NLL under the reference
  model (measured once; 0 without one), the row's *shift* is ``d_i = n_i - r_i``, and

      shift_gap = mean over forget groups of mean_{i in g} d_i  -  the same over holdout groups,

  with ``shift_gap_se`` and ``shift_gap_df`` its Welch standard error and degrees of freedom on those group means
  (:func:`hf_unlearn.evaluation.privacy.group_mean_shift_test`; without ``groups`` every row is a group). The
  ideal model (one never trained on the forget rows) has ``shift_gap`` near 0: the forget rows are then
  never-seen rows of their own difficulty. A model that still knows them has ``shift_gap`` well below 0, one
  pushed *beyond* never-seen rows well above 0. ``equivalence_pvalue`` is the p-value of two one-sided t-tests
  (TOST) that ``|shift_gap| < holdout_margin`` (:func:`hf_unlearn.evaluation.privacy.equivalence_pvalue`):

      p = max( P(T_df >= (gap + margin) / se),  P(T_df <= (gap - margin) / se) ),

  small only when the gap is both small and precisely measured. Kept for reference: ``forget_holdout_pvalue``,
  Welch's two-sided difference test on the same group means, the two-sample KS
  statistic and p-value of the NLLs (``forget_holdout_ks``, ``forget_holdout_ks_pvalue``) and ``mia_auc``, the
  Min-K% membership-inference AUC of forget (label 0) against holdout (label 1).
* retain side: ``retain_change = max(mean NLL on retain_validation, mean NLL on generic) - the same under the
  original model`` (nats per answer token; each change also apart).

Why these parts. A KS test on rows compares two samples drawn from *different authors*: on TOFU the forget and
the holdout authors differ in difficulty (on a SmolLM2-135M pair, the model fine-tuned without the forget authors
scores NLL 2.88 on them against 2.44 on the holdout authors), and each author's 20 rows share that difficulty, so
80 rows are about 4 independent draws. Treated as 80, the ideal model is "distinguishable" (KS p = 2e-4) and a
level of 0.05 is out of reach for every candidate. The group test counts authors, not rows, so a difference
between authors alone does not fail it; the reference offset removes the part of the difficulty that the model
had before fine-tuning (a row that was hard for the base stays hard for a model that never saw it); the rule
then takes the candidate *closest* to the holdout rows rather than the most significant one, so a noisy
candidate is not preferred for its noise and an overshoot counts as much as an undershoot. Whether the choice
carries a warning is an *equivalence* question, not a difference one: a difference test rejects the ideal model
whenever the forget and holdout authors differ by a small real amount that it measures precisely (on the SmolLM2
pair, the retain reference's gap of +0.09 nats/token gives p = 0.046), and it passes a candidate whose forget rows
scatter so widely that nothing can be told. The equivalence test asks the question the rule needs: is the forget
rows' shift shown to lie within ``holdout_margin`` of never-seen rows'?

**The rule** (:meth:`SelectionCriterion.select`, candidates ordered weak -> strong):

1. candidates whose ``retain_change <= retain_tolerance`` (default 0.1 nats/token: the geometric-mean token
   probability of the retain answers falls by at most ``1 - e^{-0.1}``, about 10%, the size of TOFU's
   "90% of the target's utility" bar) are eligible;
2. among those, the one with the smallest ``|shift_gap|``; ties go to the weaker candidate;
3. when that candidate's ``equivalence_pvalue`` is not below ``holdout_level`` (default 0.05) for the margin
   ``holdout_margin`` (default 0.5 nats/token), its forget rows are not shown to be like never-seen rows; it is
   chosen with a warning that says so;
4. when no candidate is eligible, the one with the smallest retain change (ties: weaker), with a warning.

The measurements and the decision form a :class:`SelectionRecord`, saved as ``selection_record.json`` beside the
artifact and shown in its model card.

Modules: :mod:`~hf_unlearn.selection.record` (the statistics, the rule, the record), :mod:`~hf_unlearn.selection.criterion`
(the criterion), :mod:`~hf_unlearn.selection.callback` (best-checkpoint selection for trainers). How a method
applies the criterion is its registered classes' business (:func:`hf_unlearn.run.fit_or_train`).
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
    "SELECTION_WEIGHTS", "TOFU_AUTHOR_ROWS",
    "SelectionCallback", "SelectionCriterion", "SelectionRecord", "forget_holdout_statistics", "select_candidate",
    "selection_record_of",
]
