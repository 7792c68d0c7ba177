"""ATWU as its paper writes it: the scorer reads each token's own representation (or, as an option, the state that
predicts it), the retain conflict of a token (through the output layer) against a slow autograd reference, and a
scorer that, given the conflict, ranks the conflicting tokens apart while the budget moves only its threshold."""

from __future__ import annotations

import pytest
import torch
from test_atwu import _trainer

from hf_unlearn.methods.atwu import ATWUTokenWeighter
from hf_unlearn.methods.atwu.loss import normalized_conflict, retain_conflict


@pytest.mark.parametrize("position,read", [("token", 0), ("predicting", -1)])
def test_scorer_reads_the_position_the_docs_name(position, read):
    weighter = ATWUTokenWeighter(4, position=position, standardize=False)
    with torch.no_grad():
        weighter.linear.weight.copy_(torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    hidden = torch.zeros(1, 6, 4)
    hidden[0, 3, 0] = 5.0  # only the state at position 3 stands out
    scores = weighter.label_scores(hidden)[0]
    assert int(scores.argmax()) == 3 - read  # "token": label 3 reads h_3; "predicting": label 4 reads h_3
    mask = torch.zeros(1, 6, dtype=torch.bool)
    mask[0, 3 - read] = True
    assert torch.equal(weighter.scored_states(hidden, mask), hidden[0, 3:4])
    with pytest.raises(ValueError, match="position"):
        ATWUTokenWeighter(4, position="previous")


def _slow_conflict(head, f_states, f_labels, r_states, r_labels):
    """<grad_W log p(y_t), mean_r grad_W log p(y_r)> by autograd, one forget token at a time."""

    def grad(state, label):
        w = head.clone().requires_grad_(True)
        torch.log_softmax(state @ w.T, -1)[label].backward()
        return w.grad

    retain = torch.stack([grad(h, y) for h, y in zip(r_states, r_labels)]).mean(0)
    return torch.tensor([float((grad(h, y) * retain).sum()) for h, y in zip(f_states, f_labels)])


def test_retain_conflict_equals_the_output_layer_gradient_inner_product():
    torch.manual_seed(0)
    hidden, head = 5, torch.randn(7, 5)
    f_states, r_states = torch.randn(2, 4, hidden), torch.randn(1, 5, hidden)
    f_labels = torch.tensor([[-100, 1, 2, 3], [-100, -100, 4, 4]])
    r_labels = torch.tensor([[-100, 2, 5, 6, 1]])
    got = retain_conflict(f_states @ head.T, f_labels, f_states, r_states @ head.T, r_labels, r_states)
    # label t is predicted from position t - 1
    f_pos = [(b, t) for b in range(2) for t in range(1, 4) if f_labels[b, t] != -100]
    r_pos = [(0, t) for t in range(1, 5)]
    want = _slow_conflict(head, [f_states[b, t - 1] for b, t in f_pos], [int(f_labels[b, t]) for b, t in f_pos],
                          [r_states[b, t - 1] for b, t in r_pos], [int(r_labels[b, t]) for b, t in r_pos])
    assert [float(got[b, t]) for b, t in f_pos] == pytest.approx(want.tolist(), rel=1e-4, abs=1e-6)
    assert float(got[0, 0]) == float(got[1, 1]) == 0.0
    norm = normalized_conflict(got, f_labels != -100)
    assert float(norm[f_labels != -100].abs().mean()) == pytest.approx(1.0)
    assert not normalized_conflict(torch.zeros(2, 4), f_labels != -100).any()


def test_scorer_ranks_the_tokens_that_carry_the_retain_conflict_apart(tiny_target, synthetic, tmp_path):
    """With the default settings, forget tokens whose unlearning costs the retain answers (positive conflict) end
    with the lowest scores, all others above them: the conflict is the weighter's per-token signal, the forget
    loss is off in the weighter step (and its NLLs differ), and the budget penalty moves only the bias."""
    trainer = _trainer(tiny_target, synthetic, tmp_path)
    assert trainer.args.scorer_forget_weight == 0.0
    torch.manual_seed(0)
    hidden = torch.randn(2, 12, trainer.scorer.hidden_size)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[:, 0] = False
    conflict = torch.zeros(2, 12)
    carriers = [(0, 3), (0, 7), (1, 2), (1, 9)]
    for b, t in carriers:
        conflict[b, t] = 1.0
    log_probs = -torch.rand(2, 12, generator=torch.Generator().manual_seed(1)) * mask
    bias_before = float(trainer.scorer.linear.bias)
    for _ in range(150):
        trainer.scorer_step(log_probs, hidden, mask, conflict=conflict)
    scores = trainer.scorer.label_scores(hidden, trainer.scorer.center, trainer.scorer.variance).detach()
    carrier_scores = torch.stack([scores[b, t] for b, t in carriers])
    others = scores[mask & (conflict == 0)]
    assert float(carrier_scores.max()) < float(others.min())
    assert float(trainer.scorer.linear.bias) != bias_before


def test_training_passes_the_retain_conflict_to_the_scorer(tiny_target, synthetic, tmp_path):
    trainer = _trainer(tiny_target, synthetic, tmp_path, max_steps=2, logging_steps=1)
    trainer.train()
    logged = [e["scorer_retain_conflict"] for e in trainer.state.log_history if "scorer_retain_conflict" in e]
    assert len(logged) == 2 and all(v == v for v in logged)
    off = _trainer(tiny_target, synthetic, tmp_path, max_steps=1, logging_steps=1, retain_conflict_weight=0.0)
    off.train()
    assert not any("scorer_retain_conflict" in e for e in off.state.log_history)


def test_scorer_forget_weight_scales_the_forget_loss_in_the_weighter_step(tiny_target, synthetic, tmp_path):
    """The weighter step's loss is ``scorer_forget_weight * L_forget(g) + ...``: at 0 (the default) the token NLLs
    do not move the weighter, at 1 they do."""
    torch.manual_seed(0)
    hidden = torch.randn(2, 6, 64)
    mask = torch.ones(2, 6, dtype=torch.bool)
    low, high = torch.full((2, 6), -0.05), -torch.rand(2, 6, generator=torch.Generator().manual_seed(2)) * 3
    weights = {}
    for weight in (0.0, 1.0):
        for name, lp in (("low", low), ("high", high)):
            trainer = _trainer(tiny_target, synthetic, tmp_path / f"{weight}{name}", scorer_forget_weight=weight)
            terms = trainer.scorer_step(lp, hidden[..., : trainer.scorer.hidden_size], mask)
            assert terms["scorer_forget_loss"] < 0
            weights[weight, name] = trainer.scorer.weight.detach().clone()
    assert torch.equal(weights[0.0, "low"], weights[0.0, "high"])
    assert not torch.allclose(weights[1.0, "low"], weights[1.0, "high"])
    with pytest.raises(ValueError, match="scorer_forget_weight"):
        _trainer(tiny_target, synthetic, tmp_path / "bad", scorer_forget_weight=-1.0)
