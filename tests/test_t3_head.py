"""The T3 head as its authors train it: no per-token bias, PyTorch's default initialisation of U, class-balanced
batches, early stopping on the held-out BCE, the optional floor on log f, and the greedy equivalence of (T, w)
and (1, T w)."""

from __future__ import annotations

import math

import pytest
import torch
from test_t3 import left_pad, prompt_ids, qa_batch, random_head
from transformers import LogitsProcessorList

import hf_unlearn.methods.t3.head_training as head_training
from hf_unlearn.demo import load_tiny
from hf_unlearn.logprobs import label_log_probs
from hf_unlearn.methods.t3 import T3Classifier, T3ClassifierConfig, T3LogitsProcessor, fit_t3, t3_log_probs
from hf_unlearn.methods.t3.head_training import balanced_batches
from hf_unlearn.methods.t3.tilt import tilted_scores


@pytest.fixture(scope="module")
def target(tiny_pair):
    model, tok = load_tiny(tiny_pair.target)
    return model.eval(), tok


def test_defaults_are_the_authors():
    config = T3ClassifierConfig()
    assert (config.temperature, config.tilt_weight, config.log_f_floor) == (1.0, 1.0, None)
    assert (config.rank, config.layer, config.epochs, config.forget_batch_size) == (20, -1, 100, 32)
    assert (config.lr_schedule, config.warmup_epochs, config.early_stopping_patience) == ("linear", 25.0, None)


def test_head_has_no_per_token_bias_and_u_starts_at_the_default_initialisation(target, synthetic):
    model, tok = target
    clf = T3Classifier(T3ClassifierConfig(rank=8).for_base(model))
    assert clf.up.bias is None
    assert set(clf.state_dict()) == {"down.weight", "down.bias", "up.weight"}
    # A fit of one step at a negligible learning rate leaves U at its initialisation (the fold only changes D
    # and c): nn.Linear's default, U(-1/sqrt(rank), 1/sqrt(rank)), not zero.
    fitted = fit_t3(model, tok, synthetic["forget10"][:6], synthetic["retain90"][:12], rank=8, steps=1,
                    learning_rate=1e-12, weight_decay=0.0, progress=False)
    u = fitted.up.weight
    bound = 1 / math.sqrt(8)
    assert float(u.abs().max()) <= bound and float(u.abs().min()) < 0.1 * bound
    assert u.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.1)  # std of U(-a, a) is a / sqrt(3)
    assert fitted.fit_report["steps_run"] == 1
    # the fit's initialisation follows its seed
    again = fit_t3(model, tok, synthetic["forget10"][:6], synthetic["retain90"][:12], rank=8, steps=1,
                   learning_rate=1e-12, weight_decay=0.0, progress=False)
    assert torch.equal(again.up.weight, u)  # same seed, same process: bit-identical
    other = fit_t3(model, tok, synthetic["forget10"][:6], synthetic["retain90"][:12], rank=8, steps=1,
                   learning_rate=1e-12, weight_decay=0.0, seed=1, progress=False)
    assert not torch.allclose(other.up.weight, u)


def test_balanced_batches_have_equal_forget_and_retain_counts():
    gen = torch.Generator().manual_seed(0)
    forget, retain = list(range(70)), list(range(100, 300))
    batches = balanced_batches(forget, retain, 32, gen)
    assert [len(f) for f, _ in batches] == [32, 32, 6]
    assert all(len(f) == len(r) for f, r in batches)
    assert sorted(i for f, _ in batches for i in f) == forget  # an epoch is one pass over the forget examples
    assert all(len(set(r)) == len(r) and set(r) <= set(retain) for _, r in batches)
    # fewer retain than forget examples in a batch: drawn with replacement, still as many
    small = balanced_batches(forget[:10], [500, 501, 502], 32, gen)
    assert [(len(f), len(r)) for f, r in small] == [(10, 10)] and set(small[0][1]) <= {500, 501, 502}


def test_fit_trains_on_balanced_batches_of_whole_examples(target, synthetic, monkeypatch):
    model, tok = target
    seen = []

    def recording(forget_ids, retain_ids, batch_size, gen):
        out = balanced_batches(forget_ids, retain_ids, batch_size, gen)
        seen.append((list(forget_ids), list(retain_ids), out))
        return out

    monkeypatch.setattr(head_training, "balanced_batches", recording)
    forget, retain = synthetic["forget10"][:10], synthetic["retain90"][:40]
    clf = fit_t3(model, tok, forget, retain, rank=2, epochs=3, forget_batch_size=4, holdout_fraction=0.2,
                 early_stopping_patience=None, progress=False)
    assert len(seen) == 3 == clf.fit_report["epochs_run"]
    for forget_train, retain_train, batches in seen:
        assert forget_train == list(range(10)) and len(retain_train) == 32  # every forget row; 20% of retain held out
        assert all(i >= 10 for i in retain_train)
        assert [len(f) for f, _ in batches] == [4, 4, 2] and all(len(f) == len(r) for f, r in batches)
    assert clf.fit_report["steps_run"] == 9


def _synthetic_cache(seed: int = 0):
    """16 training examples (8 forget, 8 retain) of 5 positions each, and 4 held-out examples that copy training
    positions with the opposite label: the better the head fits, the worse its held-out BCE."""
    gen = torch.Generator().manual_seed(seed)
    x_train = torch.randn(80, 8, generator=gen)
    tokens_train = torch.randint(0, 16, (80,), generator=gen)
    y_train = torch.cat([torch.zeros(40), torch.ones(40)])
    pick = torch.cat([torch.arange(40, 50), torch.arange(0, 10)])  # retain positions relabelled forget, and back
    x = torch.cat([x_train, x_train[pick]])
    tokens = torch.cat([tokens_train, tokens_train[pick]])
    y = torch.cat([y_train, torch.zeros(10), torch.ones(10)])
    owners = torch.arange(100) // 5  # examples 0-7 forget, 8-15 retain, 16-17 held-out forget, 18-19 held-out retain
    return x, tokens, y, owners


def test_early_stopping_stops_when_the_heldout_bce_rises():
    x, tokens, y, owners = _synthetic_cache()
    held = owners >= 16

    def train(**settings):
        config = T3ClassifierConfig(hidden_size=8, vocab_size=16, rank=4, epochs=60, forget_batch_size=4,
                                    learning_rate=5e-2, weight_decay=0.0, lr_schedule="constant", **settings)
        clf = T3Classifier(config)
        record = head_training._train_head(clf, x, tokens, y, owners, list(range(8)), list(range(8, 16)), held, config,
                                    progress=False)
        return clf, record

    clf, record = train(early_stopping_patience=3)
    history = record["heldout_bce_per_epoch"]
    best = record["best_epoch"]
    assert record["stopped_early"] and record["epochs_run"] == best + 3 < 60
    assert len(history) == record["epochs_run"] and history[best - 1] == min(history)
    assert all(h > history[best - 1] for h in history[best:])  # it rose after the best epoch
    # The returned head is the best epoch's (standardisation folded in, so compare with a tolerance).
    with torch.no_grad():
        logits = clf.token_logits(x[held], tokens[held])
    bce = 0.5 * sum(torch.nn.functional.binary_cross_entropy_with_logits(logits[y[held] == c], y[held][y[held] == c])
                    for c in (0.0, 1.0))
    assert float(bce) == pytest.approx(history[best - 1], rel=1e-4)
    # Without early stopping every epoch runs, and the held-out BCE keeps rising past the best epoch.
    _, full = train(early_stopping_patience=None)
    assert full["epochs_run"] == 60 and not full["stopped_early"]
    assert full["heldout_bce_per_epoch"][:len(history)] == pytest.approx(history, rel=1e-6)
    assert full["heldout_bce_per_epoch"][-1] > history[-1]


def test_log_f_floor_bounds_the_tilt(target, synthetic):
    torch.manual_seed(0)
    logits, g = torch.randn(3, 11) * 4, torch.randn(3, 11) * 6
    ref = torch.log_softmax(logits, -1) / 1.5 + 2.0 * torch.nn.functional.logsigmoid(g).clamp_min(-0.5)
    torch.testing.assert_close(tilted_scores(logits, g, 1.5, 2.0, log_f_floor=-0.5), ref)
    assert not torch.allclose(tilted_scores(logits, g, 1.5, 2.0), ref)
    # On the model: a floor just below 0 flattens log f to a constant, which the softmax removes: the base again.
    model, tok = target
    _, batch = qa_batch(tok, synthetic["forget10"][:3])
    args = (batch["input_ids"], batch["labels"], batch["attention_mask"], batch["position_ids"])
    with torch.no_grad():
        base = label_log_probs(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                     position_ids=batch["position_ids"]).logits, batch["labels"])
    tilted = t3_log_probs(model, random_head(model), *args, tilt_weight=3.0)
    floored = t3_log_probs(model, random_head(model, log_f_floor=-1e-7), *args, tilt_weight=3.0)
    assert (tilted - base).abs().max() > 0.5
    torch.testing.assert_close(floored, base, rtol=0, atol=1e-4)  # float32 log-softmax of shifted scores


def test_greedy_depends_on_t_times_w_only(target, synthetic):
    torch.manual_seed(1)
    logits, g = torch.randn(4, 11) * 4, torch.randn(4, 11) * 3
    # s(T, w) * T = s(1, T w): the same ordering, the same argmax
    torch.testing.assert_close(tilted_scores(logits, g, 2.0, 0.5) * 2.0, tilted_scores(logits, g, 1.0, 1.0))
    model, tok = target
    clf = random_head(model, seed=4)
    enc = left_pad(prompt_ids(tok, [r["question"] for r in synthetic["forget10"][:4]]), tok.pad_token_id)
    kw = dict(max_new_tokens=10, do_sample=False, pad_token_id=tok.pad_token_id)
    outs = []
    for temperature, weight in [(2.0, 0.5), (1.0, 1.0)]:
        with T3LogitsProcessor(model, clf, temperature=temperature, tilt_weight=weight) as t3:
            outs.append(model.generate(**enc, **kw, logits_processor=LogitsProcessorList([t3])))
    assert torch.equal(outs[0], outs[1])
    # ... but T changes the teacher-forced scores
    _, batch = qa_batch(tok, synthetic["forget10"][:2])
    args = (batch["input_ids"], batch["labels"], batch["attention_mask"], batch["position_ids"])
    a = t3_log_probs(model, clf, *args, temperature=2.0, tilt_weight=0.5)
    b = t3_log_probs(model, clf, *args, temperature=1.0, tilt_weight=1.0)
    assert (a - b).abs().max() > 0.1
