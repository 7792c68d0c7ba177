"""The benchmark's utility bar on the retain side and the general side, the utility-parts table, and the
memory column."""

from __future__ import annotations

import pytest

from hf_unlearn.bench.report import utility_parts_table
from hf_unlearn.bench.runner import GENERAL_BAR_COMPONENTS, choose_setting, utility_bar
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
    # one general component alone below 90% fails the general side though the harmonic mean stays above the bar
    row = _row(0.1)
    row["components"][GENERAL_BAR_COMPONENTS[0]] = 0.5 * 0.8
    bar = utility_bar(row, TARGET)
    assert bar["single"] and not bar["general"]
    # a missing component counts as not kept
    assert not utility_bar({"model_utility": 1.0, "components": {}}, TARGET)["retain"]


def test_choose_setting_with_the_split_bar():
    hidden_loss = _row(1e-2)
    hidden_loss["components"][GENERAL_BAR_COMPONENTS[0]] = 0.4  # one general part at 80%: the mean stays >= 90%
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
    assert lines[0].count("|") == 2 + 1 + 9 + 3
    npo = [c.strip() for c in lines[-1].strip("|").split("|")]
    assert npo[0] == "npo" and npo[-3:] == ["yes", "no", "no"]
    assert npo[2] == "0.500" and npo[5] == "0.250"  # retain prob kept, real-author prob halved


def test_comparison_resumes_from_its_partial_results_without_rerunning(tiny_pair, tmp_path, monkeypatch):
    import json

    import hf_unlearn.bench.runner as runner

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
    # another comparison's partial file (other evaluation settings) is refused, not mixed in
    other = dict(kwargs, eval_kwargs={"max_new_tokens": 8, "max_examples": 16})
    with pytest.raises(ValueError, match="another comparison"):
        runner.run_comparison(tiny_pair, ["grom"], resume=True, **other)
