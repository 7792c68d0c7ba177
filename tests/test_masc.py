"""MASC: restricted margin and hinge vs slow references, the tau <-> rho relation, the trainer's
online stopping rule on the tiny memorizing model, the KL term at step 0, and bad input."""

from __future__ import annotations

import math

import pytest
import torch

from hf_unlearn.losses import (
    margin_hinge_loss,
    masc_probability_from_threshold,
    masc_threshold_from_probability,
    restricted_margin,
    violation_rate,
)


def _slow_margin(logits, labels, top_k, beta):
    """Per-position loop: sort the non-target logits, take the k largest, logsumexp."""
    B, L, V = logits.shape
    out = torch.zeros(B, L, dtype=torch.float64)
    mask = torch.zeros(B, L, dtype=torch.bool)
    for b in range(B):
        for t in range(1, L):
            y = int(labels[b, t])
            if y == -100:
                continue
            z = logits[b, t - 1].double() * beta
            others = [float(z[v]) for v in range(V) if v != y]
            top = sorted(others, reverse=True)[:top_k]
            lse = math.log(sum(math.exp(x) for x in top))
            out[b, t] = float(z[y]) - lse
            mask[b, t] = True
    return out, mask


def _random_batch(seed=0, B=3, L=7, V=11):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, L, V, generator=g) * 3
    labels = torch.randint(0, V, (B, L), generator=g)
    labels[0, :3] = -100  # prompt
    labels[2, -2:] = -100  # padding
    return logits, labels


@pytest.mark.parametrize("top_k,beta", [(1, 1.0), (3, 0.5), (10, 2.0)])
def test_restricted_margin_matches_slow_loop(top_k, beta):
    logits, labels = _random_batch()
    margins, mask = restricted_margin(logits, labels, top_k=top_k, beta=beta)
    ref, ref_mask = _slow_margin(logits, labels, top_k, beta)
    assert torch.equal(mask, ref_mask)
    torch.testing.assert_close(margins.double(), ref, atol=1e-5, rtol=1e-5)


def test_margin_is_restricted_log_odds_and_tau_rho_relation():
    logits, labels = _random_batch(seed=1)
    margins, mask = restricted_margin(logits, labels, top_k=4, beta=1.0)
    # restricted probability of the target among {y} U S_k, recomputed from the slow margin's definition
    p = torch.sigmoid(margins)
    for rho in (0.1, 0.5, 0.9):
        tau = masc_threshold_from_probability(rho)
        assert tau == pytest.approx(math.log(rho / (1 - rho)))
        assert masc_probability_from_threshold(tau) == pytest.approx(rho)
        assert torch.equal((margins > tau) & mask, (p > rho) & mask)
    with pytest.raises(ValueError, match="rho"):
        masc_threshold_from_probability(1.0)


def test_hinge_zero_gradient_below_threshold():
    logits, labels = _random_batch(seed=2)
    logits = logits.requires_grad_(True)
    tau = 0.0
    margins, mask = restricted_margin(logits, labels, top_k=3, beta=1.0)
    loss = margin_hinge_loss(margins, mask, tau)
    loss.backward()
    active = (margins.detach() > tau) & mask
    assert active.any() and (~active & mask).any()
    # logits at step t-1 predict label t: a corrected (or unlabeled) position gets no gradient
    grad_rows = logits.grad[:, :-1, :].abs().sum(-1)
    assert torch.all(grad_rows[~active[:, 1:]] == 0)
    assert torch.all(grad_rows[active[:, 1:]] > 0)
    # value: mean over answer positions of relu(m - tau)
    ref = sum(max(0.0, float(m) - tau) for m in margins.detach()[mask]) / int(mask.sum())
    assert float(loss.detach()) == pytest.approx(ref, rel=1e-5)
    # gradient only reaches the target and its k rivals
    b, t = active.nonzero()[0].tolist()
    assert int((logits.grad[b, t - 1] != 0).sum()) == 4


def test_violation_rate():
    margins = torch.tensor([[0.0, 2.0, -1.0, 0.5], [0.0, 3.0, 0.2, 9.0]])
    mask = torch.tensor([[False, True, True, True], [False, True, True, False]])
    assert violation_rate(margins, mask, tau=0.3) == pytest.approx(3 / 5)
    with pytest.raises(ValueError, match="at least one"):
        violation_rate(margins, torch.zeros_like(mask), 0.0)


def test_margin_bad_top_k():
    logits, labels = _random_batch(V=11)
    for k in (0, 11):
        with pytest.raises(ValueError, match="top_k"):
            restricted_margin(logits, labels, top_k=k)


# ---------------------------------------------------------------------------------------------------------------
# Trainer
# ---------------------------------------------------------------------------------------------------------------

# Hyperparameters that make the tiny memorizing model stop by the rule within a few steps.
TINY_MASC = dict(
    learning_rate=1e-3, per_device_train_batch_size=4, top_k=10, margin_threshold=0.0, stop_tolerance=0.3,
    kl_weight=1.0, validation_fraction=0.1, check_every=2, max_steps=40,
)


def _config(tmp_path, **overrides):
    from hf_unlearn.trainers import MASCConfig

    kwargs = dict(
        output_dir=str(tmp_path / "masc"), report_to="none", save_strategy="no", gradient_checkpointing=False,
        disable_tqdm=True, logging_steps=2, seed=0,
    )
    kwargs.update(TINY_MASC)
    kwargs.update(overrides)
    return MASCConfig(**kwargs)


def _independent_violation_rate(model, tokenizer, rows, top_k, tau):
    """Recompute the held-out violation rate from scratch: tokenize_qa + a plain forward + the slow margin loop."""
    from hf_unlearn.data import tokenize_qa

    model.eval()
    violations = positions = 0
    with torch.no_grad():
        for row in rows:
            feats = tokenize_qa(tokenizer, row["question"], row["answer"])
            ids = torch.tensor([feats["input_ids"]])
            labels = torch.tensor([feats["labels"]])
            logits = model(input_ids=ids).logits
            margins, mask = _slow_margin(logits, labels, top_k, 1.0)
            violations += int(((margins > tau) & mask).sum())
            positions += int(mask.sum())
    return violations / positions, positions


def test_masc_stops_by_rule_on_tiny_model(tiny_target, synthetic, tmp_path):
    import json

    from hf_unlearn.trainers.masc_trainer import STOPPING_FILE

    from hf_unlearn.trainers import MASCTrainer

    model, tok = tiny_target
    forget, retain = synthetic["forget10"], synthetic["retain90"]
    args = _config(tmp_path)
    trainer = MASCTrainer(model, args, train_dataset=forget, retain_dataset=retain, processing_class=tok)
    # the held-out slice is excluded from training
    held_q = {r["prompt"] for r in trainer.validation_dataset}
    train_q = {r["prompt"] for r in trainer.forget_dataset}
    assert len(held_q) == 2 and len(train_q) == 18 and not held_q & train_q
    held_rows = [r for r in forget if any(p.startswith(f"Question: {r['question']}") for p in held_q)]
    assert len(held_rows) == 2

    rate0, n = _independent_violation_rate(model, tok, held_rows, args.top_k, args.tau)
    assert rate0 > 0.8  # the target still knows the held-out answers
    model.train()
    trainer.train()

    step = trainer.stopped_at_step
    assert step is not None and step < args.max_steps and step % args.check_every == 0
    assert trainer.state.global_step == step
    history = trainer.violation_history
    assert [h["step"] for h in history] == list(range(0, step + 1, args.check_every))
    assert all(h["violation_rate"] > args.stop_tolerance for h in history[:-1])
    assert history[0]["violation_rate"] == pytest.approx(rate0) and history[-1]["positions"] == n
    # the rule held at the stop, recomputed independently from the model
    rate, _ = _independent_violation_rate(model, tok, held_rows, args.top_k, args.tau)
    assert rate <= args.stop_tolerance
    assert rate == pytest.approx(history[-1]["violation_rate"])
    logged = [e for e in trainer.state.log_history if "masc/violation_rate" in e]
    assert logged[-1]["masc/stopped_at_step"] == step

    trainer.save_model(str(tmp_path / "saved"))
    saved = json.loads((tmp_path / "saved" / STOPPING_FILE).read_text())
    assert (tmp_path / "saved" / "model.safetensors").is_file()
    assert saved["stopped_at_step"] == step and saved["stopped_by_rule"] and not saved["budget_exhausted"]
    assert saved["rule"]["alpha"] == args.stop_tolerance and saved["rule"]["top_k"] == args.top_k
    assert len(saved["violation_history"]) == len(history)


def test_masc_budget_guard_warns(tiny_target, synthetic, tmp_path):
    from hf_unlearn.trainers import MASCTrainer

    model, tok = tiny_target
    args = _config(tmp_path, learning_rate=1e-7, max_steps=1, check_every=1, stop_tolerance=0.05)
    trainer = MASCTrainer(model, args, train_dataset=synthetic["forget10"], retain_dataset=synthetic["retain90"],
                          processing_class=tok)
    with pytest.warns(UserWarning, match="step budget"):
        trainer.train()
    assert trainer.stopped_at_step is None and trainer.stopping_callback.budget_exhausted
    assert trainer.state.global_step == 1 and len(trainer.violation_history) == 2


def test_masc_kl_zero_at_step_zero(tiny_target, synthetic, tmp_path):
    from hf_unlearn.losses import margin_hinge_loss, restricted_margin
    from hf_unlearn.trainers import MASCTrainer

    model, tok = tiny_target
    args = _config(tmp_path)
    trainer = MASCTrainer(model, args, train_dataset=synthetic["forget10"], retain_dataset=synthetic["retain90"],
                          processing_class=tok)
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    assert "retain_input_ids" in batch
    model.train()
    loss = trainer.compute_loss(model, batch)
    kl = trainer._unlearning_metrics["train"]["retain_kl"][-1]
    assert abs(float(kl)) < 1e-6
    margins, mask = restricted_margin(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                                      batch["labels"], args.top_k)
    assert float(loss.detach()) == pytest.approx(float(margin_hinge_loss(margins, mask, args.tau).detach()), rel=1e-4)
    assert float(loss.detach()) > 0


def test_masc_config_threshold_forms():
    from hf_unlearn.trainers import MASCConfig

    base = dict(output_dir="unused", report_to="none")
    assert MASCConfig(**base).tau == 0.0
    cfg = MASCConfig(**base, margin_probability=0.8)
    assert cfg.tau == pytest.approx(math.log(4.0)) and cfg.rho == pytest.approx(0.8)
    assert MASCConfig(**base, margin_threshold=-1.0).rho == pytest.approx(1 / (1 + math.e))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(top_k=0), "top_k"),
        (dict(stop_tolerance=0.0), r"stop_tolerance \(alpha\)"),
        (dict(stop_tolerance=1.0), r"stop_tolerance \(alpha\)"),
        (dict(stop_tolerance=-0.1), r"stop_tolerance \(alpha\)"),
        (dict(margin_threshold=0.0, margin_probability=0.5), "not both"),
        (dict(margin_probability=1.5), "rho"),
        (dict(validation_fraction=0.0), "validation_fraction"),
        (dict(check_every=0), "check_every"),
    ],
)
def test_masc_config_bad_input(kwargs, match):
    from hf_unlearn.trainers import MASCConfig

    with pytest.raises(ValueError, match=match):
        MASCConfig(output_dir="unused", report_to="none", **kwargs)


def test_masc_trainer_bad_input(tiny_target, synthetic, tmp_path):
    from hf_unlearn.trainers import MASCTrainer

    model, tok = tiny_target
    forget, retain = synthetic["forget10"], synthetic["retain90"]
    vocab = model.get_output_embeddings().weight.shape[0]
    with pytest.raises(ValueError, match=f"top_k={vocab}.*at most vocab_size - 1 = {vocab - 1}"):
        MASCTrainer(model, _config(tmp_path, top_k=vocab), train_dataset=forget, retain_dataset=retain,
                    processing_class=tok)
    # one held-out example has ~14 answer positions: too few for alpha = 0.01 (needs 100)
    with pytest.raises(ValueError, match=r"has \d+ answer positions; the stopping rule needs at least 100"):
        MASCTrainer(model, _config(tmp_path, stop_tolerance=0.01, validation_fraction=0.05), train_dataset=forget,
                    retain_dataset=retain, processing_class=tok)
    with pytest.raises(ValueError, match="at least 2"):
        MASCTrainer(model, _config(tmp_path), train_dataset=forget[:1], retain_dataset=retain, processing_class=tok)
