"""The benchmark's utility bar on the retain side and the general side, the utility-parts table, and the
memory column."""

from __future__ import annotations

import pytest
from unlearn_bench.bar import GENERAL_BAR_COMPONENTS, choose_setting, side_utilities, utility_bar
from unlearn_bench.report import utility_parts_table

from hf_unlearn.evaluation import COMPONENT_NAMES


def _row(fq: float, scale_retain: float = 1.0, scale_general: float = 1.0, **extra) -> dict:
    parts = {name: 0.5 * (scale_retain if name.startswith("retain") else scale_general) for name in COMPONENT_NAMES}
    mu = len(parts) / sum(1 / v for v in parts.values())
    return {"forget_quality": fq, "model_utility": mu, "components": parts, "error": None, **extra}


TARGET = _row(1e-8)


def test_utility_bar_checks_each_side_against_the_target():
    assert utility_bar(_row(0.1), TARGET) == {"single": True, "retain": True, "general": True, "split": True}
    weak_general = utility_bar(_row(0.1, scale_general=0.85), TARGET)
    assert weak_general["retain"] and not weak_general["general"] and not weak_general["split"]
    weak_retain = utility_bar(_row(0.1, scale_retain=0.85), TARGET)
    assert not weak_retain["retain"] and weak_retain["general"]
    # one general component at 80%, the others kept: the side's harmonic mean stays above the bar
    row = _row(0.1)
    row["components"][GENERAL_BAR_COMPONENTS[0]] = 0.5 * 0.8
    assert utility_bar(row, TARGET)["general"]
    # one general component collapsed: the side fails though the one-number bar (fixed here) passes
    row["components"][GENERAL_BAR_COMPONENTS[1]] = 0.5 * 0.1
    bar = utility_bar(row, TARGET)
    assert bar["single"] and not bar["general"] and not bar["split"]
    # a missing component counts as not kept
    assert not utility_bar({"model_utility": 1.0, "components": {}}, TARGET)["retain"]
    partial = _row(0.1)
    del partial["components"][GENERAL_BAR_COMPONENTS[2]]
    assert not utility_bar(partial, TARGET)["general"]


# Model utility's parts of the SmolLM2-135M TOFU-small v2 pair (the bench's details table)
V2_TARGET = {"retain_prob": 0.944, "retain_rouge_l": 0.919, "retain_truth_ratio": 0.473,
             "real_authors_prob": 0.298, "real_authors_rouge_l": 0.122, "real_authors_truth_ratio": 0.384,
             "world_facts_prob": 0.320, "world_facts_rouge_l": 0.440, "world_facts_truth_ratio": 0.405}
V2_RETAIN_REFERENCE = {"retain_prob": 0.946, "retain_rouge_l": 0.930, "retain_truth_ratio": 0.472,
                       "real_authors_prob": 0.296, "real_authors_rouge_l": 0.107, "real_authors_truth_ratio": 0.376,
                       "world_facts_prob": 0.312, "world_facts_rouge_l": 0.463, "world_facts_truth_ratio": 0.397}


def _v2(parts: dict, utility: float) -> dict:
    return {"forget_quality": 0.5, "model_utility": utility, "components": dict(parts), "error": None}


def test_the_retain_reference_passes_the_split_bar_and_a_collapsed_side_fails():
    target, reference = _v2(V2_TARGET, 0.342), _v2(V2_RETAIN_REFERENCE, 0.327)
    # per component, real-author ROUGE-L 0.107 < 0.9 * 0.122 would fail the model unlearning aims at
    assert V2_RETAIN_REFERENCE["real_authors_rouge_l"] < 0.9 * V2_TARGET["real_authors_rouge_l"]
    assert utility_bar(reference, target) == {"single": True, "retain": True, "general": True, "split": True}
    sides, target_sides = side_utilities(reference), side_utilities(target)
    assert 0.93 < sides["general"] / target_sides["general"] < 0.96  # about 5% down, not 12%
    collapsed_general = dict(V2_RETAIN_REFERENCE, real_authors_rouge_l=0.02)  # real-author answers gone
    assert not utility_bar(_v2(collapsed_general, 0.30), target)["general"]
    halved_world = dict(V2_RETAIN_REFERENCE, **{k: v / 2 for k, v in V2_RETAIN_REFERENCE.items()
                                                 if k.startswith("world_facts")})
    assert not utility_bar(_v2(halved_world, 0.30), target)["general"]
    collapsed_retain = dict(V2_RETAIN_REFERENCE, retain_rouge_l=0.3)
    bar = utility_bar(_v2(collapsed_retain, 0.33), target)
    assert not bar["retain"] and bar["general"] and not bar["split"]


def test_harmonic_mean_of_a_side():
    assert side_utilities({"components": {"retain_prob": 0.5, "retain_rouge_l": 1.0}})["retain"] == pytest.approx(2 / 3)
    assert side_utilities({"components": {"retain_prob": 0.0, "retain_rouge_l": 1.0}})["retain"] == 0.0
    assert side_utilities({"components": {"retain_prob": None, "retain_rouge_l": 1.0}})["retain"] is None
    assert side_utilities({"components": None}) == {"retain": None, "general": None}


def test_choose_setting_with_the_split_bar():
    hidden_loss = _row(1e-2)
    hidden_loss["components"][GENERAL_BAR_COMPONENTS[0]] = 0.02  # one general part collapsed: the mean stays >= 90%
    grid = [_row(1e-6), hidden_loss, _row(1e-4, scale_retain=1.2), _row(0.5, scale_general=0.5)]
    assert choose_setting(grid, TARGET["model_utility"]) == 1
    assert choose_setting(grid, TARGET["model_utility"], TARGET, bar="split") == 2
    with pytest.raises(ValueError, match="target_row"):
        choose_setting(grid, TARGET["model_utility"], bar="split")
    with pytest.raises(ValueError, match="single"):
        choose_setting(grid, TARGET["model_utility"], TARGET, bar="both")


def test_utility_parts_table_lists_the_nine_components_and_the_bars():
    results = {"target": TARGET, "retain_reference": _row(1.0), "rows": {"npo": _row(1e-3, scale_general=0.5)}}
    lines = utility_parts_table(results).splitlines()
    assert lines[0].count("|") == 2 + 1 + 9 + 2 + 3
    npo = [c.strip() for c in lines[-1].strip("|").split("|")]
    assert npo[0] == "npo" and npo[-3:] == ["yes", "no", "no"] and npo[-5:-3] == ["1.000", "0.500"]
    assert npo[2] == "0.500" and npo[5] == "0.250"  # retain prob kept, real-author prob halved


def test_comparison_resumes_from_its_partial_results_without_rerunning(tiny_pair, tmp_path, monkeypatch):
    import json

    import unlearn_bench.runner as runner

    kwargs = dict(grid=False, source="synthetic", forget_split="forget10",
                  eval_kwargs={"max_new_tokens": 16, "max_examples": 16}, quantization_check=False, progress=False,
                  partial_path=tmp_path / "partial.json")
    first = runner.run_comparison(tiny_pair, ["grom"], **kwargs)
    assert json.loads((tmp_path / "partial.json").read_text())["run_key"]
    assert first["rows"]["grom"]["peak_added_mb"] >= 0 and first["plain_forward_added_mb"] >= 0

    def must_not_run(*args, **kw):
        raise AssertionError("a finished row was run again")

    monkeypatch.setattr(runner, "run_one", must_not_run)
    again = runner.run_comparison(tiny_pair, ["grom"], resume=True, **kwargs)
    assert again["rows"]["grom"]["forget_quality"] == first["rows"]["grom"]["forget_quality"]
    assert again["rows"]["grom"]["settings"] == first["rows"]["grom"]["settings"]
    # the same models in other folders (another cache, another machine): the same comparison, resumed
    import dataclasses
    import shutil

    moved = dataclasses.replace(tiny_pair, target=shutil.copytree(tiny_pair.target, tmp_path / "moved" / "target"),
                                retain=shutil.copytree(tiny_pair.retain, tmp_path / "moved" / "retain"))
    assert runner.run_comparison(moved, ["grom"], resume=True, **kwargs)["rows"]["grom"]["forget_quality"] == \
        first["rows"]["grom"]["forget_quality"]
    # another comparison's partial file (other evaluation settings) is refused, not mixed in
    other = dict(kwargs, eval_kwargs={"max_new_tokens": 8, "max_examples": 16})
    with pytest.raises(ValueError, match="another comparison"):
        runner.run_comparison(tiny_pair, ["grom"], resume=True, **other)
