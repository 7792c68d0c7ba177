"""The criterion's forget side on constructed per-row NLLs: author groups of different difficulty, a reference
model's offset, memorised and overshot forget rows; the group-mean test and the equivalence test against slow
references."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hf_unlearn.evaluation.privacy import equivalence_pvalue, group_mean_shift_test
from hf_unlearn.selection import TOFU_AUTHOR_ROWS, SelectionCriterion, forget_holdout_statistics

AUTHORS = 4  # per side, as TOFU-small v2's forget and holdout authors
ROWS = AUTHORS * TOFU_AUTHOR_ROWS


def _rows(side: str, n: int = ROWS) -> list[dict[str, str]]:
    return [{"question": f"{side} question {i}?", "answer": f"{side} answer {i}."} for i in range(n)]


def _criterion(**kwargs) -> SelectionCriterion:
    return SelectionCriterion(_rows("forget"), _rows("holdout"), _rows("retain", 10), **kwargs)


def _token_log_probs(nlls: np.ndarray, tokens: int = 8) -> list[np.ndarray]:
    """Rows whose answer NLL is exactly ``nlls[i]`` (every token at ``-nlls[i]``)."""
    return [np.full(tokens, -float(v)) for v in nlls]


def _difficulty(rng: np.random.Generator, author_means: list[float], author_sd: float = 0.0,
                row_sd: float = 0.4) -> np.ndarray:
    """Per-row difficulty: each author's mean (plus an author effect of sd ``author_sd``) and row noise."""
    means = np.repeat(np.asarray(author_means) + rng.normal(0, author_sd, len(author_means)), TOFU_AUTHOR_ROWS)
    return means + rng.normal(0, row_sd, means.size)


def _measure(criterion: SelectionCriterion, forget_nll: np.ndarray, holdout_nll: np.ndarray) -> dict:
    retain = _token_log_probs(np.full(10, 0.07))
    return criterion.measure_from_log_probs(_token_log_probs(forget_nll), _token_log_probs(holdout_nll), retain)


# ------------------------------------------------------------------------------------------ the group test
def _slow_group_test(f, h, gf, gh):
    from scipy.stats import ttest_ind

    def means(values, groups):
        return [float(np.mean([v for v, g in zip(values, groups) if g == label])) for label in dict.fromkeys(groups)]

    mf, mh = means(f, gf), means(h, gh)
    result = ttest_ind(mf, mh, equal_var=False)
    return float(np.mean(mf) - np.mean(mh)), float(result.pvalue)


def test_group_mean_test_matches_welch_on_the_group_means():
    rng = np.random.default_rng(0)
    f, h = rng.normal(1.0, 0.5, 60), rng.normal(1.4, 0.5, 45)
    gf = [i % 5 for i in range(60)]  # interleaved labels, 5 groups
    gh = [i // 15 for i in range(45)]  # blocks, 3 groups
    gap, pvalue = _slow_group_test(f, h, gf, gh)
    out = group_mean_shift_test(f, h, gf, gh)
    assert out["gap"] == pytest.approx(gap) and out["pvalue"] == pytest.approx(pvalue)
    assert (out["forget_groups"], out["holdout_groups"]) == (5, 3)
    rows = group_mean_shift_test(f, h, range(60), range(45))  # every row its own group: Welch on the rows
    assert rows["pvalue"] == pytest.approx(_slow_group_test(f, h, range(60), range(45))[1])


def test_group_mean_test_edge_cases():
    same = group_mean_shift_test([1.0, 1.0, 2.0, 2.0], [1.0, 1.0, 2.0, 2.0], [0, 0, 1, 1], [0, 0, 1, 1])
    assert same["gap"] == 0.0 and same["pvalue"] == pytest.approx(1.0)
    flat = group_mean_shift_test([1.0, 1.0], [1.0, 1.0], [0, 1], [0, 1])  # no spread, no gap
    assert flat["se"] == 0.0 and flat["pvalue"] == 1.0
    apart = group_mean_shift_test([0.0, 0.0], [1.0, 1.0], [0, 1], [0, 1])  # no spread, a gap
    assert apart["pvalue"] == 0.0 and apart["t"] == -math.inf
    with pytest.raises(ValueError, match="two forget groups"):
        group_mean_shift_test([1.0, 2.0], [1.0, 2.0], [0, 0], [0, 1])
    with pytest.raises(ValueError, match="3 values but 2 group labels"):
        group_mean_shift_test([1.0, 2.0, 3.0], [1.0, 2.0], [0, 1], [0, 1])


# ------------------------------------------------------------------------------------ the equivalence test
def _interval_inside(gap, se, df, margin, alpha):
    """The slow reference: is the ``1 - 2 alpha`` confidence interval of the gap inside ``(-margin, margin)``?"""
    from scipy.stats import t as student_t

    half = student_t.ppf(1 - alpha, df) * se
    return -margin < gap - half and gap + half < margin


@pytest.mark.parametrize("gap,se,df", [(0.09, 0.035, 5.2), (-0.11, 1.0, 3.1), (0.3, 0.05, 6.0), (-0.2, 0.02, 2.4),
                                       (2.7, 0.12, 5.9), (0.0, 0.4, 30.0)])
def test_equivalence_pvalue_is_below_alpha_exactly_when_the_interval_is_inside_the_margin(gap, se, df):
    for margin in (0.1, 0.25, 0.5, 1.0):
        p = equivalence_pvalue(gap, se, df, margin)
        assert 0.0 <= p <= 1.0
        for alpha in (0.01, 0.05, 0.1, 0.2):
            if abs(p - alpha) > 1e-9:
                assert (p < alpha) == _interval_inside(gap, se, df, margin, alpha), (margin, alpha, p)
        assert p == pytest.approx(equivalence_pvalue(-gap, se, df, margin))  # symmetric in the gap's sign


def test_equivalence_pvalue_edge_cases():
    assert equivalence_pvalue(0.1, 0.0, None, 0.25) == 0.0 and equivalence_pvalue(0.3, 0.0, None, 0.25) == 1.0
    assert equivalence_pvalue(None, 0.1, 4.0, 0.25) == 1.0 and equivalence_pvalue(0.0, None, None, 0.25) == 1.0
    assert equivalence_pvalue(0.0, math.nan, 4.0, 0.25) == 1.0 and equivalence_pvalue(0.0, 0.1, math.nan, 0.25) == 1.0
    for bad in (0.0, -0.1, math.inf, math.nan):
        with pytest.raises(ValueError, match="margin must be a finite number > 0"):
            equivalence_pvalue(0.0, 0.1, 4.0, bad)
    # the closer and the more precise, the smaller
    assert equivalence_pvalue(0.0, 0.05, 6, 0.25) < equivalence_pvalue(0.1, 0.05, 6, 0.25) < equivalence_pvalue(
        0.2, 0.05, 6, 0.25)
    assert equivalence_pvalue(0.0, 0.05, 6, 0.25) < equivalence_pvalue(0.0, 0.2, 6, 0.25)


# ---------------------------------------------------------------------- constructed NLL distributions
def test_unseen_authors_of_different_difficulty_pass_and_memorised_ones_fail():
    """Forget authors harder than the holdout authors (NLL about 2.9 against 2.45, as on the v2 pair), a
    difficulty the base model shows too: the ideal model (neither side seen) passes the criterion with author
    groups and the base's offset, the target (forget rows memorised) fails it by far. Rows taken as independent
    draws (the KS test, or the group test with every row a group) reject the ideal model."""
    rng = np.random.default_rng(1)
    difficulty_h = _difficulty(rng, [2.7, 2.9, 3.0, 3.2])
    difficulty_f = _difficulty(rng, [3.1, 3.3, 3.5, 3.6])
    base = (difficulty_f + rng.normal(0, 0.15, ROWS), difficulty_h + rng.normal(0, 0.15, ROWS))
    ideal_f, holdout = difficulty_f - 0.5 + rng.normal(0, 0.1, ROWS), difficulty_h - 0.5 + rng.normal(0, 0.1, ROWS)
    memorised = np.abs(rng.normal(0.06, 0.02, ROWS))
    by_rows = _measure(_criterion(), ideal_f, holdout)
    assert by_rows["forget_holdout_pvalue"] < 1e-4 and by_rows["forget_holdout_ks_pvalue"] < 0.01, by_rows
    criterion = _criterion(groups="tofu_authors", reference_nll=base)
    ideal = _measure(criterion, ideal_f, holdout)
    target = _measure(criterion, memorised, holdout)
    assert ideal["forget_holdout_pvalue"] >= 0.05 and abs(ideal["shift_gap"]) < 0.1, ideal
    assert target["forget_holdout_pvalue"] < 1e-3 and target["shift_gap"] < -2.5, target
    assert target["forget_holdout_pvalue"] < ideal["forget_holdout_pvalue"] / 100  # fails by far
    assert ideal["forget_holdout_ks_pvalue"] == by_rows["forget_holdout_ks_pvalue"]  # kept for reference
    assert criterion.rule()["groups"] == "tofu_authors"


def test_an_author_cluster_shift_alone_does_not_fail_the_group_test():
    """Forget and holdout authors from the same population, with author effects: a row-level test sees 80
    correlated rows as 80 draws and rejects; the group test sees 4 authors a side and does not."""
    rng = np.random.default_rng(2)
    forget = _difficulty(rng, [2.6, 2.5, 2.9, 2.8], row_sd=0.2)
    holdout = _difficulty(rng, [2.3, 2.7, 2.2, 2.4], row_sd=0.2)
    rows = _measure(_criterion(), forget, holdout)
    grouped = _measure(_criterion(groups="tofu_authors"), forget, holdout)
    assert rows["forget_holdout_pvalue"] < 0.01 and grouped["forget_holdout_pvalue"] >= 0.05
    assert grouped["shift_gap"] == pytest.approx(rows["shift_gap"])  # equal groups: the same gap
    labels = ([f"author {i // 20}" for i in range(ROWS)], [i // 20 for i in range(ROWS)])
    explicit = _measure(_criterion(groups=labels), forget, holdout)
    assert explicit["forget_holdout_pvalue"] == pytest.approx(grouped["forget_holdout_pvalue"])


def test_a_reference_models_offset_removes_a_difficulty_gap():
    """Many forget authors all harder than the holdout authors by 1 nat: even the group test rejects the ideal
    model, unless the base model's per-row NLL (which carries the same difficulty) is subtracted first."""
    rng = np.random.default_rng(3)
    n_authors = 10
    difficulty_f = _difficulty(rng, [3.5] * n_authors, author_sd=0.2)
    difficulty_h = _difficulty(rng, [2.5] * n_authors, author_sd=0.2)
    base_f, base_h = difficulty_f + rng.normal(0, 0.1, difficulty_f.size), difficulty_h + rng.normal(0, 0.1, difficulty_h.size)
    # fine-tuning on other authors makes every row a bit easier, some authors more than others
    easier = np.linspace(-0.15, 0.15, n_authors)  # the same spread of author effects on both sides
    ideal_f = difficulty_f - 0.6 + np.repeat(rng.permutation(easier), TOFU_AUTHOR_ROWS)
    ideal_h = difficulty_h - 0.6 + np.repeat(rng.permutation(easier), TOFU_AUTHOR_ROWS)
    n = n_authors * TOFU_AUTHOR_ROWS

    def criterion(**kwargs):
        return SelectionCriterion(_rows("forget", n), _rows("holdout", n), _rows("retain", 10),
                                  groups="tofu_authors", **kwargs)

    without = _measure(criterion(), ideal_f, ideal_h)
    with_ref = criterion(reference_nll=(base_f, base_h))
    ideal = _measure(with_ref, ideal_f, ideal_h)
    assert without["forget_holdout_pvalue"] < 1e-4 and without["shift_gap"] > 0.5
    assert ideal["forget_holdout_pvalue"] >= 0.05 and abs(ideal["shift_gap"]) < 0.05, ideal
    assert ideal["forget_shift"] == pytest.approx(-0.6, abs=0.05) and ideal["forget_nll"] > 2.5
    memorised = _measure(with_ref, np.abs(rng.normal(0.05, 0.02, n)), ideal_h)
    overshot = _measure(with_ref, ideal_f + 2.0, ideal_h)
    assert memorised["forget_holdout_pvalue"] < 1e-6 and memorised["shift_gap"] < -2.5
    assert overshot["forget_holdout_pvalue"] < 1e-6 and overshot["shift_gap"] > 1.5
    assert with_ref.rule()["reference"] == "reference model"


def test_the_rule_picks_the_candidate_that_lands_on_never_seen_rows():
    """A path from memorised to overshot forget rows: the rule chooses the step nearest the ideal model's NLLs,
    where the old 'strongest within tolerance' fallback would take the overshoot."""
    rng = np.random.default_rng(4)
    holdout = _difficulty(rng, [2.2, 2.4, 2.5, 2.7])
    ideal = _difficulty(rng, [2.6, 2.8, 3.0, 3.1])
    base_f, base_h = ideal + 0.5, holdout + 0.5
    memorised = np.full(ROWS, 0.05)
    criterion = _criterion(groups="tofu_authors", reference_nll=(base_f, base_h))
    steps = [0.0, 0.4, 0.8, 1.0, 1.3, 1.8]  # 1.0 reaches the ideal model; beyond it, an overshoot
    measurements = [_measure(criterion, memorised + s * (ideal - memorised), holdout) for s in steps]
    for m, change in zip(measurements, (0.0, 0.01, 0.02, 0.03, 0.05, 0.08)):
        m["retain_change"] = change
    record = criterion.decide([{"step": s} for s in steps], measurements)
    assert record.chosen == {"step": 1.0} and record.warning is None
    assert "| **3** | 1 |" in record.markdown() and "group means (tofu_authors)" in record.markdown()


def test_a_small_precise_gap_passes_the_equivalence_level_where_the_difference_test_fails():
    """The ideal model with tight author groups and a small real offset between forget and holdout authors (a
    gap of about +0.1 nats/token with authors about 0.03 apart, as the retain reference on a SmolLM2 pair): a
    difference test calls it distinguishable, the equivalence test shows it within the margin. The target fails
    both by far; a candidate whose forget rows scatter widely around 0 passes the difference test by its noise and
    fails the equivalence test."""
    rng = np.random.default_rng(6)
    holdout = np.repeat([0.30, 0.33, 0.36, 0.32], TOFU_AUTHOR_ROWS) + rng.normal(0, 0.05, ROWS)
    ideal = np.repeat([0.42, 0.45, 0.41, 0.44], TOFU_AUTHOR_ROWS) + rng.normal(0, 0.05, ROWS)
    target = np.repeat(-2.4 + rng.normal(0, 0.2, AUTHORS), TOFU_AUTHOR_ROWS) + rng.normal(0, 0.1, ROWS)
    noisy = np.repeat(np.array([-1.8, 2.2, -1.5, 1.4]), TOFU_AUTHOR_ROWS) + rng.normal(0, 0.1, ROWS)
    criterion = _criterion(groups="tofu_authors", holdout_margin=0.25)
    ideal_m, target_m, noisy_m = (_measure(criterion, f, holdout) for f in (ideal, target, noisy))
    assert 0.05 < ideal_m["shift_gap"] < 0.2 and ideal_m["forget_holdout_pvalue"] < 0.05, ideal_m
    assert ideal_m["equivalence_pvalue"] < 0.05 and ideal_m["shift_gap_df"] > 1
    assert target_m["equivalence_pvalue"] > 0.999 and target_m["forget_holdout_pvalue"] < 1e-3
    assert abs(noisy_m["shift_gap"]) < 0.3 and noisy_m["forget_holdout_pvalue"] > 0.5
    assert noisy_m["equivalence_pvalue"] > 0.3, noisy_m
    for m in (ideal_m, target_m, noisy_m):  # the measured p is the pure function's on the recorded figures
        assert m["equivalence_pvalue"] == pytest.approx(
            equivalence_pvalue(m["shift_gap"], m["shift_gap_se"], m["shift_gap_df"], 0.25))
    measurements = [dict(target_m, retain_change=0.0), dict(noisy_m, retain_change=0.01),
                    dict(ideal_m, retain_change=0.02)]
    record = criterion.decide([{"step": s} for s in (0, 1, 2)], measurements)
    assert record.index == 2 and record.warning is None and "equivalence p" in record.reason
    assert record.rule["holdout_margin"] == 0.25 and "within +-0.25 nats/token" in record.markdown()
    with pytest.warns(UserWarning, match="not shown to lie within 0.25 nats/token"):
        index, _ = criterion.select(measurements[:2])  # the noisy candidate is closest, and not shown equivalent
    assert index == 1
    narrow = _criterion(groups="tofu_authors", holdout_margin=0.05)  # a margin below the real offset: a warning
    with pytest.warns(UserWarning, match="not shown to lie within 0.05"):
        narrow.decide([{"step": 2}], [dict(_measure(narrow, ideal, holdout), retain_change=0.0)])


def test_the_holdout_margin_is_checked_before_any_work():
    for bad in (0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="holdout_margin must be a finite number > 0"):
            _criterion(holdout_margin=bad)


def test_statistics_without_groups_or_reference_on_identical_rows():
    rng = np.random.default_rng(5)
    rows = [-np.abs(rng.normal(2.0, 0.3, 12)) for _ in range(30)]
    stats = forget_holdout_statistics(rows, [r.copy() for r in rows])
    assert stats["shift_gap"] == 0.0 and stats["forget_holdout_pvalue"] == pytest.approx(1.0)
    assert stats["forget_holdout_ks_pvalue"] == pytest.approx(1.0) and stats["mia_auc"] == pytest.approx(0.5)
    broken = forget_holdout_statistics([np.array([-1.0, -np.inf])] + rows[1:], rows)
    assert broken["forget_holdout_pvalue"] == 0.0 and broken["shift_gap"] is None


# ------------------------------------------------------------------------------------- clear errors
def test_groups_and_reference_are_checked_before_any_work():
    with pytest.raises(ValueError, match="multiple of 20 rows: forget"):
        SelectionCriterion(_rows("forget", 30), _rows("holdout"), _rows("retain", 5), groups="tofu_authors")
    with pytest.raises(ValueError, match="two holdout groups"):
        SelectionCriterion(_rows("forget"), _rows("holdout", 20), _rows("retain", 5), groups="tofu_authors")
    with pytest.raises(ValueError, match="groups must be None"):
        _criterion(groups="authors")
    with pytest.raises(ValueError, match="79 forget and 80 holdout labels"):
        _criterion(groups=([0, 1] * 39 + [0], [0, 1] * 40))
    with pytest.raises(ValueError, match="reference_nll holds 80 forget and 3 holdout"):
        _criterion(reference_nll=(np.ones(ROWS), np.ones(3)))
    with pytest.raises(ValueError, match="not all finite"):
        _criterion(reference_nll=(np.ones(ROWS), np.r_[np.ones(ROWS - 1), np.nan]))
    with pytest.raises(ValueError, match="reference_tokenizer"):
        _criterion(reference_model=object())
    with pytest.raises(ValueError, match="not both"):
        _criterion(reference_model=object(), reference_nll=(np.ones(ROWS), np.ones(ROWS)))


def test_reference_model_is_measured_once_and_a_candidate_equal_to_it_has_no_gap(tiny_pair, synthetic):
    from hf_unlearn.demo import load_tiny

    model, tok = load_tiny(tiny_pair.target)
    forget, holdout = synthetic["forget10"], synthetic["holdout10"]
    criterion = SelectionCriterion(forget, holdout, synthetic["retain90"][:10], groups=10,
                                   reference_model=model, reference_tokenizer=tok)
    ref_f, ref_h = criterion.reference_nll
    plain = SelectionCriterion(forget, holdout, synthetic["retain90"][:10], groups=10)
    first = plain.measure(model, tok)
    assert ref_f.mean() == pytest.approx(first["forget_nll"]) and ref_h.mean() == pytest.approx(first["holdout_nll"])
    same = criterion.measure(model, tok)  # the candidate is the reference: every row's shift is 0
    assert same["shift_gap"] == pytest.approx(0.0, abs=1e-9) and same["forget_holdout_pvalue"] == pytest.approx(1.0)
    assert same["forget_holdout_ks_pvalue"] == pytest.approx(first["forget_holdout_ks_pvalue"])
    reused = SelectionCriterion(forget, holdout, synthetic["retain90"][:10], groups=10,
                                reference_nll=criterion.reference_nll)
    assert reused.measure(model, tok)["shift_gap"] == pytest.approx(0.0, abs=1e-9)


def test_a_single_row_on_a_side_gives_a_gap_without_a_test():
    one = [np.full(4, -2.0)]
    stats = forget_holdout_statistics(one, _token_log_probs(np.array([1.5, 2.0, 2.5])))
    assert stats["shift_gap"] == pytest.approx(0.0) and stats["forget_holdout_pvalue"] is None


def test_the_bench_measures_a_pairs_base_once_as_the_reference(tiny_pair, synthetic):
    from types import SimpleNamespace

    from unlearn_bench.criterion import selection_criterion_options

    from hf_unlearn.demo import load_tiny

    model, tok = load_tiny(tiny_pair.retain)
    forget, holdout, validation = synthetic["forget10"], synthetic["holdout10"], synthetic["retain90"][:10]
    assert selection_criterion_options(tiny_pair, forget, holdout, validation, tok, {None}) == {None: {}}
    with_base = SimpleNamespace(**vars(tiny_pair), base=tiny_pair.retain)  # a pair with a pretrained base
    options = selection_criterion_options(with_base, forget, holdout, validation, tok, {None})
    assert options[None]["groups"] is None  # 20 synthetic rows a side are not whole TOFU authors (20 rows each)
    expected = SelectionCriterion(forget, holdout, validation, reference_model=model, reference_tokenizer=tok)
    for got, want in zip(options[None]["reference_nll"], expected.reference_nll):
        np.testing.assert_allclose(got, want, rtol=1e-6)
