"""The reference-free selection criterion, its rule and record, and the best-checkpoint callback."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

from hf_unlearn.selection import (
    SELECTION_WEIGHTS,
    SelectionCallback,
    SelectionCriterion,
    SelectionRecord,
    forget_holdout_statistics,
    select_candidate,
)


def _token_lps(rng, n_rows, mean_nll, tokens=12):
    return [-np.abs(rng.normal(mean_nll, 0.3, size=tokens)) for _ in range(n_rows)]


# --------------------------------------------------------------------------------------- the statistics
def test_identical_distributions_give_p_one_and_chance_auc():
    rng = np.random.default_rng(0)
    rows = _token_lps(rng, 30, 2.0)
    stats = forget_holdout_statistics(rows, [r.copy() for r in rows])
    assert stats["forget_holdout_pvalue"] == pytest.approx(1.0)
    assert stats["forget_holdout_ks"] == 0.0
    assert stats["mia_auc"] == pytest.approx(0.5)


def test_shifted_distributions_give_small_p_and_auc_that_names_the_direction():
    rng = np.random.default_rng(1)
    holdout = _token_lps(rng, 30, 2.5)
    memorised = _token_lps(rng, 30, 0.2)  # the model still knows the forget answers
    overshot = _token_lps(rng, 30, 8.0)  # pushed far beyond never-seen rows
    for forget, auc_side in ((memorised, 1.0), (overshot, 0.0)):
        stats = forget_holdout_statistics(forget, holdout)
        assert stats["forget_holdout_pvalue"] < 1e-6, stats
        assert stats["forget_holdout_ks"] == pytest.approx(1.0)
        assert abs(stats["mia_auc"] - auc_side) < 0.05, stats
    near = forget_holdout_statistics(_token_lps(rng, 30, 2.5), holdout)
    assert near["forget_holdout_ks_pvalue"] > 0.05 and abs(near["shift_gap"]) < 0.2


def test_non_finite_log_probs_count_as_distinguishable():
    rows = [np.array([-1.0, -2.0])] * 4
    stats = forget_holdout_statistics([np.array([-1.0, -np.inf])] + rows[1:], rows)
    assert stats["forget_holdout_pvalue"] == 0.0 and stats["mia_auc"] is None


# --------------------------------------------------------------------------------------------- the rule
def _m(gap, change, p=0.5, se=0.05, df=6.0):
    """A measurement: the gap with its standard error and Welch df (which the equivalence level reads), the
    difference p (for reference only) and the retain change."""
    from hf_unlearn.evaluation.privacy import equivalence_pvalue
    from hf_unlearn.selection import DEFAULT_HOLDOUT_MARGIN

    return {"shift_gap": gap, "shift_gap_se": se, "shift_gap_df": df, "forget_holdout_pvalue": p,
            "equivalence_pvalue": equivalence_pvalue(gap, se, df, DEFAULT_HOLDOUT_MARGIN), "retain_change": change}


def test_rule_respects_the_retain_tolerance():
    ms = [_m(-2.0, 0.0), _m(-0.4, 0.05), _m(0.0, 0.5), _m(0.1, 0.08)]
    index, reason, warning = select_candidate(ms, retain_tolerance=0.1, holdout_level=0.05)
    assert index == 3 and warning is None and "+0.1" in reason  # gap 0 is out of tolerance
    assert select_candidate(ms, retain_tolerance=1.0)[0] == 2


def test_rule_counts_an_overshoot_like_an_undershoot():
    ms = [_m(-2.0, 0.0), _m(-0.3, 0.01), _m(0.2, 0.02), _m(1.5, 0.03)]
    assert select_candidate(ms)[0] == 2  # |+0.2| < |-0.3|: the closest, not the strongest nor the weakest
    ms[2]["shift_gap"] = -0.3  # equally close: the weaker
    assert select_candidate(ms)[0] == 1


def test_rule_ties_go_to_the_weaker_candidate():
    ms = [_m(-1.0, 0.0), _m(0.1, 0.01), _m(-0.1, 0.02), _m(0.1, 0.03)]
    assert select_candidate(ms)[0] == 1
    criterion = SelectionCriterion([{"question": "q", "answer": "a"}], [{"question": "q2", "answer": "b"}],
                                   [{"question": "q3", "answer": "c"}])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the normal case does not warn
        assert criterion.select(ms) == (1, select_candidate(ms)[1])


def test_rule_warns_when_the_closest_candidate_stays_distinguishable():
    ms = [_m(-3.0, 0.0, 1e-9), _m(-1.0, 0.02, 1e-4), _m(-0.1, 0.5, 0.9), _m(-0.6, 0.09, 0.01), _m(0.9, 0.2, 0.02)]
    index, reason, warning = select_candidate(ms)  # the closest eligible gap, -0.6, is outside the 0.5 margin
    assert index == 3 and "closest" in reason and "not shown to lie within 0.5 nats/token" in warning
    criterion = SelectionCriterion([{"question": "q", "answer": "a"}], [{"question": "q2", "answer": "b"}],
                                   [{"question": "q3", "answer": "c"}])
    with pytest.warns(UserWarning, match="not shown to lie within"):
        assert criterion.select(ms)[0] == 3
    assert select_candidate(ms, holdout_margin=1.0)[2] is None  # within a wider margin, precisely measured
    noisy = [_m(-3.0, 0.0), _m(0.05, 0.01, p=0.95, se=0.8)]  # close, but too scattered to be placed
    assert "not shown" in select_candidate(noisy)[2]


def test_rule_when_nothing_is_within_tolerance_takes_the_smallest_retain_change():
    ms = [_m(0.0, 0.4), _m(0.1, 0.3), _m(0.0, float("nan")), _m(0.0, 0.3)]
    index, _, warning = select_candidate(ms, retain_tolerance=0.1)
    assert index == 1 and "smallest retain change" in warning


def test_rule_never_chooses_a_candidate_without_a_finite_gap_over_one_with_it():
    ms = [_m(None, 0.0, 0.0), _m(-2.5, 0.01, 1e-6), _m(float("inf"), 0.02, 0.0)]
    assert select_candidate(ms)[0] == 1


def test_record_round_trips_and_renders(tmp_path):
    criterion = SelectionCriterion([{"question": "q", "answer": "a"}], [{"question": "q2", "answer": "b"}],
                                   [{"question": "q3", "answer": "c"}], original={"retain_validation_nll": 1.0})
    ms = [{**_m(-2.0, 0.0, 0.01), "mia_auc": 0.9}, {**_m(0.05, 0.04, 0.7), "mia_auc": float("nan")}]
    record = criterion.decide([{"scale": 0.5}, {"scale": 1.0}], ms)
    path = record.save(tmp_path)
    data = json.loads(path.read_text())
    assert data["index"] == 1 and data["chosen"] == {"scale": 1.0} and data["measurements"][1]["mia_auc"] is None
    loaded = SelectionRecord.load(tmp_path)
    assert loaded.index == 1 and loaded.candidates == record.candidates and loaded.rule["retain_tolerance"] == 0.1
    text = record.markdown()
    assert "| **1** | 1 | 0.05 | 0.05 | 5.264e-05 | 0.7 |" in text and "Strength selection" in text and "closest" in text
    assert "within +-0.5 nats/token" in text and record.warning is None


def test_criterion_refuses_bad_settings():
    rows, other = [{"question": "q", "answer": "a"}], [{"question": "q2", "answer": "b"}]
    with pytest.raises(ValueError, match="holdout"):
        SelectionCriterion(rows, [], rows)
    with pytest.raises(ValueError, match="retain_tolerance"):
        SelectionCriterion(rows, other, rows, retain_tolerance=-1)
    with pytest.raises(ValueError, match="holdout_level"):
        SelectionCriterion(rows, other, rows, holdout_level=0)


# ------------------------------------------------------------------------------- on a real tiny model
@pytest.fixture(scope="module")
def tiny(tiny_pair):
    from hf_unlearn.demo import load_tiny

    return load_tiny(tiny_pair.target)


def test_measure_on_the_tiny_target(tiny, synthetic):
    model, tok = tiny
    forget, retain = synthetic["forget10"], synthetic["retain90"]
    criterion = SelectionCriterion(forget, synthetic["holdout10"], retain[:20], generic=synthetic["world_facts"])
    first = criterion.measure(model, tok)  # the first measured model is the original
    assert first["retain_change"] == 0.0 and first["generic_change"] == 0.0
    assert first["forget_nll"] < 0.5 < first["holdout_nll"]  # the target memorises the forget authors
    assert first["forget_holdout_pvalue"] < 1e-3 and first["mia_auc"] > 0.9
    assert first["shift_gap"] < -1.0  # no reference model: the shift is the NLL itself
    # measure() is the four row sets scored, then measure_from_log_probs on them
    from hf_unlearn.logprobs import causal_lm_scorer

    scorer = causal_lm_scorer(model)
    arrays = [criterion._score(model, tok, rows, scorer) for rows in
              (criterion.forget, criterion.holdout, criterion.retain_validation, criterion.generic)]
    again = criterion.measure_from_log_probs(*arrays)
    assert again == pytest.approx({k: v for k, v in first.items() if k != "seconds"})
    with pytest.raises(ValueError, match="holdout: 19 log-probability arrays for 20 rows"):
        criterion.measure_from_log_probs(arrays[0], arrays[1][:-1], *arrays[2:])
    with pytest.raises(ValueError, match="generic"):
        criterion.measure_from_log_probs(*arrays[:3])
    with torch.no_grad():  # a damaged model: the retain change is measured against the cached original
        w = model.lm_head.weight
        saved = w.clone()
        w.add_(0.5 * torch.randn(w.shape, generator=torch.Generator().manual_seed(0)))
    try:
        damaged = criterion.measure(model, tok)
    finally:
        with torch.no_grad():
            w.copy_(saved)
    assert damaged["retain_validation_change"] > 0.05
    assert damaged["retain_change"] == max(damaged["retain_validation_change"], damaged["generic_change"])


# ---------------------------------------------------------------------------------------- the callback
class _ScriptedCriterion(SelectionCriterion):
    """The real measurement, with the shift gap and retain change replaced by a script keyed by training step, so
    the test knows which step the rule must choose; it also records the weights it saw at each step."""

    script = {0: (-3.0, 0.0), 2: (-0.8, 0.02), 4: (-0.05, 0.05), 6: (0.6, 0.08), 8: (0.0, 0.7)}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.step = 0
        self.seen: dict[int, torch.Tensor] = {}

    def measure(self, model, tokenizer, scorer=None):
        out = super().measure(model, tokenizer, scorer)
        out["shift_gap"], out["retain_change"] = self.script[self.step]
        self.seen[self.step] = model.lm_head.weight.detach().clone()
        return out


def _step_spy(criterion):
    from transformers import TrainerCallback

    class Spy(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            criterion.step = state.global_step

        def on_step_end(self, args, state, control, **kwargs):
            criterion.step = state.global_step

    return Spy()


def _trainer(tiny_pair, synthetic, out, callbacks, **more):
    from datasets import Dataset

    from hf_unlearn.demo import load_tiny
    from hf_unlearn.methods.baselines import GradAscentConfig, GradAscentTrainer

    model, tok = load_tiny(tiny_pair.target)
    forget = Dataset.from_list([{"question": r["question"], "answer": r["answer"]} for r in synthetic["forget10"]])
    values = dict(output_dir=str(out), report_to="none", save_strategy="no", gradient_checkpointing=False,
                  disable_tqdm=True, per_device_train_batch_size=4, max_steps=8, logging_steps=4, seed=0,
                  learning_rate=3e-3)
    args = GradAscentConfig(**{**values, **more})
    return GradAscentTrainer(model=model, args=args, train_dataset=forget, processing_class=tok, callbacks=callbacks)


def _criterion(synthetic):
    return _ScriptedCriterion(synthetic["forget10"][:6], synthetic["holdout10"][:6], synthetic["retain90"][:6])


@pytest.mark.parametrize("keep", ["memory", "disk"])
def test_callback_restores_the_best_weights(tiny_pair, synthetic, tmp_path, keep):
    criterion = _criterion(synthetic)
    callback = SelectionCallback(criterion, selection_steps=2, keep=keep)
    trainer = _trainer(tiny_pair, synthetic, tmp_path / "out", [_step_spy(criterion), callback])
    trainer.train()
    assert callback.steps == [0, 2, 4, 6, 8]
    # step 8 has the smallest gap but is out of tolerance; step 4 is the closest within it
    assert callback.record.index == 2 and callback.record.chosen == {"step": 4} and callback.best_step == 4
    final = trainer.model.lm_head.weight.detach()
    torch.testing.assert_close(final, criterion.seen[4])
    assert (criterion.seen[8] - criterion.seen[4]).abs().max() > 1e-4  # the last step differs: restore mattered
    assert (tmp_path / "out" / "selection-best" / SELECTION_WEIGHTS).is_file() == (keep == "disk")


def test_callback_without_restore_records_and_leaves_the_final_weights(tiny_pair, synthetic, tmp_path):
    criterion = _criterion(synthetic)
    callback = SelectionCallback(criterion, selection_steps=4, restore=False)  # a trainer with its own stop (MASC)
    trainer = _trainer(tiny_pair, synthetic, tmp_path / "out", [_step_spy(criterion), callback])
    trainer.train()
    assert callback.steps == [0, 4, 8] and callback.record.chosen == {"step": 4}
    torch.testing.assert_close(trainer.model.lm_head.weight.detach(), criterion.seen[8])


def test_callback_state_round_trips_through_a_checkpoint(tiny_pair, synthetic, tmp_path):
    from transformers import TrainerCallback

    class Interrupt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 5:
                raise KeyboardInterrupt

    full_criterion = _criterion(synthetic)
    full_cb = SelectionCallback(full_criterion, selection_steps=2)
    full = _trainer(tiny_pair, synthetic, tmp_path / "a", [_step_spy(full_criterion), full_cb],
                    save_strategy="steps", save_steps=4)
    full.train()

    crit_b = _criterion(synthetic)
    first_cb = SelectionCallback(crit_b, selection_steps=2)
    first = _trainer(tiny_pair, synthetic, tmp_path / "b", [_step_spy(crit_b), first_cb, Interrupt()],
                     save_strategy="steps", save_steps=4)
    with pytest.raises(KeyboardInterrupt):
        first.train()
    checkpoint = tmp_path / "b" / "checkpoint-4"
    saved = json.loads((checkpoint / "trainer_state.json").read_text())["stateful_callbacks"]["SelectionCallback"]
    assert saved["attributes"]["steps"] == [0, 2, 4] and saved["attributes"]["best_step"] == 4
    assert (checkpoint / SELECTION_WEIGHTS).is_file()

    crit_c = _criterion(synthetic)
    resumed_cb = SelectionCallback(crit_c, selection_steps=2)
    resumed = _trainer(tiny_pair, synthetic, tmp_path / "b", [_step_spy(crit_c), resumed_cb],
                       save_strategy="steps", save_steps=4)
    resumed.train(resume_from_checkpoint=True)
    assert sorted(crit_c.seen) == [6, 8]  # steps 0-4 came from the checkpoint, not measured again
    assert resumed_cb.steps == full_cb.steps and resumed_cb.record.index == full_cb.record.index == 2
    assert resumed_cb.original == pytest.approx(full_cb.original)
    for (name, a), (_, b) in zip(full.model.named_parameters(), resumed.model.named_parameters()):
        torch.testing.assert_close(b, a, msg=name)
    torch.testing.assert_close(resumed.model.lm_head.weight, full_criterion.seen[4])


def test_callback_rebuilt_from_state_finds_the_live_criterion(synthetic):
    criterion = _criterion(synthetic)
    live = SelectionCallback(criterion, selection_steps=3, keep="disk")
    rebuilt = SelectionCallback.from_state(live.state())
    assert rebuilt.criterion is criterion and rebuilt.selection_steps == 3 and rebuilt.keep == "disk"
    with pytest.raises(ValueError, match="keep"):
        SelectionCallback(criterion, keep="cloud")


# --------------------------------------------------------------------------------------------- the CLI
def test_cli_select_without_holdout_says_what_is_missing_before_any_work(tiny_pair, tmp_path, capsys, monkeypatch):
    import hf_unlearn.run as registry
    from hf_unlearn.cli import main

    monkeypatch.setattr(registry, "fit_or_train", lambda *a, **k: pytest.fail("training started"))
    out = tmp_path / "out"
    base = ["unlearn", "--method", "grom", "--model", str(tiny_pair.target), "--data", "synthetic", "--output", str(out)]
    for extra, fragment in ((["--select"], "--select needs --holdout SPLIT_OR_FILE"),
                            (["--holdout", "holdout10"], "apply with --select only")):
        code = main(base + extra)
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.startswith("hf-unlearn: error: ") and "\n" not in err and fragment in err, err
        assert not out.exists()


def test_cli_grom_select_saves_the_chosen_edit_and_its_record(tiny_pair, tmp_path, capsys):
    from hf_unlearn.cli import main
    from hf_unlearn.methods.grom import GROMEdit

    out = tmp_path / "grom"
    code = main(["unlearn", "--method", "grom", "--model", str(tiny_pair.target), "--data", "synthetic",
                 "--output", str(out), "--select", "--holdout", "holdout10", "--target_modules", "lm_head"])
    assert code == 0, capsys.readouterr().err
    record = SelectionRecord.load(out)
    assert len(record.candidates) == 9 and {"scale", "retain_weight", "ridge"} <= set(record.chosen)
    edit = GROMEdit.from_pretrained(out)
    assert edit.stats["selection"]["index"] == record.index
    assert edit.config.retain_weight == record.chosen["retain_weight"]
    assert edit.stats["target_scale"] == record.chosen["scale"]


def test_cli_select_for_t3_and_a_trainer(tiny_pair, tmp_path, capsys):
    from hf_unlearn.cli import main

    common = ["--model", str(tiny_pair.target), "--data", "synthetic", "--select", "--holdout", "holdout10"]
    assert main(["unlearn", "--method", "t3", "--output", str(tmp_path / "t3"), *common, "--steps", "30"]) == 0
    config = json.loads((tmp_path / "t3" / "config.json").read_text())
    record = SelectionRecord.load(tmp_path / "t3")
    from hf_unlearn.methods.t3.calibration import DEFAULT_TEMPERATURES, DEFAULT_TILT_WEIGHTS

    grid = len(DEFAULT_TEMPERATURES) * len(DEFAULT_TILT_WEIGHTS)
    assert len(record.candidates) == grid and config["calibration"]["index"] == record.index
    assert (config["temperature"], config["tilt_weight"]) == (record.chosen["temperature"], record.chosen["tilt_weight"])

    assert main(["unlearn", "--method", "grad_ascent", "--output", str(tmp_path / "ga"), *common, "--max_steps", "4",
                 "--selection-steps", "2", "--learning_rate", "1e-3"]) == 0, capsys.readouterr().err
    record = SelectionRecord.load(tmp_path / "ga")
    assert record.candidates == [{"step": 0}, {"step": 2}, {"step": 4}]
    assert record.measurements[0]["retain_change"] == 0.0  # step 0 is the original model


def test_cli_select_takes_author_groups_and_a_reference_model(tiny_pair, tmp_path, capsys):
    """``--groups tofu_authors`` and ``--reference-model`` reach the criterion: the record names both, and each
    measurement's NLL shift is the row NLL minus the reference model's (so it differs from the plain NLL)."""
    from hf_unlearn.cli import main

    out = tmp_path / "grom"
    code = main(["unlearn", "--method", "grom", "--model", str(tiny_pair.target), "--data", "synthetic",
                 "--output", str(out), "--select", "--holdout", "holdout10", "--target_modules", "lm_head",
                 "--groups", "5", "--reference-model", str(tiny_pair.retain)])
    assert code == 0, capsys.readouterr().err
    record = SelectionRecord.load(out)
    assert record.rule["groups"] == "blocks of 5 rows" and record.rule["reference"] == "reference model"
    first = record.measurements[0]
    assert abs(first["forget_shift"] - first["forget_nll"]) > 1e-3


def test_cli_groups_and_reference_need_select(tiny_pair, tmp_path, capsys):
    from hf_unlearn.cli import main

    out = tmp_path / "out"
    base = ["unlearn", "--method", "grom", "--model", str(tiny_pair.target), "--data", "synthetic", "--output", str(out)]
    assert main(base + ["--select", "--holdout", "holdout10", "--groups", "0"]) == 2
    assert "--groups" in capsys.readouterr().err and not out.exists()
    for extra in (["--groups", "tofu_authors"], ["--reference-model", str(tiny_pair.retain)]):
        assert main(base + extra) == 2
        assert "apply with --select only" in capsys.readouterr().err
        assert not out.exists()
