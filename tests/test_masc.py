"""MASC: restricted margin, hinges, continuation mask, per-example violation rates and the Hoeffding bound against
slow references; the two-stage stopping rule (stops at the first confirmed check, never stops when the probe
never clears), the held-out variant, resume of the rule's state, and bad input."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from hf_unlearn.methods.masc.loss import (
    buffered_hinge_loss,
    continuation_mask,
    hoeffding_upper_bound,
    margin_hinge_loss,
    masc_probability_from_threshold,
    per_example_violation_rates,
    restricted_margin,
    sample_cut_ratios,
    violation_rate_tensor,
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


def test_restricted_margin_rivals_exclude_the_target_wherever_it_ranks():
    # position 0 predicts a target that is the argmax; position 1 one ranked last (outside the k + 1 best)
    logits = torch.tensor([[[5.0, 4.0, 3.0, 2.0, 1.0], [5.0, 4.0, 3.0, 2.0, -9.0], [0.0] * 5]])
    labels = torch.tensor([[-100, 0, 4]])
    margins, mask = restricted_margin(logits, labels, top_k=2)
    assert margins[0, 1].item() == pytest.approx(5.0 - math.log(math.exp(4.0) + math.exp(3.0)))
    assert margins[0, 2].item() == pytest.approx(-9.0 - math.log(math.exp(5.0) + math.exp(4.0)))
    # a batch without answer positions gives zero margins and an empty mask
    empty, empty_mask = restricted_margin(logits, torch.full((1, 3), -100), top_k=2)
    assert not empty_mask.any() and torch.equal(empty, torch.zeros(1, 3))


def test_margin_is_restricted_log_odds_and_tau_rho_relation():
    logits, labels = _random_batch(seed=1)
    margins, mask = restricted_margin(logits, labels, top_k=4, beta=1.0)
    p = torch.sigmoid(margins)
    for rho in (0.1, 0.5, 0.7, 0.9):
        tau = math.log(rho / (1 - rho))
        assert masc_probability_from_threshold(tau) == pytest.approx(rho)
        # sigmoid's float32 rounding (vectorised differently per CPU) may flip a margin within 1e-5 of tau
        clear = (margins - tau).abs() > 1e-5
        assert torch.equal(((margins > tau) & mask)[clear], ((p > rho) & mask)[clear])


def test_plain_hinge_zero_gradient_below_threshold():
    logits, labels = _random_batch(seed=2)
    logits = logits.requires_grad_(True)
    tau = 0.0
    margins, mask = restricted_margin(logits, labels, top_k=3, beta=1.0)
    loss = margin_hinge_loss(margins, mask, tau)
    loss.backward()
    active = (margins.detach() > tau) & mask
    assert active.any() and (~active & mask).any()
    grad_rows = logits.grad[:, :-1, :].abs().sum(-1)
    assert torch.all(grad_rows[~active[:, 1:]] == 0)
    assert torch.all(grad_rows[active[:, 1:]] > 0)
    ref = sum(max(0.0, float(m) - tau) for m in margins.detach()[mask]) / int(mask.sum())
    assert float(loss.detach()) == pytest.approx(ref, rel=1e-5)
    b, t = active.nonzero()[0].tolist()
    assert int((logits.grad[b, t - 1] != 0).sum()) == 4  # the target and its k = 3 rivals


@pytest.mark.parametrize("tau,eta", [(math.log(0.7 / 0.3), 0.25), (0.0, 1.0), (1.5, 0.1)])
def test_buffered_hinge_matches_slow_reference(tau, eta):
    gen = torch.Generator().manual_seed(3)
    margins = (torch.randn(4, 9, generator=gen, dtype=torch.float64) * 2).requires_grad_(True)
    mask = torch.rand(4, 9, generator=gen) > 0.3
    loss = buffered_hinge_loss(margins, mask, tau, eta)
    m0 = margins.detach()
    terms = [max(0.0, float(m0[b, t]) - (tau - eta)) / eta for b in range(4) for t in range(9) if mask[b, t]]
    assert loss.item() == pytest.approx(sum(terms) / len(terms), rel=1e-12)
    # averaged over active tokens, and an explicit count divides the sum instead
    assert buffered_hinge_loss(margins, mask, tau, eta, num_tokens=50).item() == pytest.approx(sum(terms) / 50)
    loss.backward()
    # gradient 1/(eta |A|) exactly where the buffered margin is exceeded, 0 elsewhere (and off the mask)
    expected = ((margins.detach() > tau - eta) & mask).double() / (eta * int(mask.sum()))
    torch.testing.assert_close(margins.grad, expected)
    # the surrogate upper-bounds the violation indicator: >= 1 wherever m > tau
    m = margins.detach()
    surrogate = torch.relu(m - (tau - eta)) / eta
    assert bool((surrogate[(m > tau)] >= 1).all())
    with pytest.raises(ValueError, match="eta"):
        buffered_hinge_loss(m, mask, tau, 0.0)


def _slow_continuation(mask, ratios, min_prefix, min_suffix):
    """The authors' loop: keep answer positions from the cut on (whole answer when too short)."""
    out = torch.zeros_like(mask)
    for b in range(mask.shape[0]):
        positions = [t for t in range(mask.shape[1]) if mask[b, t]]
        n = len(positions)
        if n == 0:
            continue
        if n < min_prefix + min_suffix:
            keep = positions
        else:
            cut = int(math.floor(float(ratios[b]) * n))
            cut = max(min_prefix, min(cut, n - min_suffix))
            keep = positions[cut:]
        for t in keep:
            out[b, t] = True
    return out


@pytest.mark.parametrize("min_prefix,min_suffix", [(0, 0), (2, 3), (4, 4), (32, 32)])
def test_continuation_mask_matches_slow_reference(min_prefix, min_suffix):
    gen = torch.Generator().manual_seed(4)
    rng = random.Random(0)
    for _ in range(5):
        B, L = 6, 40
        mask = torch.zeros(B, L, dtype=torch.bool)
        for b in range(B):  # a prompt, an answer of random length, padding; one row empty
            start, n = rng.randint(1, 8), (0 if b == 0 else rng.randint(1, 30))
            mask[b, start : start + n] = True
        ratios = sample_cut_ratios(B, 0.2, 0.6, gen)
        assert bool(((ratios >= 0.2) & (ratios <= 0.6)).all())
        fast = continuation_mask(mask, ratios, min_prefix, min_suffix)
        assert torch.equal(fast, _slow_continuation(mask, ratios, min_prefix, min_suffix))
        assert bool((fast <= mask).all())
    # a fixed case by hand: 10 answer tokens at 2..11, ratio 0.45 -> cut 4 -> positions 6..11 kept
    mask = torch.zeros(1, 14, dtype=torch.bool)
    mask[0, 2:12] = True
    kept = continuation_mask(mask, torch.tensor([0.45]), 2, 2)
    assert kept[0].nonzero().flatten().tolist() == list(range(6, 12))
    # the minimum prefix wins over a small ratio, the minimum suffix over a large one
    assert continuation_mask(mask, torch.tensor([0.0]), 3, 2)[0].nonzero().flatten().tolist() == list(range(5, 12))
    assert continuation_mask(mask, torch.tensor([1.0]), 3, 4)[0].nonzero().flatten().tolist() == list(range(8, 12))


def test_per_example_violation_rates_match_loop():
    gen = torch.Generator().manual_seed(5)
    margins = torch.randn(5, 8, generator=gen)
    mask = torch.rand(5, 8, generator=gen) > 0.4
    mask[3] = False  # no active position: counts as 0, as in the authors' probe
    tau = 0.3
    rates = per_example_violation_rates(margins, mask, tau)
    for b in range(5):
        active = [float(margins[b, t]) for t in range(8) if mask[b, t]]
        expected = sum(m > tau for m in active) / len(active) if active else 0.0
        assert rates[b].item() == pytest.approx(expected)
    # the per-example mean differs from the pooled token rate when lengths differ
    margins2 = torch.tensor([[2.0, 2.0, 2.0, -1.0], [-1.0, 0.0, 0.0, 0.0]])
    mask2 = torch.tensor([[True, True, True, True], [True, False, False, False]])
    assert per_example_violation_rates(margins2, mask2, 0.0).mean().item() == pytest.approx((0.75 + 0.0) / 2)
    assert violation_rate_tensor(margins2, mask2, 0.0).item() == pytest.approx(3 / 5)


@pytest.mark.parametrize("mean,n,delta,j", [(0.1, 32, 0.05, 1), (0.3, 10, 0.05, 4), (0.0, 100, 0.01, 17)])
def test_hoeffding_bound_equals_formula(mean, n, delta, j):
    bound, delta_j = hoeffding_upper_bound(mean, n, delta, j)
    assert delta_j == pytest.approx(6 * delta / (math.pi**2 * (j + 1) ** 2))
    assert bound == pytest.approx(mean + math.sqrt(math.log(1 / delta_j) / (2 * n)))
    # the failure probabilities over all checks add up to less than delta
    assert sum(6 * delta / (math.pi**2 * (k + 1) ** 2) for k in range(1, 10_000)) < delta
    for bad in (dict(n=0), dict(check_index=0), dict(delta=1.0)):
        kwargs = dict(mean=mean, n=n, delta=delta, check_index=j) | bad
        with pytest.raises(ValueError):
            hoeffding_upper_bound(**kwargs)


def test_margin_bad_top_k():
    logits, labels = _random_batch(V=11)
    for k in (0, 11):
        with pytest.raises(ValueError, match="top_k"):
            restricted_margin(logits, labels, top_k=k)


# ---------------------------------------------------------------------------------------------------------------
# Trainer
# ---------------------------------------------------------------------------------------------------------------

# Fast settings on the tiny memorizing model: the authors' rule (two stages, continuation; the Llama-2-7B
# recipe's thresholds) with a step size that lets the tiny model forget within a few dozen steps; full
# fine-tuning keeps the tests quick.
TINY_MASC = dict(
    recipe="llama2-7b", learning_rate=1e-3, per_device_train_batch_size=4, use_peft=False, forget_weight=1.0,
    continuation_min_prefix_tokens=4, continuation_min_suffix_tokens=4, check_every=2, max_steps=40,
    retain_weight=0.0, confirm_rule="hoeffding",
)


def _config(tmp_path, **overrides):
    from hf_unlearn.methods.masc import MASCConfig

    kwargs = dict(
        output_dir=str(tmp_path / "masc"), report_to="none", save_strategy="no", gradient_checkpointing=False,
        disable_tqdm=True, logging_steps=2, seed=0,
    )
    kwargs.update(TINY_MASC)
    kwargs.update(overrides)
    return MASCConfig(**kwargs)


def _trainer(tiny_target, synthetic, tmp_path, **overrides):
    from hf_unlearn.methods.masc import MASCTrainer

    model, tok = tiny_target
    return MASCTrainer(model, _config(tmp_path, **overrides), train_dataset=synthetic["forget10"], processing_class=tok)


def _slow_probe_rates(trainer, model, rows, stage, step):
    """Recompute a probe from scratch: tokenize_qa + one forward per example + slow margin + slow continuation,
    with the same seeded cut ratios the trainer draws (one ratio per example, batch by batch)."""
    from hf_unlearn.data import tokenize_qa
    from hf_unlearn.methods.masc.trainer import _seeded

    args = trainer.args
    gen = _seeded(args.seed, step, {"trigger": 1, "confirm": 2}[stage])
    bs = args.per_device_train_batch_size if stage == "trigger" else args.per_device_eval_batch_size
    rates = []
    model.eval()
    with torch.no_grad():
        for start in range(0, len(rows), bs):
            chunk = rows[start : start + bs]
            ratios = sample_cut_ratios(len(chunk), args.continuation_cut_min_ratio, args.continuation_cut_max_ratio, gen)
            for row, ratio in zip(chunk, ratios):
                feats = tokenize_qa(trainer.processing_class, row["question"], row["answer"])
                labels = torch.tensor([feats["labels"]])
                logits = model(input_ids=torch.tensor([feats["input_ids"]])).logits
                margins, mask = _slow_margin(logits, labels, args.top_k, args.margin_beta)
                active = _slow_continuation(mask, ratio.reshape(1), args.continuation_min_prefix_tokens,
                                            args.continuation_min_suffix_tokens)
                values = [float(m) for m in margins[active]]
                rates.append(sum(v > args.tau for v in values) / len(values))
    return rates


def test_masc_defaults_are_the_authors_recipe(tmp_path):
    from hf_unlearn.methods.masc import MASCConfig

    cfg = MASCConfig(output_dir=str(tmp_path), report_to="none", recipe="llama2-7b")
    assert (cfg.forget_weight, cfg.margin_probability, cfg.buffer_eta, cfg.top_k, cfg.margin_beta) == (0.05, 0.7, 0.25, 10, 1.0)
    assert (cfg.stop_trigger, cfg.stop_tolerance, cfg.confirm_examples, cfg.confirm_delta) == (0.475, 0.475, 32, 0.05)
    assert (cfg.check_every, cfg.stop_probe_batches, cfg.learning_rate, cfg.num_train_epochs) == (2, 2, 1e-4, 3.0)
    assert (cfg.per_device_train_batch_size, cfg.penalty, cfg.hinge) == (2, "continuation", "buffered")
    # the authors' constant learning rate and plain-mean confirmation; their Llama run's lambda_retain 0; a ceiling
    assert str(cfg.lr_scheduler_type) in ("constant", "SchedulerType.CONSTANT") and cfg.confirm_rule == "mean"
    assert (cfg.retain_weight, cfg.max_steps, cfg.epoch_length) == (0.0, 5400, "forget")
    assert cfg.tau == pytest.approx(math.log(0.7 / 0.3))
    lora = cfg.get_peft_config()
    assert (lora.r, lora.lora_alpha, lora.lora_dropout) == (16, 32, 0.05)
    assert set(lora.target_modules) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert MASCConfig(output_dir=str(tmp_path), report_to="none", use_peft=False).get_peft_config() is None
    assert MASCConfig(output_dir=str(tmp_path), report_to="none", margin_threshold=-1.0).rho == pytest.approx(1 / (1 + math.e))
    for name in ("kl_weight", "gamma_unused"):
        assert not hasattr(cfg, name)


def test_masc_probe_matches_slow_recomputation(tiny_target, synthetic, tmp_path):
    trainer = _trainer(tiny_target, synthetic, tmp_path)
    rows = list(synthetic["forget10"])
    for stage, n in (("trigger", 2 * 4), ("confirm", len(rows))):
        fast = trainer.probe(trainer.model, stage, 6)
        slow = _slow_probe_rates(trainer, trainer.model, rows[:n], stage, 6)
        assert len(fast) == n
        assert fast == pytest.approx(slow, abs=1e-9)
    assert sum(trainer.probe(trainer.model, "trigger", 0)) / 8 > 0.8  # the target still knows the answers


@pytest.mark.parametrize("confirm_rule", ["hoeffding", "mean"])
def test_masc_stops_at_first_confirmed_check(tiny_target, synthetic, tmp_path, confirm_rule):
    from hf_unlearn.methods.masc.stopping import STOPPING_FILE

    trainer = _trainer(tiny_target, synthetic, tmp_path, confirm_rule=confirm_rule)
    trainer.train()
    args = trainer.args
    step = trainer.stopped_at_step
    assert step is not None and step < args.max_steps and step % args.check_every == 0
    assert trainer.state.global_step == step
    history = trainer.violation_history
    checks = [h for h in history if h["check"]]
    assert [h["step"] for h in checks] == list(range(args.check_every, step + 1, args.check_every))
    # every earlier check was either not triggered or not confirmed; the last one is confirmed
    assert all(not h.get("confirmed", False) for h in checks[:-1])
    last = checks[-1]
    assert last["triggered"] and last["confirmed"]
    triggered = [h for h in checks if h["triggered"]]
    assert [h["confirmation"] for h in triggered] == list(range(1, len(triggered) + 1))
    assert all(h["triggered"] == (h["violation_rate"] <= args.stop_trigger) for h in checks)
    # the bound at the stop equals the formula on an independent recomputation of the probe
    rates = _slow_probe_rates(trainer, trainer.model, list(synthetic["forget10"]), "confirm", step)
    mean = sum(rates) / len(rates)
    assert last["confirm_violation_rate"] == pytest.approx(mean, abs=1e-9)
    j = last["confirmation"]
    if confirm_rule == "hoeffding":
        delta_j = 6 * args.confirm_delta / (math.pi**2 * (j + 1) ** 2)
        bound = mean + math.sqrt(math.log(1 / delta_j) / (2 * len(rates)))
        assert last["hoeffding_bound"] == pytest.approx(bound) and last["confirm_statistic"] == pytest.approx(bound)
    else:  # the plain mean, no bound
        assert "hoeffding_bound" not in last and last["confirm_statistic"] == pytest.approx(mean, abs=1e-9)
    assert last["confirm_statistic"] <= args.stop_tolerance
    for h in checks[:-1]:  # earlier armed checks had their statistic above alpha
        if h["triggered"]:
            assert h["confirm_statistic"] > args.stop_tolerance
    assert trainer.stop_reason == "rule"
    logged = [e for e in trainer.state.log_history if "masc/stopped_at_step" in e]
    assert logged and logged[-1]["masc/stopped_at_step"] == step

    trainer.save_model(str(tmp_path / "saved"))
    saved = json.loads((tmp_path / "saved" / STOPPING_FILE).read_text())
    assert (tmp_path / "saved" / "model.safetensors").is_file()
    assert saved["stopped_at_step"] == step and saved["stopped_by_rule"] and not saved["budget_exhausted"]
    assert saved["stop_reason"] == "rule" and saved["rule"]["confirm_rule"] == confirm_rule
    assert saved["rule"]["stop_tolerance"] == args.stop_tolerance and saved["rule"]["top_k"] == args.top_k
    assert len(saved["violation_history"]) == len(history)


def test_masc_never_clearing_probe_does_not_stop(tiny_target, synthetic, tmp_path):
    trainer = _trainer(tiny_target, synthetic, tmp_path, learning_rate=1e-7, max_steps=6)
    with pytest.warns(UserWarning, match="step budget"):
        trainer.train()
    assert trainer.stopped_at_step is None and trainer.stopping_callback.budget_exhausted
    assert trainer.state.global_step == 6
    checks = [h for h in trainer.violation_history if h["check"]]
    assert [h["step"] for h in checks] == [2, 4, 6]
    assert all(not h["triggered"] and "hoeffding_bound" not in h for h in checks)


def test_masc_triggered_but_unconfirmed_does_not_stop(tiny_target, synthetic, tmp_path):
    """A trigger of 1.0 arms every check; alpha below the Hoeffding radius can never be confirmed."""
    trainer = _trainer(tiny_target, synthetic, tmp_path, stop_trigger=0.999, stop_tolerance=0.05, max_steps=4)
    with pytest.warns(UserWarning, match="step budget"):
        trainer.train()
    checks = [h for h in trainer.violation_history if h["check"]]
    assert [h["confirmation"] for h in checks] == [1, 2]
    assert all(h["hoeffding_bound"] > 0.05 and not h["confirmed"] for h in checks)
    assert trainer.stopped_at_step is None


def test_masc_loss_is_weighted_buffered_hinge_on_the_continuation(tiny_target, synthetic, tmp_path):
    from hf_unlearn.methods.masc.trainer import ACTIVE_MASK_KEY

    trainer = _trainer(tiny_target, synthetic, tmp_path, forget_weight=0.05)
    model = trainer.model
    model.train()
    iterator = iter(trainer.get_train_dataloader())
    batches, _ = trainer.get_batch_samples(iterator, 1, trainer.args.device)
    batch = trainer._prepare_inputs(batches[0])
    active = batch[ACTIVE_MASK_KEY]
    mask = (batch["labels"] != -100)
    mask[:, 0] = False
    assert bool((active <= mask).all()) and 0 < int(active.sum()) < int(mask.sum())
    trainer._in_training_step = True
    try:
        loss = trainer.compute_loss(model, batch)
    finally:
        trainer._in_training_step = False
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    margins, _ = _slow_margin(logits.detach(), batch["labels"], 10, 1.0)
    tau, eta = trainer.args.tau, trainer.args.buffer_eta
    terms = [max(0.0, float(m) - (tau - eta)) / eta for m in margins[active]]
    assert float(loss) == pytest.approx(0.05 * sum(terms) / len(terms), rel=1e-4)


class _Interrupt(Exception):
    pass


def _interrupt_at(step):
    from transformers import TrainerCallback

    class Interrupt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == step:
                raise _Interrupt(f"interrupted at step {step}")

    return Interrupt()


def test_masc_resume_restores_the_rule_and_the_weights(tiny_pair, synthetic, tmp_path):
    """Interrupt after a checkpoint, resume, and get the uninterrupted run's rule state and weights."""
    from hf_unlearn.demo import load_tiny
    from hf_unlearn.methods.masc import MASCTrainer

    common = dict(save_strategy="steps", save_steps=4, max_steps=8, stop_tolerance=0.01, stop_trigger=0.999,
                  learning_rate=3e-4)

    def make(out, callbacks=None, **more):
        model, tok = load_tiny(tiny_pair.target)
        return MASCTrainer(model, _config(out, **common, **more), train_dataset=synthetic["forget10"],
                           processing_class=tok, callbacks=callbacks)

    full = make(tmp_path / "a")
    with pytest.warns(UserWarning, match="step budget"):
        full.train()
    first = make(tmp_path / "b", callbacks=[_interrupt_at(5)])
    with pytest.raises(_Interrupt):
        first.train()
    # (overwrite=True: TRL's model card README.md lies beside the checkpoints of the interrupted run)
    resumed = make(tmp_path / "b", overwrite=True)
    assert not resumed.args.restore_callback_states_from_checkpoint  # MASC restores its rule regardless
    with pytest.warns(UserWarning, match="step budget"):
        resumed.train(resume_from_checkpoint=True)
    assert len(resumed.violation_history) == len(full.violation_history) == 5
    for got, want in zip(resumed.violation_history, full.violation_history):
        assert got.keys() == want.keys() and got == pytest.approx(want)
    assert resumed.stopping_callback.num_confirmations == full.stopping_callback.num_confirmations == 4
    for (name, a), (_, b) in zip(full.model.named_parameters(), resumed.model.named_parameters()):
        torch.testing.assert_close(a, b, msg=name)
    assert (tmp_path / "b" / "masc" / "checkpoint-4" / "masc_stopping.json").is_file()


def test_masc_heldout_variant_keeps_the_earlier_rule(tiny_target, synthetic, tmp_path):
    trainer = _trainer(tiny_target, synthetic, tmp_path, stop_probe="heldout", penalty="full", hinge="plain",
                       margin_threshold=0.0, stop_tolerance=0.3, validation_fraction=0.1)
    held_q = {tuple(r["input_ids"]) for r in trainer.validation_dataset}
    train_q = {tuple(r["input_ids"]) for r in trainer.forget_dataset}
    assert len(held_q) == 2 and len(train_q) == 18 and not held_q & train_q
    trainer.train()
    step = trainer.stopped_at_step
    assert step is not None
    history = trainer.violation_history
    assert all(h["violation_rate"] > 0.3 for h in history[:-1]) and history[-1]["violation_rate"] <= 0.3
    assert history[-1]["violations"] / history[-1]["positions"] == pytest.approx(history[-1]["violation_rate"])


def test_masc_uses_lora_by_default_with_the_disabled_adapter_as_reference(tiny_target, synthetic, tmp_path):
    from accelerate.utils import is_peft_model

    from hf_unlearn.methods.masc import MASCTrainer

    model, tok = tiny_target
    trainer = MASCTrainer(model, _config(tmp_path, use_peft=True, retain_weight=1.0), train_dataset=synthetic["forget10"],
                          retain_dataset=synthetic["retain90"], processing_class=tok)
    assert is_peft_model(trainer.model) and trainer.ref_model is None
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    trainer.model.train()
    trainer.compute_loss(trainer.model, batch)
    assert abs(float(trainer._unlearning_metrics["train"]["retain_kl"][-1])) < 1e-6  # pi_0 = adapter disabled
    names = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert names and all("lora_" in n for n in names)
    assert any("q_proj" in n for n in names) and not any("gate_proj" in n for n in names)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(top_k=0), "top_k"),
        (dict(stop_tolerance=0.0), r"stop_tolerance.*alpha"),
        (dict(stop_tolerance=1.0), r"stop_tolerance.*alpha"),
        (dict(margin_probability=1.5), "rho"),
        (dict(validation_fraction=0.0), "validation_fraction"),
        (dict(check_every=0), "check_every"),
        (dict(buffer_eta=0.0), "buffer_eta"),
        (dict(penalty="suffix"), "penalty"),
        (dict(continuation_cut_min_ratio=0.7), "cut ratios"),
        (dict(confirm_examples=0), "confirm_examples"),
        (dict(stop_probe="eval"), "stop_probe"),
        (dict(confirm_delta=0.0), "confirm_delta"),
    ],
)
def test_masc_config_bad_input(kwargs, match):
    from hf_unlearn.methods.masc import MASCConfig

    with pytest.raises(ValueError, match=match):
        MASCConfig(output_dir="unused", report_to="none", **kwargs)


def test_masc_trainer_bad_input(tiny_target, synthetic, tmp_path):
    from hf_unlearn.methods.masc import MASCTrainer

    model, tok = tiny_target
    forget = synthetic["forget10"]
    vocab = model.get_output_embeddings().weight.shape[0]
    with pytest.raises(ValueError, match=f"top_k={vocab}.*at most vocab_size - 1 = {vocab - 1}"):
        MASCTrainer(model, _config(tmp_path, top_k=vocab), train_dataset=forget, processing_class=tok)
    with pytest.raises(ValueError, match=r"has \d+ answer positions; the stopping rule needs at least 100"):
        MASCTrainer(model, _config(tmp_path, stop_probe="heldout", stop_tolerance=0.01, validation_fraction=0.05),
                    train_dataset=forget, processing_class=tok)
    with pytest.raises(ValueError, match="at least 2"):
        MASCTrainer(model, _config(tmp_path, stop_probe="heldout"), train_dataset=forget[:1], processing_class=tok)
    with pytest.raises(TypeError, match="MASCConfig"):
        from hf_unlearn.methods.base import UnlearningConfig

        MASCTrainer(model, UnlearningConfig(output_dir=str(tmp_path), report_to="none"), train_dataset=forget,
                    processing_class=tok)


def test_masc_config_fields_have_help_and_are_documented():
    import dataclasses

    from hf_unlearn.methods.base import BaseUnlearningConfig
    from hf_unlearn.methods.masc import MASCConfig

    base = {f.name for f in dataclasses.fields(BaseUnlearningConfig)}
    own = [f for f in dataclasses.fields(MASCConfig) if f.name not in base]
    assert len(own) >= 25
    for f in own:
        assert f.metadata.get("help"), f.name
        assert f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING, f.name
        assert f"{f.name} (`" in MASCConfig.__doc__, f.name
