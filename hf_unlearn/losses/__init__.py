"""Unlearning objectives as pure tensor functions, one per objective, the formula in each docstring.

Conventions shared by every function here:

* ``token_log_probs`` is ``[B, L]`` with ``token_log_probs[b, t] = log pi(y_t | x, y_<t)`` on answer tokens and
  0 elsewhere, exactly what :func:`hf_unlearn.logprobs.label_log_probs` returns for the labels.
* ``mask`` is the matching ``[B, L]`` boolean answer mask (:func:`answer_mask`): true where a label is scored.
* Token-level losses are *sums over tokens divided by* ``num_tokens`` and sequence-level losses are *sums over
  sequences divided by* ``num_sequences``. Both default to the counts of the batch itself (a plain mean); a trainer
  passes the totals of a whole gradient-accumulation step so that micro-batches add up to the full-batch loss.
* Every loss is a quantity to *minimise*.

Trainer glue (which batch, which model, which reference) lives in :mod:`hf_unlearn.trainers`; nothing here touches
a model. Each family has its own module: :mod:`.common`, :mod:`.baselines`, :mod:`.masc`, :mod:`.atwu`.
"""


from .atwu import (
    budget_penalty,
    satga_plus_exponent,
    satga_plus_loss,
    satga_plus_weight,
    score_entropy,
    straight_through_indicator,
    weighted_npo_loss,
    weighted_simnpo_loss,
)
from .baselines import grad_ascent_loss, grad_diff_loss, npo_loss, simnpo_loss
from .common import answer_mask, kl_retain_loss, nll_loss, sequence_log_probs
from .masc import (
    buffered_hinge_loss,
    continuation_mask,
    hoeffding_upper_bound,
    margin_hinge_loss,
    masc_probability_from_threshold,
    masc_threshold_from_probability,
    masc_violation_counts,
    per_example_violation_rates,
    restricted_margin,
    sample_cut_ratios,
    violation_rate,
)

__all__ = [
    "answer_mask",
    "sequence_log_probs",
    "nll_loss",
    "kl_retain_loss",
    "grad_ascent_loss",
    "grad_diff_loss",
    "npo_loss",
    "simnpo_loss",
    "satga_plus_exponent",
    "satga_plus_loss",
    "satga_plus_weight",
    "weighted_npo_loss",
    "weighted_simnpo_loss",
    "score_entropy",
    "straight_through_indicator",
    "budget_penalty",
    "masc_threshold_from_probability",
    "masc_probability_from_threshold",
    "restricted_margin",
    "margin_hinge_loss",
    "masc_violation_counts",
    "violation_rate",
    "buffered_hinge_loss",
    "continuation_mask",
    "sample_cut_ratios",
    "per_example_violation_rates",
    "hoeffding_upper_bound",
]
