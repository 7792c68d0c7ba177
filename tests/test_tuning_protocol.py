"""The equal-budget tuning protocol: equal configuration counts are enforced before work, the across-configuration
rule cannot read forget quality, the sweep log resumes by content, and the utility-matched oracle column."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "tuning_protocol.py"


@pytest.fixture(scope="module")
def protocol():
    spec = importlib.util.spec_from_file_location("tuning_protocol", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["tuning_protocol"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _selection(gap, p, change, tolerance=0.1):
    return {"index": 1, "rule": {"retain_tolerance": tolerance},
            "measurements": [{"shift_gap": -3.0, "equivalence_pvalue": 1.0, "retain_change": 0.0},
                             {"shift_gap": gap, "equivalence_pvalue": p, "retain_change": change}]}


def test_every_headline_method_gets_the_same_number_of_configurations(protocol):
    configs = protocol.protocol_configurations([*protocol.TRAINERS, "grom", "t3"])
    assert {len(c) for c in configs.values()} == {len(protocol.LEARNING_RATES)}
    npo = configs["npo"]
    assert [c["learning_rate"] for c in npo] == list(protocol.LEARNING_RATES)
    assert all(c["num_train_epochs"] == 10 and c["warmup_steps"] == pytest.approx(0.1) for c in npo)


def test_a_method_with_more_or_fewer_configurations_is_refused(protocol):
    configs = protocol.protocol_configurations(["npo", "grad_diff", "grom"])
    more = {**configs, "npo": [*configs["npo"], {"learning_rate": 1e-3}]}
    with pytest.raises(ValueError, match="npo"):
        protocol.check_equal_budget(more)
    fewer = {**configs, "grom": configs["grom"][:2]}
    with pytest.raises(ValueError, match="grom"):
        protocol.check_equal_budget(fewer)
    repeated = {**configs, "grad_diff": [configs["grad_diff"][0]] * 4}
    with pytest.raises(ValueError, match="the same"):
        protocol.check_equal_budget(repeated)
    with pytest.raises(ValueError, match="no configurations"):
        protocol.protocol_configurations(["npo", "not_a_method"])


def test_the_rule_reads_no_forget_quality(protocol):
    assert "forget_quality" not in protocol.outcome_fields()
    assert list(inspect.signature(protocol.choose_configuration).parameters) == ["outcomes"]
    # Records whose forget quality would reverse the pick: the closest eligible gap has the worst forget quality.
    records = [
        {**_selection(-0.8, 0.4, 0.02), "forget_quality": 0.9},
        {**_selection(0.1, 0.01, 0.05), "forget_quality": 1e-9},
        {**_selection(0.05, 0.01, 0.3), "forget_quality": 0.99},  # outside the retain tolerance
    ]
    for r in records:
        r["measurements"][1]["forget_quality"] = r["forget_quality"]
    outcomes = [protocol.outcome_from_selection(i, r) for i, r in enumerate(records)]
    assert all("forget_quality" not in dataclasses.asdict(o) for o in outcomes)
    pick = protocol.choose_configuration(outcomes)
    assert pick == 1
    flipped = [dict(r, forget_quality=1 - r["forget_quality"]) for r in records]
    assert protocol.choose_configuration([protocol.outcome_from_selection(i, r) for i, r in enumerate(flipped)]) == 1


def test_ties_go_to_the_weaker_configuration_and_no_eligible_takes_the_smallest_retain_change(protocol):
    outcome = protocol.ConfigurationOutcome
    assert protocol.choose_configuration([outcome(0, 0.2, 0.1, 0.0, True), outcome(1, -0.2, 0.1, 0.0, True)]) == 0
    assert protocol.choose_configuration([outcome(0, 0.0, 0.1, 0.5, False), outcome(1, 2.0, 0.1, 0.2, False)]) == 1
    with pytest.raises(ValueError, match="nothing to choose"):
        protocol.choose_configuration([])


def test_the_sweep_log_resumes_by_content(protocol, tmp_path):
    path = tmp_path / "sweep.json"
    key = protocol.configuration_key("npo", {"learning_rate": 1e-5}, {"target": "abc"})
    assert key == protocol.configuration_key("npo", {"learning_rate": 1e-5}, {"target": "abc"})
    assert key != protocol.configuration_key("npo", {"learning_rate": 3e-5}, {"target": "abc"})
    assert key != protocol.configuration_key("npo", {"learning_rate": 1e-5}, {"target": "other"})
    log = protocol.SweepLog(path)
    assert not log.done(key)
    log.add(key, {"method": "npo", "seconds": 1.0}, {"protocol": "test"})
    again = protocol.SweepLog(path)
    assert again.done(key) and again.records[key]["method"] == "npo"
    link = tmp_path / "link.json"
    link.symlink_to(path)
    with pytest.raises(ValueError, match="link"):
        protocol.SweepLog(link)


def test_best_forget_quality_at_ninety_percent_of_the_targets_utility(protocol):
    candidates = [{"forget_quality": 1e-6, "model_utility": 0.50},
                  {"forget_quality": 1e-2, "model_utility": 0.46},
                  {"forget_quality": 0.5, "model_utility": 0.40},   # below 0.9 x 0.5
                  {"forget_quality": 1e-2, "model_utility": 0.47}]
    assert protocol.best_forget_quality_at_utility(candidates, 0.5) == 1
    assert protocol.best_forget_quality_at_utility(candidates, 0.5, fraction=0.8) == 2
    assert protocol.best_forget_quality_at_utility(candidates, 1.0) is None


def test_model_utility_without_generation_and_the_oracle_over_scored_candidates(protocol):
    splits = {"retain": {"prob": [0.5, 0.7], "truth_ratio": [0.2, 0.6]},   # prob 0.6, score mean(0.8, 0.4) = 0.6
              "real_authors": {"prob": [0.3], "truth_ratio": [1.5]},       # score max(0, -0.5) = 0
              "world_facts": {"prob": [0.4], "truth_ratio": [0.5]}}
    assert protocol.model_utility_without_generation(splits) == 0.0  # one part is 0
    splits["real_authors"]["truth_ratio"] = [0.7]
    parts = [0.6, 0.6, 0.3, 0.3, 0.4, 0.5]
    assert protocol.model_utility_without_generation(splits) == pytest.approx(6 / sum(1 / v for v in parts))
    candidates = [{"forget_quality": 0.2, "model_utility": 0.3, "configuration": 0},
                  {"forget_quality": 0.01, "model_utility": 0.5, "configuration": 1},
                  {"forget_quality": 0.05, "model_utility": None, "configuration": 2}]  # not measured
    assert protocol.utility_matched_view(candidates, 0.5)["configuration"] == 1
    assert protocol.utility_matched_view(candidates, 0.9) is None


def test_the_second_axis_joins_each_main_weight_with_every_learning_rate(protocol):
    configs = protocol.protocol_configurations(["npo", "simnpo", "grad_diff", "atwu"], second_axis=True)
    assert protocol.check_equal_budget(configs) == 2 * len(protocol.LEARNING_RATES)
    assert [(c["learning_rate"], c["beta"]) for c in configs["npo"][:3]] == [(1e-5, 0.1), (1e-5, 0.5), (3e-5, 0.1)]
    assert {c["budget"] for c in configs["atwu"]} == {0.2, 0.4}
    with pytest.raises(ValueError, match="grom"):
        protocol.protocol_configurations(["npo", "grom"], second_axis=True)
