"""T3's head fitted as its authors fit it: every forget row in the fit (only retain rows are held out, and
early stopping reads them alone), and their learning-rate schedule, a 25-epoch linear warm-up then a linear
decay, as a pure function checked against transformers' own."""

from __future__ import annotations

import pytest
import torch

import hf_unlearn.methods.t3.head_training as head_training
from hf_unlearn.demo import load_tiny
from hf_unlearn.methods.t3 import T3ClassifierConfig, fit_t3
from hf_unlearn.methods.t3.head_training import balanced_batches, fit_schedule, warmup_linear_decay


@pytest.fixture(scope="module")
def target(tiny_pair):
    model, tok = load_tiny(tiny_pair.target)
    return model.eval(), tok


def _reference_multipliers(total: int, warmup: int) -> list[float]:
    """transformers' get_linear_schedule_with_warmup on a one-parameter SGD: the lr used by each step."""
    from transformers import get_linear_schedule_with_warmup

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = get_linear_schedule_with_warmup(opt, warmup, total)
    out = []
    for _ in range(total):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("total,warmup", [(300, 62), (10, 0), (7, 7), (5, 9), (1, 0)])
def test_warmup_linear_decay_matches_transformers(total, warmup):
    ours = [warmup_linear_decay(k, total, warmup) for k in range(total)]
    assert ours == pytest.approx(_reference_multipliers(total, warmup), abs=1e-12)


def test_schedule_has_the_authors_shape_at_the_defaults():
    config = T3ClassifierConfig()
    total, warmup = fit_schedule(80, config)  # the v2 forget set: 80 rows in batches of 32
    assert (total, warmup) == (100 * 3, 25 * 80 // 32)  # the authors' warmup_epochs * |forget| // batch
    m = [warmup_linear_decay(k, total, warmup) for k in range(total)]
    assert m[0] == 0.0 and max(m) == m[warmup] == 1.0
    assert all(a < b for a, b in zip(m[:warmup], m[1 : warmup + 1]))  # rising during the warm-up
    assert all(a > b for a, b in zip(m[warmup:-1], m[warmup + 1 :])) and m[-1] == pytest.approx(1 / (total - warmup))
    assert fit_schedule(80, T3ClassifierConfig(steps=50)) == (50, 62)
    assert fit_schedule(80, T3ClassifierConfig(lr_schedule="constant")) == (300, 0)
    with pytest.raises(ValueError, match="lr_schedule"):
        T3ClassifierConfig(lr_schedule="cosine")
    with pytest.raises(ValueError, match="warmup_epochs"):
        T3ClassifierConfig(warmup_epochs=-1.0)


def test_the_fit_steps_at_the_scheduled_learning_rates(target, synthetic, monkeypatch):
    model, tok = target
    used = []
    step = torch.optim.AdamW.step

    def recording(self, *args, **kwargs):
        used.append(self.param_groups[0]["lr"])
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", recording)
    forget, retain = synthetic["forget10"][:10], synthetic["retain90"][:20]
    clf = fit_t3(model, tok, forget, retain, rank=2, epochs=5, forget_batch_size=4, warmup_epochs=1.0,
                 learning_rate=1e-2, progress=False)
    report = clf.fit_report
    assert (report["total_steps"], report["warmup_steps"], report["steps_run"]) == (15, 2, 15)
    assert used == pytest.approx([1e-2 * m for m in _reference_multipliers(15, 2)], rel=1e-12)
    used.clear()
    fit_t3(model, tok, forget, retain, rank=2, epochs=2, forget_batch_size=4, lr_schedule="constant",
           learning_rate=1e-2, progress=False)
    assert used == [1e-2] * 6


def test_every_forget_row_is_fitted_and_only_retain_rows_are_held_out(target, synthetic, monkeypatch):
    model, tok = target
    epochs, heldout_labels = [], []

    def recording(forget_ids, retain_ids, batch_size, gen):
        out = balanced_batches(forget_ids, retain_ids, batch_size, gen)
        epochs.append((list(forget_ids), sorted(i for f, _ in out for i in f)))
        return out

    bce = head_training._heldout_bce

    def recording_bce(clf, z, tokens, y):
        heldout_labels.append(y.clone())
        return bce(clf, z, tokens, y)

    monkeypatch.setattr(head_training, "balanced_batches", recording)
    monkeypatch.setattr(head_training, "_heldout_bce", recording_bce)
    forget, retain = synthetic["forget10"], synthetic["retain90"][:40]
    clf = fit_t3(model, tok, forget, retain, rank=2, epochs=4, forget_batch_size=8, holdout_fraction=0.25,
                 early_stopping_patience=2, progress=False)
    report = clf.fit_report
    everyone = list(range(len(forget)))
    assert epochs and all(ids == everyone and batched == everyone for ids, batched in epochs)
    assert report["fit_forget_examples"] == len(forget) == report["n_forget_examples"]
    assert report["fit_forget_positions"] == report["n_forget_positions"]  # every cached forget position is fitted
    assert report["fit_retain_examples"] == 30 and report["heldout_examples"] == 10
    # the held-out BCE that early stopping reads is measured on retain positions only (label 1)
    assert len(heldout_labels) == report["epochs_run"] and all(bool((y == 1).all()) for y in heldout_labels)
    assert report["heldout_accuracy"] == report["heldout_balanced_accuracy"]
    # without a retain hold-out nothing is measured, and every row of both sets is fitted
    heldout_labels.clear()
    clf = fit_t3(model, tok, forget, retain, rank=2, epochs=2, forget_batch_size=8, holdout_fraction=0.0,
                 progress=False)
    assert clf.fit_report["fit_retain_examples"] == 40 and clf.fit_report["heldout_examples"] == 0
    assert heldout_labels == [] and clf.fit_report["heldout_bce_per_epoch"] == []
