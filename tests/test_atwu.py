"""ATWU: pure losses against slow references, the token scorer, the alternating trainer."""

from __future__ import annotations

import math

import pytest
import torch

from hf_unlearn.methods.atwu.loss import (
    budget_penalty,
    satga_plus_loss,
    satga_plus_weight,
    score_entropy,
    straight_through_indicator,
    weighted_npo_loss,
    weighted_simnpo_loss,
)

# ---------------------------------------------------------------------------------------------
# slow references: python loops over examples and tokens
# ---------------------------------------------------------------------------------------------


def _random_batch(seed: int = 0, B: int = 3, L: int = 7):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, L, generator=gen, dtype=torch.float64) * 3.0
    ref = -torch.rand(B, L, generator=gen, dtype=torch.float64) * 3.0
    scores = torch.rand(B, L, generator=gen, dtype=torch.float64)
    mask = torch.rand(B, L, generator=gen) > 0.3
    mask[:, 0] = False
    mask[0, 1] = True
    return logp, ref, scores, mask


def _slow_satga_plus(logp, scores, mask, beta, c, form="gated"):
    """SATGA+ as a loop. The weight uses a float copy of p_t (stop-gradient), so autograd reaches logp through l_t
    only and g through the gate, the exponent and (gated) the selected-mass normaliser."""
    total, count, mass = 0.0, 0, 0.0
    B, L = logp.shape
    for b in range(B):
        for t in range(L):
            if not mask[b, t]:
                continue
            p = math.exp(logp[b, t].item())
            exponent = beta * (1.0 + c * (1.0 - scores[b, t]))
            weight = p**exponent * (scores[b, t] if form == "gated" else 1.0)
            total = total + weight * (-logp[b, t])
            count += 1
            mass = mass + scores[b, t]
    return -total / (mass if form == "gated" else count)


def _slow_weighted_npo(logp, ref, scores, mask, beta):
    out = 0.0
    for b in range(logp.shape[0]):
        s = sum(float(scores[b, t]) * (float(logp[b, t]) - float(ref[b, t])) for t in range(logp.shape[1]) if mask[b, t])
        out += -(2.0 / beta) * math.log(1.0 / (1.0 + math.exp(beta * s)))
    return out / logp.shape[0]


def _slow_weighted_simnpo(logp, scores, mask, beta, gamma):
    out = 0.0
    for b in range(logp.shape[0]):
        num = sum(float(scores[b, t]) * float(logp[b, t]) for t in range(logp.shape[1]) if mask[b, t])
        den = sum(float(scores[b, t]) for t in range(logp.shape[1]) if mask[b, t])
        z = -beta * num / den - gamma
        out += -(2.0 / beta) * math.log(1.0 / (1.0 + math.exp(-z)))
    return out / logp.shape[0]


# ---------------------------------------------------------------------------------------------
# losses
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["gated", "exponent_only"])
@pytest.mark.parametrize("beta,c", [(1.0, 4.0), (0.5, 0.0), (0.2, 50.0)])
def test_satga_plus_matches_slow_reference_and_its_gradients(beta, c, form):
    logp, _, scores, mask = _random_batch(1)
    logp_fast, g_fast = logp.clone().requires_grad_(True), scores.clone().requires_grad_(True)
    fast = satga_plus_loss(logp_fast, g_fast, mask, beta=beta, c=c, form=form)
    fast.backward()
    logp_slow, g_slow = logp.clone().requires_grad_(True), scores.clone().requires_grad_(True)
    slow = _slow_satga_plus(logp_slow, g_slow, mask, beta, c, form)
    slow.backward()
    assert fast.item() == pytest.approx(slow.item(), rel=1e-6)
    torch.testing.assert_close(logp_fast.grad.double(), logp_slow.grad, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(g_fast.grad.double(), g_slow.grad, rtol=1e-6, atol=1e-9)
    nll, a = -logp, beta * (1 + c * (1 - scores))
    if form == "exponent_only":  # closed form of the score gradient: dL/dg_t = -beta c p_t^a_t l_t^2 / N
        closed = (-beta * c * torch.exp(-a * nll) * nll**2 / mask.sum()) * mask
        torch.testing.assert_close(g_fast.grad.double(), closed, rtol=1e-6, atol=1e-9)
    else:  # the model's gradient: dL/dlogp_t = g_t p_t^a_t / sum(g)
        closed = scores * torch.exp(-a * nll) / (scores * mask).sum() * mask
        torch.testing.assert_close(logp_fast.grad.double(), closed, rtol=1e-6, atol=1e-9)
    assert logp_fast.grad[~mask].abs().sum() == 0
    # with an explicit token count N (gradient accumulation) the gated normaliser is N * mean(g)
    n = 2.0 * mask.sum()
    scaled = satga_plus_loss(logp, scores, mask, beta=beta, c=c, num_tokens=n, form=form)
    assert scaled.item() == pytest.approx(slow.item() / 2.0, rel=1e-6)


def test_satga_plus_orientation_and_saturation():
    """High score = stronger push on that token; forgotten tokens (p -> 0) stop being pushed."""
    mask = torch.tensor([[True, True]])
    for form in ("gated", "exponent_only"):
        logp = torch.tensor([[math.log(0.5), math.log(0.5)]], requires_grad=True)
        satga_plus_loss(logp, torch.tensor([[1.0, 0.0]]), mask, beta=1.0, c=4.0, form=form).backward()
        g_hi, g_lo = logp.grad[0]
        if form == "exponent_only":
            assert g_hi.item() == pytest.approx(0.5 / 2) and g_lo.item() == pytest.approx(0.5**5 / 2)
        else:  # the rejected token is left alone, the selected one carries the whole (mass-normalised) push
            assert g_hi.item() == pytest.approx(0.5) and g_lo.item() == 0.0
        logp2 = torch.tensor([[math.log(1e-4)]], requires_grad=True)
        satga_plus_loss(logp2, torch.ones(1, 1), torch.ones(1, 1, dtype=torch.bool), beta=1.0, c=4.0, form=form).backward()
        assert logp2.grad.item() < 2e-4


def test_satga_gated_weight_protects_a_memorised_token():
    """At p = 0.99 the gated weight of a rejected token (score 0, or 0.05) is >= 10x below a selected one's; the
    earlier exponent-only weight is not (0.998 vs 0.96 at beta 0.2, c 20)."""
    logp = torch.full((3,), math.log(0.99))
    scores = torch.tensor([1.0, 0.05, 0.0])
    w = satga_plus_weight(logp, scores, beta=0.2, c=50.0, form="gated")
    assert w[0].item() == pytest.approx(0.99**0.2)
    assert w[0] >= 10 * w[1] and w[0] >= 10 * w[2] and w[2] == 0
    old = satga_plus_weight(logp, scores, beta=0.2, c=20.0, form="exponent_only")
    assert old[0].item() == pytest.approx(0.998, abs=1e-3) and old[2].item() == pytest.approx(0.96, abs=5e-3)
    assert old[0] < 10 * old[2]
    with pytest.raises(ValueError, match="form"):
        satga_plus_weight(logp, scores, form="both")


def test_weighted_npo_and_simnpo_match_slow_reference():
    logp, ref, scores, mask = _random_batch(2)
    assert weighted_npo_loss(logp, ref, scores, mask, beta=0.7).item() == pytest.approx(
        _slow_weighted_npo(logp, ref, scores, mask, 0.7), rel=1e-6
    )
    assert weighted_simnpo_loss(logp, scores, mask, beta=2.5, delta=0.3).item() == pytest.approx(
        _slow_weighted_simnpo(logp, scores, mask, 2.5, 0.3), rel=1e-6
    )
    # unit scores recover the unweighted losses
    ones = torch.ones_like(scores)
    m = mask.double()
    seq = ((logp - ref) * m).sum(-1)
    npo = (-(2 / 0.7) * torch.nn.functional.logsigmoid(-0.7 * seq)).mean()
    assert weighted_npo_loss(logp, ref, ones, mask, beta=0.7).item() == pytest.approx(npo.item(), rel=1e-6)
    avg = (logp * m).sum(-1) / m.sum(-1)
    simnpo = (-(2 / 2.5) * torch.nn.functional.logsigmoid(-2.5 * avg)).mean()
    assert weighted_simnpo_loss(logp, ones, mask, beta=2.5).item() == pytest.approx(simnpo.item(), rel=1e-6)


def test_entropy_and_budget_penalty():
    scores = torch.tensor([[0.1, 0.9, 0.6, 0.5, 0.3]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[False, True, True, True, True]])
    h = score_entropy(scores, mask)
    ref = sum(-(g * math.log(g) + (1 - g) * math.log(1 - g)) for g in (0.9, 0.6, 0.5, 0.3)) / 4
    assert h.item() == pytest.approx(ref, rel=1e-9)
    pen = budget_penalty(scores, mask, budget=0.25)
    # selected (> 0.5): 0.9 and 0.6 -> fraction 0.5
    assert pen.item() == pytest.approx((0.5 - 0.25) ** 2)
    pen.backward()
    expected = torch.tensor([[0.0, 1, 1, 1, 1]], dtype=torch.float64) * 2 * (0.5 - 0.25) / 4
    torch.testing.assert_close(scores.grad, expected)
    st = straight_through_indicator(torch.tensor([0.2, 0.7]))
    assert st.tolist() == [0.0, 1.0]
    for bad in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="budget"):
            budget_penalty(scores, mask, budget=bad)


# ---------------------------------------------------------------------------------------------------------------
# token scorer
# ---------------------------------------------------------------------------------------------------------------


def test_weighter_forward_save_load_and_hidden_size_check(tmp_path):
    from hf_unlearn.methods.atwu import ATWUTokenWeighter

    torch.manual_seed(0)
    weighter = ATWUTokenWeighter(8)
    h = torch.randn(2, 5, 8, requires_grad=True)
    assert torch.allclose(weighter(h), torch.full((2, 5), 0.5))  # w = 0, b = 0: undecided
    with torch.no_grad():
        weighter.linear.weight.normal_()
        weighter.linear.bias.fill_(0.3)
    weighter.update_statistics(torch.randn(8))
    g = weighter(h)
    assert g.shape == (2, 5) and bool(((g > 0) & (g < 1)).all())
    torch.testing.assert_close(g, torch.sigmoid((h.detach() - weighter.center) @ weighter.weight.detach() + 0.3))
    g.sum().backward()
    assert h.grad is None  # hidden states enter detached: nothing flows back into the model
    weighter.save_pretrained(tmp_path / "w")  # huggingface_hub mixin: config.json + model.safetensors
    assert {"config.json", "model.safetensors"} <= {p.name for p in (tmp_path / "w").iterdir()}
    again = ATWUTokenWeighter.from_pretrained(tmp_path / "w", hidden_size=8)
    torch.testing.assert_close(again(h), weighter(h))  # the running centre travels with the weights
    assert int(again.num_center_updates) == 1
    with pytest.raises(ValueError, match="Hidden size mismatch"):
        ATWUTokenWeighter.from_pretrained(tmp_path / "w", hidden_size=16)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="No ATWU token weighter"):
        ATWUTokenWeighter.from_pretrained(tmp_path / "empty")
    with pytest.raises(ValueError, match="width 4"):
        weighter(torch.randn(1, 3, 4))


def test_optimizer_state_round_trip(tmp_path):
    from hf_unlearn.methods.atwu.weighter import (
        ATWUTokenWeighter,
        load_optimizer_state,
        save_optimizer_state,
    )

    torch.manual_seed(1)
    weighter = ATWUTokenWeighter(6)
    opt = torch.optim.Adam(weighter.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        weighter(torch.randn(4, 6)).sum().backward()
        opt.step()
    save_optimizer_state(opt, tmp_path / "opt.safetensors")
    fresh = torch.optim.Adam(weighter.parameters(), lr=5.0)
    load_optimizer_state(fresh, tmp_path / "opt.safetensors")
    a, b = opt.state_dict(), fresh.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for pid in a["state"]:
        for key, value in a["state"][pid].items():
            torch.testing.assert_close(torch.as_tensor(b["state"][pid][key]), torch.as_tensor(value))


def test_auroc_helper_matches_pairwise_definition():
    from hf_unlearn.methods.atwu.weighter import auroc, forget_specific_auroc

    gen = torch.Generator().manual_seed(3)
    s = torch.randint(0, 5, (40,), generator=gen).double().tolist()  # ties on purpose
    y = (torch.rand(40, generator=gen) > 0.6).tolist()
    pos = [a for a, b in zip(s, y) if b]
    neg = [a for a, b in zip(s, y) if not b]
    pairwise = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))
    assert auroc(s, y) == pytest.approx(pairwise)
    examples = [{"token_ids": [1, 2, 3], "scores": [0.9, 0.1, 0.2]}, {"token_ids": [4], "scores": [0.8]}]
    assert forget_specific_auroc(examples, retain_token_ids={2, 3}) == 1.0
    with pytest.raises(ValueError, match="both classes"):
        auroc([0.1, 0.2], [True, True])


# ---------------------------------------------------------------------------------------------------------------
# config: bad input
# ---------------------------------------------------------------------------------------------------------------


def _config(tmp_path, **kwargs):
    from hf_unlearn.methods.atwu import ATWUConfig

    base = dict(
        output_dir=str(tmp_path / "out"), report_to="none", save_strategy="no", gradient_checkpointing=False,
        disable_tqdm=True, per_device_train_batch_size=4, learning_rate=5e-4, weight_decay=0.0, seed=0,
        logging_steps=5, max_steps=30, budget=0.2, budget_weight=50.0, entropy_weight=0.01, scorer_lr=1e-2,
    )
    base.update(kwargs)
    return ATWUConfig(**base)


@pytest.mark.parametrize("budget", [0.0, 1.0, -0.2, 1.5])
def test_budget_outside_unit_interval_is_refused(tmp_path, budget):
    with pytest.raises(ValueError, match="budget must lie in"):
        _config(tmp_path, budget=budget)


@pytest.mark.parametrize("every", [0, -3, 1.5])
def test_scorer_every_below_one_is_refused(tmp_path, every):
    with pytest.raises(ValueError, match="scorer_every"):
        _config(tmp_path, scorer_every=every)


def test_other_bad_config_values(tmp_path):
    with pytest.raises(ValueError, match="forget_loss"):
        _config(tmp_path, forget_loss="ga")
    with pytest.raises(ValueError, match="scorer_lr"):
        _config(tmp_path, scorer_lr=0.0)
    with pytest.raises(ValueError, match="satga_form"):
        _config(tmp_path, satga_form="gate")
    cfg = _config(tmp_path)
    assert (cfg.npo_beta, cfg.simnpo_beta, cfg.satga_form) == (0.1, 4.5, "gated")
    for ignored in ("beta", "delta"):  # no inherited fields ATWU ignores (forget_weight is its own)
        assert not hasattr(cfg, ignored)


# ---------------------------------------------------------------------------------------------------------------
# trainer on the tiny model
# ---------------------------------------------------------------------------------------------------------------


def _trainer(tiny_target, synthetic, tmp_path, **kwargs):
    from datasets import Dataset

    from hf_unlearn.methods.atwu import ATWUTrainer

    model, tok = tiny_target
    forget = Dataset.from_list([{"question": r["question"], "answer": r["answer"]} for r in synthetic["forget10"]])
    retain = Dataset.from_list([{"question": r["question"], "answer": r["answer"]} for r in synthetic["retain90"]])
    scorer = kwargs.pop("scorer", None)
    return ATWUTrainer(
        model=model, args=_config(tmp_path, **kwargs), train_dataset=forget, retain_dataset=retain,
        processing_class=tok, scorer=scorer,
    )


def test_model_step_and_scorer_step_are_isolated(tiny_target, synthetic, tmp_path):
    trainer = _trainer(tiny_target, synthetic, tmp_path)
    model = trainer.model
    batch = next(iter(trainer.get_train_dataloader()))
    denominators = trainer._denominators(batch)
    # model step: the loss reaches the model, never the scorer
    loss = trainer.compute_unlearning_loss(model, batch, denominators)
    loss.backward()
    assert all(p.grad is None for p in trainer.scorer.parameters())
    assert sum(float(p.grad.abs().sum()) for p in model.parameters() if p.grad is not None) > 0
    model.zero_grad(set_to_none=True)
    # scorer step on outputs that still carry the model's graph: only the scorer moves
    forget = trainer.score(model, batch, output_hidden_states=True)
    before = [p.detach().clone() for p in trainer.scorer.parameters()]
    terms = trainer.scorer_step(forget.token_log_probs, forget.outputs.hidden_states[-1], forget.mask)
    assert all(p.grad is None for p in model.parameters())
    assert any(not torch.equal(a, p) for a, p in zip(before, trainer.scorer.parameters()))
    assert set(terms) == {"scorer_loss", "scorer_forget_loss", "score_entropy", "budget_penalty"}


def test_scorer_hidden_size_mismatch_is_refused(tiny_target, synthetic, tmp_path):
    from hf_unlearn.methods.atwu import ATWUTokenWeighter

    with pytest.raises(ValueError, match="Hidden size mismatch"):
        _trainer(tiny_target, synthetic, tmp_path, scorer=ATWUTokenWeighter(32))


def test_atwu_learns_forget_specific_tokens_and_reloads(tiny_target, synthetic, tmp_path):
    from hf_unlearn.demo import load_tiny
    from hf_unlearn.logprobs import answer_nll
    from hf_unlearn.methods.atwu import ATWUTokenWeighter
    from hf_unlearn.methods.atwu.weighter import answer_token_ids, forget_specific_auroc, score_tokens

    torch.manual_seed(0)
    trainer = _trainer(tiny_target, synthetic, tmp_path)
    tok = trainer.processing_class
    forget_rows, retain_rows = synthetic["forget10"], synthetic["retain90"]
    nll_before = answer_nll(trainer.model, tok, [r["question"] for r in forget_rows], [r["answer"] for r in forget_rows]).mean()
    trainer.train()

    # the alternation is in the logs
    logged = {k for entry in trainer.state.log_history for k in entry}
    assert {"model_loss", "scorer_loss", "mean_score", "selected_fraction", "retain_nll"} <= logged

    # the scores separate forget-specific tokens (id never in a retain answer) from shared ones
    scores = trainer.token_scores(forget_rows)
    assert len(scores) == len(forget_rows)
    assert all(0.0 <= s <= 1.0 for ex in scores for s in ex["scores"])
    value = forget_specific_auroc(scores, answer_token_ids(tok, retain_rows))
    # ~0.86 with this seed (each token's own state, with the retain conflict; without it ~0.73); chance is 0.5
    # (sd ~0.035 for these ~80 vs ~820 tokens)
    assert value > 0.7, value

    model = trainer.model
    nll_after = answer_nll(model, tok, [r["question"] for r in forget_rows], [r["answer"] for r in forget_rows]).mean()
    assert nll_after > nll_before + 0.5  # 0.04 -> ~0.78: the budget's fifth of the tokens is what is pushed

    # save_model writes the scorer beside the weights; reloading both gives the same scores
    out = tmp_path / "saved"
    trainer.save_model(str(out))
    assert (out / "atwu_weighter" / "model.safetensors").is_file() and (out / "model.safetensors").is_file()
    model2, tok2 = load_tiny(out)
    scorer2 = ATWUTokenWeighter.from_pretrained(out, model=model2)
    again = score_tokens(model2, tok2, scorer2, forget_rows)
    for a, b in zip(scores, again):
        assert a["token_ids"] == b["token_ids"]
        torch.testing.assert_close(torch.tensor(a["scores"]), torch.tensor(b["scores"]), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="Hidden size mismatch"):
        ATWUTokenWeighter.from_pretrained(out, hidden_size=model2.config.hidden_size * 2)


@pytest.mark.parametrize("forget_loss", ["npo", "simnpo"])
def test_weighted_npo_and_simnpo_variants_train(tiny_target, synthetic, tmp_path, forget_loss):
    trainer = _trainer(tiny_target, synthetic, tmp_path, forget_loss=forget_loss, max_steps=4, logging_steps=2)
    assert (trainer.ref_model is not None) == (forget_loss == "npo")
    before = trainer.scorer.weight.detach().clone()
    trainer.train()
    logged = [e for e in trainer.state.log_history if "scorer_loss" in e]
    assert logged and all(math.isfinite(e["loss"]) and math.isfinite(e["scorer_loss"]) for e in logged)
    assert not torch.equal(before, trainer.scorer.weight.detach())


def _forget_loss_weighter_grad(trainer, batch, form, c):
    """Gradient norm of the forget term of the weighter step w.r.t. the weighter's direction w, at the current
    (memorised) model, for SATGA+ in ``form``."""
    import copy

    model = trainer.model
    forget = trainer.score(model, batch, output_hidden_states=True)
    hidden = forget.outputs.hidden_states[-1].detach()
    weighter = copy.deepcopy(trainer.scorer)
    center = weighter.scored_states(hidden, forget.mask).float().mean(0)
    g = weighter.label_scores(hidden, center)
    trainer.args.satga_form, trainer.args.saturation_c = form, c
    loss = trainer.weighted_forget_loss(forget.token_log_probs.detach(), g, forget.mask)
    loss.backward()
    return float(weighter.linear.weight.grad.norm()), float(forget.mean_nll)


def test_weighter_gets_gradient_at_step_zero_on_a_memorised_model(tiny_target, synthetic, tmp_path):
    trainer = _trainer(tiny_target, synthetic, tmp_path)
    batch = next(iter(trainer.get_train_dataloader()))
    gated, nll = _forget_loss_weighter_grad(trainer, batch, "gated", 50.0)
    old, _ = _forget_loss_weighter_grad(trainer, batch, "exponent_only", 20.0)  # the earlier default
    assert nll < 0.2  # the model has memorised the forget answers: every p is near 1
    assert gated > 1e-3, gated  # ~0.017
    assert gated > 1.5 * old, (gated, old)  # the earlier form at c = 20: ~0.009 (a push proportional to l^2)


def test_atwu_resume_restores_weighter_and_its_optimizer(tiny_pair, synthetic, tmp_path):
    """Interrupt after a checkpoint, resume: the weighter (weights, running mean and variance), its Adam state and the model
    end as in the uninterrupted run."""
    from datasets import Dataset
    from transformers import TrainerCallback

    from hf_unlearn.demo import load_tiny
    from hf_unlearn.methods.atwu import ATWUTrainer

    class Interrupt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 5:
                raise KeyboardInterrupt

    forget = Dataset.from_list([{"question": r["question"], "answer": r["answer"]} for r in synthetic["forget10"]])
    retain = Dataset.from_list([{"question": r["question"], "answer": r["answer"]} for r in synthetic["retain90"]])

    def make(out, callbacks=None, **more):
        model, tok = load_tiny(tiny_pair.target)
        args = _config(out, save_strategy="steps", save_steps=4, max_steps=8, logging_steps=2, **more)
        return ATWUTrainer(model=model, args=args, train_dataset=forget, retain_dataset=retain, processing_class=tok,
                           callbacks=callbacks)

    full = make(tmp_path / "a")
    full.train()
    first = make(tmp_path / "b", callbacks=[Interrupt()])
    with pytest.raises(KeyboardInterrupt):
        first.train()
    checkpoint = tmp_path / "b" / "out" / "checkpoint-4"
    assert (checkpoint / "atwu_weighter" / "model.safetensors").is_file()
    assert (checkpoint / "atwu_weighter_optimizer.safetensors").is_file()
    resumed = make(tmp_path / "b", overwrite=True)  # (TRL's README.md lies beside the checkpoints)
    resumed.train(resume_from_checkpoint=True)
    for (name, a), (_, b) in zip(full.model.named_parameters(), resumed.model.named_parameters()):
        torch.testing.assert_close(a, b, msg=name)
    assert {"center", "variance", "num_center_updates"} <= set(full.scorer.state_dict())  # standardisation state
    for key, value in full.scorer.state_dict().items():
        torch.testing.assert_close(resumed.scorer.state_dict()[key], value, msg=key)
    sa, sb = full.scorer_optimizer.state_dict()["state"], resumed.scorer_optimizer.state_dict()["state"]
    for pid in sa:
        for key in sa[pid]:
            torch.testing.assert_close(torch.as_tensor(sb[pid][key]), torch.as_tensor(sa[pid][key]))


def test_atwu_config_fields_have_help_and_are_documented():
    import dataclasses

    from hf_unlearn.methods.atwu import ATWUConfig
    from hf_unlearn.methods.base import BaseUnlearningConfig

    base = {f.name for f in dataclasses.fields(BaseUnlearningConfig)}
    own = [f for f in dataclasses.fields(ATWUConfig) if f.name not in base]
    assert len(own) == 23
    for f in own:
        assert f.metadata.get("help"), f.name
        assert f.default is not dataclasses.MISSING, f.name
        assert f"{f.name} (`" in ATWUConfig.__doc__, f.name
