"""TOFU-small v2's data layout on the real TOFU copy: which authors each role gets, and what no method can reach."""

from __future__ import annotations

import pytest
from unlearn_bench.subjects import AUTHOR_ROWS, SmallRecipe, small_fine_tune_retain_rows, small_tofu_configs


def _authors(rows: list[dict]) -> list[frozenset[str]]:
    """Each author's block of questions (TOFU lists an author's 20 rows together)."""
    return [frozenset(r["question"] for r in rows[i:i + AUTHOR_ROWS]) for i in range(0, len(rows), AUTHOR_ROWS)]


def _questions(rows: list[dict]) -> set[str]:
    return {r["question"] for r in rows}


@pytest.fixture(scope="module")
def v2(tofu_dir):
    return small_tofu_configs(str(tofu_dir), SmallRecipe.v2())


def test_v2_roles_have_the_documented_author_counts(v2):
    assert len(v2["forget10"]) == 4 * AUTHOR_ROWS
    assert len(v2["retain90"]) == 16 * AUTHOR_ROWS
    assert len(v2["retain_perturbed"]) == 8 * AUTHOR_ROWS
    assert len(v2["retain_validation"]) == 4 * AUTHOR_ROWS
    assert len(v2["holdout10"]) == 4 * AUTHOR_ROWS


def test_v2_evaluated_retain_authors_are_a_subset_of_the_retain_train_authors(v2):
    train = _questions(v2["retain90"])
    assert _questions(v2["retain_perturbed"]) <= train
    # ... and the first 8 retain-train authors are exactly the evaluated ones, in order
    assert _authors(v2["retain90"])[:8] == _authors(v2["retain_perturbed"])


def test_v2_roles_are_disjoint(v2):
    roles = {name: _questions(v2[name]) for name in ("forget10", "retain90", "retain_validation", "holdout10")}
    names = list(roles)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not roles[a] & roles[b], f"{a} and {b} share questions"


def test_v2_no_real_author_or_world_fact_row_is_reachable_by_a_method(v2):
    general = _questions(v2["real_authors"]) | _questions(v2["world_facts"])
    assert general  # the evaluation sets are whole
    for name in ("forget10", "retain90", "retain_validation", "holdout10"):
        assert not _questions(v2[name]) & general, name


def test_v2_models_are_fine_tuned_on_retain_validation_but_never_on_holdout(v2):
    fine_tune = _questions(small_fine_tune_retain_rows(v2))
    assert _questions(v2["retain_validation"]) <= fine_tune
    assert _questions(v2["retain90"]) <= fine_tune
    assert not fine_tune & _questions(v2["holdout10"])
    assert not fine_tune & _questions(v2["forget10"])


def test_v1_layout_is_unchanged(tofu_dir):
    """The v1 pair retains on exactly the evaluated rows and has neither retain-validation nor holdout rows."""
    v1 = small_tofu_configs(str(tofu_dir), SmallRecipe())
    assert _questions(v1["retain90"]) == _questions(v1["retain_perturbed"])
    assert "retain_validation" not in v1 and "holdout10" not in v1
    assert SmallRecipe().layout == "v1" and SmallRecipe.v2().layout == "v2"
    # v1's cache key does not depend on the v2 fields' existence
    rows = v1["forget10"]
    assert SmallRecipe().digest("x", rows) != SmallRecipe.v2().digest("x", rows)


def test_v2_refuses_an_impossible_layout(tofu_dir):
    with pytest.raises(ValueError, match="retain_train_authors >= retain_authors"):
        small_tofu_configs(str(tofu_dir), SmallRecipe.v2(retain_train_authors=4))
    with pytest.raises(ValueError, match="holdout authors"):
        small_tofu_configs(str(tofu_dir), SmallRecipe.v2(holdout_authors=99))
