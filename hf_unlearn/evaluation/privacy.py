"""Membership inference on the forget set and privacy leakage, as open-unlearning reports them for TOFU. Every
attack score is loss-like (higher: less likely a member); the ROC AUC separates forget (label 0) from the matching
``holdoutNN`` split (label 1): near 1 for a model that still knows the forget set, 0.5 for one that never saw it.
Pure functions; each formula is in its docstring."""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import numpy as np

MIA_ATTACKS = ("loss", "zlib", "min_k", "min_k_plus_plus")
MIN_K_FRACTION = 0.4  # open-unlearning configs/eval/tofu_metrics/mia_min_k{,_plus_plus}.yaml: k: 0.4
DEFAULT_REFERENCE_AUC = 0.5  # open-unlearning's privleak ref_value when no retain logs are given


def loss_score(token_log_probs: np.ndarray) -> float:
    """LOSS attack (Yeom et al., 2018): the answer's average NLL, ``-(1/n) sum_t log p(y_t | x, y_<t)``."""
    lp = np.asarray(token_log_probs, dtype=np.float64)
    return float(-lp.mean()) if lp.size else 0.0


def zlib_score(token_log_probs: np.ndarray, text: str) -> float:
    """zlib attack (Carlini et al., 2021): ``loss / len(zlib.compress(text.encode("utf-8")))``, the average NLL
    over the zlib entropy (compressed byte length) of the answer text."""
    return loss_score(token_log_probs) / len(zlib.compress(text.encode("utf-8")))


def _lowest_fraction_mean(values: np.ndarray, k: float) -> float:
    n = max(1, int(len(values) * k))
    return float(np.mean(np.sort(values)[:n]))


def min_k_score(token_log_probs: np.ndarray, k: float = MIN_K_FRACTION) -> float:
    """Min-K% Prob (Shi et al., 2024): minus the mean of the lowest ``max(1, floor(k n))`` token log-probs,
    ``-(1/|K|) sum_{t in K} log p(y_t | x, y_<t)`` with ``K`` the ``k`` fraction of least likely tokens."""
    lp = np.asarray(token_log_probs, dtype=np.float64)
    return -_lowest_fraction_mean(lp, k) if lp.size else 0.0


def min_k_plus_plus_score(
    token_log_probs: np.ndarray, vocab_mean: np.ndarray, vocab_var: np.ndarray, k: float = MIN_K_FRACTION
) -> float:
    """Min-K%++ (Zhang et al., 2025): each token's log-prob standardised by the next-token distribution,
    ``z_t = (log p(y_t) - mu_t) / sigma_t`` with ``mu_t = E_{v~p}[log p(v)]``,
    ``sigma_t^2 = E_{v~p}[log^2 p(v)] - mu_t^2`` (clamped at ``1e-6`` as open-unlearning does); the score is
    minus the mean of the lowest ``max(1, floor(k n))`` values of ``z``."""
    lp = np.asarray(token_log_probs, dtype=np.float64)
    if lp.size == 0:
        return 0.0
    sigma = np.sqrt(np.maximum(np.asarray(vocab_var, dtype=np.float64), 1e-6))
    z = (lp - np.asarray(vocab_mean, dtype=np.float64)) / sigma
    return -_lowest_fraction_mean(z, k)


def mia_auc(forget_scores: Sequence[float], holdout_scores: Sequence[float]) -> float:
    """ROC AUC of an attack with forget labelled 0 and holdout 1 (open-unlearning's ``mia_auc``):

        AUC = P(s_holdout > s_forget) + 1/2 P(s_holdout = s_forget)
            = (1 / (n_f n_h)) sum_{i in forget} sum_{j in holdout} ([s_j > s_i] + 1/2 [s_j = s_i])

    computed through ranks (the Mann-Whitney U statistic over ``n_f n_h``)."""
    f = np.asarray(forget_scores, dtype=np.float64)
    h = np.asarray(holdout_scores, dtype=np.float64)
    if f.size == 0 or h.size == 0:
        raise ValueError("A membership-inference AUC needs at least one forget and one holdout score.")
    if not (np.isfinite(f).all() and np.isfinite(h).all()):
        raise ValueError("A membership-inference AUC got a non-finite score.")
    from scipy.stats import rankdata

    ranks = rankdata(np.concatenate([f, h]))  # average ranks for ties
    u_holdout = ranks[f.size :].sum() - h.size * (h.size + 1) / 2
    return float(u_holdout / (f.size * h.size))


def privleak(auc: float, reference_auc: float | None = None) -> float:
    """Privacy leakage (MUSE, Shi et al., 2024; open-unlearning's ``privleak``) in percent:

        privleak = (score - ref) / ref * 100,  score = 1 - AUC,  ref = 1 - AUC_retain

    with ``AUC_retain`` the retain model's AUC for the same attack (0.5 when no retain reference is given).
    Near 0 is the retain model's behaviour; strongly negative means the forget set is still recognisable.
    open-unlearning adds ``1e-10`` to the denominator; here ``AUC_retain = 1`` is refused instead."""
    ref_auc = DEFAULT_REFERENCE_AUC if reference_auc is None else float(reference_auc)
    ref = 1.0 - ref_auc
    if not (math.isfinite(ref) and ref > 0):
        raise ValueError(f"privleak needs a reference AUC below 1, got {ref_auc!r}.")
    return float(((1.0 - float(auc)) - ref) / ref * 100.0)


def group_mean_shift_test(
    forget_values: Sequence[float], holdout_values: Sequence[float],
    forget_groups: Sequence[object], holdout_groups: Sequence[object],
) -> dict[str, float | int]:
    """Welch's two-sided t-test between the *group means* of per-row values (rows of one group, e.g. one author's
    questions, are not independent draws). With ``M_F, M_H`` and ``s_F^2, s_H^2`` the mean and sample variance
    (``ddof=1``) of the ``G_F`` / ``G_H`` group means of each side::

        gap = M_F - M_H,   se = sqrt(s_F^2 / G_F + s_H^2 / G_H),   t = gap / se,
        df  = se^4 / ((s_F^2/G_F)^2 / (G_F - 1) + (s_H^2/G_H)^2 / (G_H - 1)),   p = 2 P(T_df > |t|)

    ``se = 0`` gives ``p = 1`` when ``gap = 0``, else 0. Returns ``gap``, ``se``, ``t``, ``df``, ``pvalue``,
    ``forget_groups``, ``holdout_groups``; needs two groups on each side."""
    from scipy.stats import t as student_t

    def group_means(values: Sequence[float], groups: Sequence[object], side: str) -> np.ndarray:
        values = np.asarray(values, dtype=np.float64)
        if len(values) != len(groups):
            raise ValueError(f"{side}: {len(values)} values but {len(groups)} group labels.")
        labels = list(dict.fromkeys(groups))
        if len(labels) < 2:
            raise ValueError(f"A group-mean test needs at least two {side} groups, got {len(labels)}.")
        index = {label: i for i, label in enumerate(labels)}
        codes = np.array([index[g] for g in groups])
        return np.bincount(codes, weights=values) / np.bincount(codes)

    mf = group_means(forget_values, forget_groups, "forget")
    mh = group_means(holdout_values, holdout_groups, "holdout")
    gap = float(mf.mean() - mh.mean())
    vf, vh = float(mf.var(ddof=1)) / mf.size, float(mh.var(ddof=1)) / mh.size
    se = math.sqrt(vf + vh)
    out = {"gap": gap, "se": se, "forget_groups": int(mf.size), "holdout_groups": int(mh.size)}
    if not math.isfinite(gap):
        return {**out, "t": math.nan, "df": math.nan, "pvalue": 0.0}
    if se == 0:
        return {**out, "t": 0.0 if gap == 0 else math.copysign(math.inf, gap), "df": math.nan,
                "pvalue": 1.0 if gap == 0 else 0.0}
    df = se**4 / ((vf**2 / (mf.size - 1) if vf else 0.0) + (vh**2 / (mh.size - 1) if vh else 0.0))
    t = gap / se
    return {**out, "t": t, "df": df, "pvalue": float(2 * student_t.sf(abs(t), df))}


def equivalence_pvalue(gap: float | None, se: float | None, df: float | None, margin: float) -> float:
    """The p-value of two one-sided t-tests (TOST) that a difference lies within ``(-margin, margin)`` (null:
    ``|true gap| >= margin``; ``df`` as :func:`group_mean_shift_test`'s)::

        p = max( P(T_df >= (gap + margin) / se),  P(T_df <= (gap - margin) / se) )

    ``se = 0`` gives 0 when ``|gap| < margin``, else 1; a missing or non-finite ``gap``, ``se`` or ``df`` gives 1.
    ``margin`` must be finite and > 0."""
    from scipy.stats import t as student_t

    if not (isinstance(margin, (int, float)) and math.isfinite(margin) and margin > 0):
        raise ValueError(f"An equivalence margin must be a finite number > 0, got {margin!r}.")
    if gap is None or se is None or not (math.isfinite(gap) and math.isfinite(se)):
        return 1.0
    if se == 0:
        return 0.0 if abs(gap) < margin else 1.0
    if df is None or not (math.isfinite(df) and df > 0):
        return 1.0
    lower = student_t.sf((gap + margin) / se, df)
    upper = student_t.cdf((gap - margin) / se, df)
    return float(max(lower, upper))
