"""MASC's stop as the authors run it: the plain-mean and Hoeffding confirmations against their formulas, a run at
the authors' constant learning rate that the rule (not the step ceiling) ends, a budget-ended run that says so in
its record, log and model card, thresholds calibrated on never-seen rows, the authors' epoch length and preset."""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_masc import _config, _slow_continuation, _slow_margin

from hf_unlearn.methods.masc.loss import confirmation_statistic, sample_cut_ratios

# The tiny memorising model fine-tuned in full with the paper's objective (retain KL at weight 1, the default) and
# the authors' constant learning rate and plain-mean confirmation: measured to stop by the rule at step 18.
STOPPING = dict(
    learning_rate=2e-4, lr_scheduler_type="constant", confirm_rule="mean", retain_weight=1.0, forget_weight=0.05,
    max_steps=60,
)


def _trainer(tiny_target, synthetic, tmp_path, calibrate_stop_on=None, **overrides):
    from hf_unlearn.methods.masc import MASCTrainer

    model, tok = tiny_target
    args = _config(tmp_path, **{**STOPPING, **overrides})
    retain = synthetic["retain90"] if MASCTrainer.needs_retain(args) else None
    return MASCTrainer(model, args, train_dataset=synthetic["forget10"], retain_dataset=retain,
                       processing_class=tok, calibrate_stop_on=calibrate_stop_on)


@pytest.mark.parametrize("rates,j", [([0.1, 0.3, 0.5], 1), ([0.0] * 32, 3), ([0.2, 0.9, 0.4, 0.45], 17)])
def test_confirmation_statistics_equal_their_formulas(rates, j):
    mean = sum(rates) / len(rates)
    statistic, got_mean, delta_j = confirmation_statistic(rates, "mean", 0.05, j)
    assert statistic == pytest.approx(mean, abs=1e-12) and got_mean == pytest.approx(mean) and delta_j is None
    delta_j_want = 6 * 0.05 / (math.pi**2 * (j + 1) ** 2)
    bound = mean + math.sqrt(math.log(1 / delta_j_want) / (2 * len(rates)))
    statistic, _, delta_j = confirmation_statistic(torch.tensor(rates, dtype=torch.float64), "hoeffding", 0.05, j)
    assert statistic == pytest.approx(bound, rel=1e-12) and delta_j == pytest.approx(delta_j_want, rel=1e-12)
    with pytest.raises(ValueError, match="confirm_rule"):
        confirmation_statistic(rates, "ucb", 0.05, j)


def test_masc_at_constant_lr_stops_by_its_rule_before_the_budget(tiny_target, synthetic, tmp_path):
    trainer = _trainer(tiny_target, synthetic, tmp_path)
    trainer.train()
    args = trainer.args
    assert trainer.stop_reason == "rule" and trainer.stopped_at_step == trainer.state.global_step < args.max_steps
    rates = [e["learning_rate"] for e in trainer.state.log_history if "learning_rate" in e]
    assert len(rates) >= 2 and all(r == pytest.approx(args.learning_rate, rel=1e-9) for r in rates)  # constant
    assert any("retain_kl" in e for e in trainer.state.log_history)  # the paper's objective
    last = trainer.violation_history[-1]
    assert last["confirmed"] and last["confirm_statistic"] == pytest.approx(last["confirm_violation_rate"])
    assert last["confirm_statistic"] <= args.stop_tolerance
    # the Hoeffding bound on the same examples would not have confirmed: the plain mean is what made it stop
    bound, _, _ = confirmation_statistic([last["confirm_violation_rate"]] * last["confirm_examples"], "hoeffding",
                                         args.confirm_delta, last["confirmation"])
    assert bound > args.stop_tolerance
    trainer.save_model()
    summary = json.loads((tmp_path / "masc" / "masc_stopping.json").read_text())
    assert summary["stop_reason"] == "rule" and summary["rule"]["confirm_rule"] == "mean"
    trainer.create_model_card(dataset_name="synthetic", forget_split="forget10")
    card = (tmp_path / "masc" / "README.md").read_text()
    assert f"MASC stopped by its rule at step {trainer.stopped_at_step}" in card and "WARNING" not in card


def test_masc_run_ended_by_the_budget_says_so(tiny_target, synthetic, tmp_path):
    trainer = _trainer(tiny_target, synthetic, tmp_path, learning_rate=1e-7, max_steps=4)
    with pytest.warns(UserWarning, match="stop_reason='budget'"):
        trainer.train()
    assert trainer.stop_reason == "budget" and trainer.stopped_at_step is None
    assert {"masc/stop_reason": "budget", "step": 4} in trainer.state.log_history
    summary = trainer.stopping_callback.summary()
    assert summary["stop_reason"] == "budget" and summary["budget_exhausted"] and summary["max_steps"] == 4
    trainer.create_model_card(dataset_name="synthetic", forget_split="forget10")
    card = (tmp_path / "masc" / "README.md").read_text()
    assert "[!WARNING]" in card and "the step budget ended the run" in card and "max_steps=4" in card


def test_masc_calibrates_trigger_and_tolerance_on_never_seen_rows(tiny_target, synthetic, tmp_path):
    holdout = list(synthetic["holdout10"])
    trainer = _trainer(tiny_target, synthetic, tmp_path, calibrate_stop_on=holdout, max_steps=2)
    args = trainer.args
    # slow recomputation at step 0 (before any update): tokenize_qa + slow margin + slow continuation, with the
    # cut ratios the probe draws for stage "calibrate" batch by batch
    from hf_unlearn.data import tokenize_qa
    from hf_unlearn.methods.masc.trainer import _seeded

    gen = _seeded(args.seed, 0, 4)
    bs = args.per_device_eval_batch_size
    rates = []
    model = trainer.model
    model.eval()
    with torch.no_grad():
        for start in range(0, len(holdout), bs):
            chunk = holdout[start : start + bs]
            ratios = sample_cut_ratios(len(chunk), args.continuation_cut_min_ratio, args.continuation_cut_max_ratio, gen)
            for row, ratio in zip(chunk, ratios):
                feats = tokenize_qa(trainer.processing_class, row["question"], row["answer"])
                logits = model(input_ids=torch.tensor([feats["input_ids"]])).logits
                margins, mask = _slow_margin(logits, torch.tensor([feats["labels"]]), args.top_k, args.margin_beta)
                active = _slow_continuation(mask, ratio.reshape(1), args.continuation_min_prefix_tokens,
                                            args.continuation_min_suffix_tokens)
                values = [float(m) for m in margins[active]]
                rates.append(sum(v > args.tau for v in values) / len(values))
    want = sum(rates) / len(rates)
    with pytest.warns(UserWarning, match="step budget"):
        trainer.train()
    cb = trainer.stopping_callback
    assert cb.calibration["examples"] == len(holdout) and cb.calibration["violation_rate"] == pytest.approx(want)
    assert cb.trigger == cb.stop_tolerance == pytest.approx(want) and cb.calibration["configured_stop_tolerance"] == args.stop_tolerance
    assert want < trainer.violation_history[0]["violation_rate"]  # never-seen rows violate less than memorised ones
    check = trainer.violation_history[1]
    assert check["triggered"] == (check["violation_rate"] <= want)
    assert trainer.stopping_callback.summary()["rule"]["calibration"]["threshold"] == pytest.approx(want)


def test_masc_calibration_rows_must_be_never_seen(tiny_target, synthetic, tmp_path):
    forget = list(synthetic["forget10"])
    with pytest.raises(ValueError, match="also in the forget set"):
        _trainer(tiny_target, synthetic, tmp_path, calibrate_stop_on=forget[:3] + list(synthetic["holdout10"]))
    with pytest.raises(ValueError, match="also in the retain set"):
        _trainer(tiny_target, synthetic, tmp_path, calibrate_stop_on=list(synthetic["retain90"])[:2])
    with pytest.raises(ValueError, match="stop_probe='train'"):
        _trainer(tiny_target, synthetic, tmp_path, calibrate_stop_on=list(synthetic["holdout10"]),
                 stop_probe="heldout", penalty="full")
    assert not (tmp_path / "masc").exists()  # refused before any work


def test_masc_authors_epoch_length_cycles_the_forget_set_over_the_retain_set(tiny_target, synthetic, tmp_path):
    from collections import Counter

    from hf_unlearn.methods.masc import MASCTrainer

    model, tok = tiny_target
    forget, retain = synthetic["forget10"], synthetic["retain90"]
    with pytest.raises(ValueError, match="pass a `retain_dataset`"):
        MASCTrainer(model, _config(tmp_path, epoch_length="max(forget,retain)"), train_dataset=forget,
                    processing_class=tok)
    args = _config(tmp_path, epoch_length="max(forget,retain)", retain_weight=0.0)
    assert MASCTrainer.needs_retain(args) and not MASCTrainer.needs_reference_model(args)
    trainer = MASCTrainer(model, args, train_dataset=forget, retain_dataset=retain, processing_class=tok)
    data = trainer.train_dataset
    assert len(data) == max(len(forget), len(retain)) == 180
    forget_ids = [tuple(trainer.forget_dataset[i]["input_ids"]) for i in range(len(forget))]
    counts = Counter(forget_ids.index(tuple(data[i]["input_ids"])) for i in range(len(data)))
    assert counts == {i: 9 for i in range(len(forget))}  # each forget example 180 / 20 times per epoch
    partners = [tuple(data[i]["retain_input_ids"]) for i in range(len(data))]
    assert len(set(partners)) == len(retain)  # every retain example once per epoch
    data.set_epoch(1)
    assert [tuple(data[i]["retain_input_ids"]) for i in range(len(data))] != partners  # redrawn each epoch
    loader = trainer.get_train_dataloader()
    assert len(loader) == math.ceil(180 / args.per_device_train_batch_size)


def test_masc_calibrates_on_a_selection_criterions_holdout_rows_by_default(tiny_target, synthetic, tmp_path, caplog):
    from hf_unlearn.methods.masc import MASCTrainer
    from hf_unlearn.selection import SelectionCallback, SelectionCriterion

    model, tok = tiny_target
    forget, holdout = list(synthetic["forget10"]), list(synthetic["holdout10"])
    criterion = SelectionCriterion(forget, holdout, list(synthetic["retain90"])[-4:])
    args = _config(tmp_path, **STOPPING)
    assert args.calibrate_stop  # the default
    trainer = MASCTrainer(model, args, train_dataset=forget, retain_dataset=list(synthetic["retain90"])[:-4],
                          processing_class=tok, callbacks=[SelectionCallback(criterion, restore=False)])
    assert trainer.stopping_callback.calibrate
    assert trainer.stopping_callback.rule["calibration_examples"] == len(holdout)
    # without never-seen rows: one log line says the stop is the fixed threshold, and nothing is calibrated
    with caplog.at_level("WARNING", logger="hf_unlearn.methods.masc.trainer"):
        plain = _trainer(tiny_target, synthetic, tmp_path)
    assert not plain.stopping_callback.calibrate and "calibration_examples" not in plain.stopping_callback.rule
    lines = [r.getMessage() for r in caplog.records if "no holdout rows" in r.getMessage()]
    assert len(lines) == 1 and f"stop_tolerance={plain.args.stop_tolerance:.4g}" in lines[0] and "\n" not in lines[0]
    off = _trainer(tiny_target, synthetic, tmp_path, calibrate_stop_on=holdout, calibrate_stop=False)
    assert not off.stopping_callback.calibrate


def test_masc_refuses_a_threshold_below_the_holdout_state():
    from hf_unlearn.methods.masc.stopping import MarginStoppingCallback

    def callback(given, trigger=0.2, tolerance=0.2):
        cb = MarginStoppingCallback(trigger=trigger, stop_tolerance=tolerance, calibrate=True, given=given)
        cb.probe = lambda model, stage, step: [0.5, 0.7, 0.6]  # the never-seen rows' violation rates: mean 0.6
        return cb

    with pytest.raises(ValueError, match=r"stop_tolerance=0\.2 lies below the never-seen state.*0\.6"):
        callback(("stop_tolerance",)).calibrate_thresholds(None)
    with pytest.raises(ValueError, match=r"stop_trigger=0\.2 lies below"):
        callback(("stop_trigger",), tolerance=0.7).calibrate_thresholds(None)
    calibrated = callback(())  # recipe thresholds (not given) are replaced by the never-seen state
    calibrated.calibrate_thresholds(None)
    assert calibrated.trigger == calibrated.stop_tolerance == pytest.approx(0.6)
    looser = callback(("stop_tolerance",), tolerance=0.7)  # a given threshold at or above it is kept
    looser.calibrate_thresholds(None)
    assert (looser.trigger, looser.stop_tolerance) == (pytest.approx(0.6), 0.7)
    restored = MarginStoppingCallback(**looser.state()["args"])
    restored.load_state(looser.state())
    assert (restored.trigger, restored.stop_tolerance) == (pytest.approx(0.6), 0.7)


def test_masc_trainer_refuses_a_given_tolerance_below_the_holdout_state_before_any_update(tiny_target, synthetic,
                                                                                          tmp_path):
    trainer = _trainer(tiny_target, synthetic, tmp_path, calibrate_stop_on=list(synthetic["holdout10"]),
                       stop_tolerance=1e-4, max_steps=2)
    with pytest.raises(ValueError, match="lies below the never-seen state"):
        trainer.train()
    assert trainer.state.global_step == 0
