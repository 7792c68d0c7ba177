"""T3 calibration: one head fit, the (T, w) grid scored with the tilted scorer, the choice and its record written
into the head's config, and both surviving save_pretrained / push / from_pretrained."""

from __future__ import annotations

import json

import pytest

from hf_unlearn.methods.t3 import T3Classifier, T3ClassifierConfig, fit_t3, t3_scorer
from hf_unlearn.methods.t3.calibration import calibrate_t3, calibration_grid
from hf_unlearn.selection import SelectionCriterion, select_candidate

TEMPERATURES, TILT_WEIGHTS = (1.0, 2.0), (0.5, 1.0)


@pytest.fixture(scope="module")
def fitted(tiny_pair, synthetic):
    from hf_unlearn.demo import load_tiny

    model, tok = load_tiny(tiny_pair.target)
    tok.pad_token = tok.pad_token or tok.eos_token
    forget, retain = synthetic["forget10"][:10], synthetic["retain90"][:40]
    clf = fit_t3(model, tok, forget, retain, T3ClassifierConfig(rank=4), steps=30, holdout_fraction=0.0,
                 progress=False)
    criterion = SelectionCriterion(forget, synthetic["holdout10"][:10], synthetic["retain90"][100:110])
    record = calibrate_t3(model, tok, clf, criterion, temperatures=TEMPERATURES, tilt_weights=TILT_WEIGHTS)
    return model, tok, clf, criterion, record


def test_grid_is_ordered_weak_to_strong_and_validated():
    grid = calibration_grid((2.0, 1.0, 1.5), (1.0, 0.5))
    strengths = [(p["temperature"] * p["tilt_weight"], p["temperature"]) for p in grid]
    assert strengths == sorted(strengths) and len(grid) == 6
    with pytest.raises(ValueError, match="temperature"):
        calibration_grid((0.5,), (1.0,))  # T < 1 sharpens: refused before any pass
    with pytest.raises(ValueError, match="tilt_weight"):
        calibration_grid((1.0,), (float("nan"),))


def test_calibration_writes_the_rule_choice_into_the_config(fitted):
    model, tok, clf, criterion, record = fitted
    assert len(record.measurements) == 4 and record.candidates == calibration_grid(TEMPERATURES, TILT_WEIGHTS)
    index, _, _ = select_candidate(record.measurements, criterion.retain_tolerance, criterion.holdout_level)
    assert record.index == index
    assert (clf.config.temperature, clf.config.tilt_weight) == (
        record.chosen["temperature"], record.chosen["tilt_weight"])
    assert clf.config.calibration["index"] == record.index
    # each point is the tilted scorer's own measurement at that (T, w)
    p = record.candidates[-1]
    again = criterion.measure(model, tok, scorer=t3_scorer(model, clf, p["temperature"], p["tilt_weight"]))
    assert again["forget_nll"] == pytest.approx(record.measurements[-1]["forget_nll"], rel=1e-6)
    # stronger tilt moves the memorised forget answers up
    assert record.measurements[-1]["forget_nll"] > record.measurements[0]["forget_nll"]
    assert criterion.original["retain_validation_nll"] < record.measurements[-1]["retain_validation_nll"] + 1e-9


def test_calibration_judges_retain_damage_by_the_greedy_decoding(fitted):
    _, _, clf, _, record = fitted
    assert "greedy regret" in record.rule["retain_measure"]
    by_point = {(c["temperature"], c["tilt_weight"]): m for c, m in zip(record.candidates, record.measurements)}
    for m in record.measurements:  # the rule holds the greedy regret within the tolerance, not the NLL change
        assert m["retain_change"] == m["retain_greedy_regret"] >= 0 and "retain_nll_change" in m
        assert 0 <= m["retain_greedy_agreement"] <= 1
    # (2, 0.5) decodes greedily as (1, 1): the same retain damage, though tempering raises its teacher-forced NLL
    tempered, plain = by_point[(2.0, 0.5)], by_point[(1.0, 1.0)]
    assert tempered["retain_change"] == pytest.approx(plain["retain_change"], abs=1e-3)
    assert tempered["retain_nll_change"] > plain["retain_nll_change"]


def test_calibration_survives_save_and_load(fitted, tmp_path):
    _, _, clf, _, record = fitted
    clf.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["calibration"]["chosen"] == record.chosen and saved["temperature"] == record.chosen["temperature"]
    loaded = T3Classifier.from_pretrained(tmp_path)
    assert loaded.config.calibration == clf.config.calibration
    assert (loaded.config.temperature, loaded.config.tilt_weight) == (clf.config.temperature, clf.config.tilt_weight)


def test_calibrated_head_pushes_with_its_record_and_card(hub, fitted):
    from huggingface_hub import ModelCard
    from transformers import AutoModel

    from hf_unlearn.hub import push_unlearned

    model, tok, clf, _, record = fitted
    model.push_to_hub("tester/tiny-target", token=hub.token)
    tok.push_to_hub("tester/tiny-target", token=hub.token)
    push_unlearned(clf, "tester/tiny-t3-calibrated", token=hub.token, base_model="tester/tiny-target",
                   forget_split="forget10", dataset="synthetic")
    assert "selection_record.json" in hub.files("tester/tiny-t3-calibrated")
    head = AutoModel.from_pretrained("tester/tiny-t3-calibrated")
    assert isinstance(head, T3Classifier) and head.config.calibration["index"] == record.index
    assert (head.config.temperature, head.config.tilt_weight) == (record.chosen["temperature"],
                                                                  record.chosen["tilt_weight"])
    card = ModelCard.load("tester/tiny-t3-calibrated")
    assert "Strength selection (reference-free)" in card.text and f"Chosen: candidate {record.index}" in card.text
