"""ATWU's scorer: standardised inputs (running mean and variance, saved and restored with the weighter), the
scorer warm-up, the `c` schedule and the hard selection in the SATGA+ exponent."""

from __future__ import annotations

import json

import pytest
import torch
from test_atwu import _trainer


def _scaled_states(seed=0, shape=(3, 6, 8)):
    g = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-2, 2, shape[-1])  # dimensions of very different magnitude, as a pretrained model's
    return torch.randn(*shape, generator=g) * scale + 5.0


def test_weighter_standardisation_state_is_saved_and_restored(tmp_path):
    from hf_unlearn.methods.atwu import ATWUTokenWeighter

    torch.manual_seed(0)
    weighter = ATWUTokenWeighter(8, init_bias=-1.0)
    assert weighter.standardize and torch.equal(weighter.variance, torch.ones(8))
    with torch.no_grad():
        weighter.linear.weight.normal_()
    first, second = _scaled_states(0).reshape(-1, 8), _scaled_states(1).reshape(-1, 8)
    weighter.update_statistics(first.mean(0), first.var(0, unbiased=False))
    weighter.update_statistics(second.mean(0), second.var(0, unbiased=False), momentum=0.1)
    mu = 0.9 * first.mean(0) + 0.1 * second.mean(0)
    var = 0.9 * first.var(0, unbiased=False) + 0.1 * second.var(0, unbiased=False)
    torch.testing.assert_close(weighter.center, mu)
    torch.testing.assert_close(weighter.variance, var)
    h = _scaled_states(2)
    want = torch.sigmoid(((h - mu) / torch.sqrt(var + weighter.eps)) @ weighter.weight.detach() - 1.0)
    torch.testing.assert_close(weighter(h), want)

    weighter.save_pretrained(tmp_path / "w")
    config = json.loads((tmp_path / "w" / "config.json").read_text())
    assert config["standardize"] is True and config["eps"] == weighter.eps
    again = ATWUTokenWeighter.from_pretrained(tmp_path / "w", hidden_size=8)
    assert again.standardize and int(again.num_center_updates) == 2
    for name in ("center", "variance"):
        torch.testing.assert_close(getattr(again, name), getattr(weighter, name))  # safetensors round trip
    torch.testing.assert_close(again(h), weighter(h))

    centred = ATWUTokenWeighter(8, standardize=False)
    centred.update_statistics(first.mean(0), first.var(0, unbiased=False))
    centred.save_pretrained(tmp_path / "c")
    loaded = ATWUTokenWeighter.from_pretrained(tmp_path / "c")
    assert not loaded.standardize
    torch.testing.assert_close(loaded(h), torch.sigmoid((h - first.mean(0)) @ loaded.weight.detach()))


def test_weighter_saved_without_a_variance_loads_as_centring_only(tmp_path):
    from safetensors.torch import save_file

    from hf_unlearn.methods.atwu import ATWUTokenWeighter

    old = ATWUTokenWeighter(8)
    old.update_statistics(torch.arange(8.0))
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"hidden_size": 8, "init_bias": 0.0}))
    save_file({k: v for k, v in old.state_dict().items() if k != "variance"}, str(folder / "model.safetensors"))
    loaded = ATWUTokenWeighter.from_pretrained(folder)
    assert torch.equal(loaded.variance, torch.ones(8))
    h = _scaled_states(3)
    torch.testing.assert_close(loaded.logits(h), (h - torch.arange(8.0)) @ loaded.weight.detach(), atol=1e-4, rtol=1e-5)


def test_scorer_step_standardises_by_the_batch_statistics(tiny_target, synthetic, tmp_path):
    trainer = _trainer(tiny_target, synthetic, tmp_path)
    hidden = _scaled_states(4, (2, 6, trainer.scorer.hidden_size))
    mask = torch.zeros(2, 6, dtype=torch.bool)
    mask[0, 2:5] = True
    mask[1, 1:6] = True
    lp = torch.full((2, 6), -0.1)
    states = hidden[mask]  # the states that score the masked labels: each token's own
    trainer.scorer_step(lp, hidden, mask)
    torch.testing.assert_close(trainer.scorer.center, states.mean(0))  # the first update sets the statistics
    torch.testing.assert_close(trainer.scorer.variance, states.var(0, unbiased=False))
    z = trainer.scorer.standardized(states)
    # float32 statistics of values up to ~500 divided by scales down to 0.01: agreement to ~1e-4 is all float32 gives
    torch.testing.assert_close(z.mean(0), torch.zeros_like(z[0]), atol=1e-3, rtol=0)
    var = states.var(0, unbiased=False)
    torch.testing.assert_close(z.pow(2).mean(0), var / (var + trainer.scorer.eps), atol=1e-3, rtol=1e-3)  # ~1


def test_scorer_warmup_trains_only_the_scorer_before_the_first_model_step(tiny_target, synthetic, tmp_path):
    trainer = _trainer(tiny_target, synthetic, tmp_path, scorer_warmup_steps=3, max_steps=1)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    w0 = trainer.scorer.weight.detach().clone()
    trainer.model.train()
    terms = trainer.scorer_warmup(trainer.model)
    assert len(terms) == 3 and int(trainer.scorer.num_center_updates) == 3
    assert not torch.allclose(trainer.scorer.weight, w0)
    for n, p in trainer.model.named_parameters():
        torch.testing.assert_close(p, before[n], rtol=0, atol=0, msg=n)  # the model is frozen
    fresh = _trainer(tiny_target, synthetic, tmp_path / "run", scorer_warmup_steps=3, max_steps=2)
    fresh.train()
    assert int(fresh.scorer.num_center_updates) == 3 + 2  # warm-up once, then one scorer step per model step


def test_satga_hard_selection_and_c_schedule(tiny_target, synthetic, tmp_path):
    from hf_unlearn.methods.atwu.loss import satga_plus_exponent, satga_plus_loss

    g = torch.tensor([0.1, 0.49, 0.51, 0.9], requires_grad=True)
    a = satga_plus_exponent(g, 0.2, 50.0, selection="hard")
    torch.testing.assert_close(a.detach(), torch.tensor([0.2 * 51, 0.2 * 51, 0.2, 0.2]))
    a.sum().backward()
    torch.testing.assert_close(g.grad, torch.full((4,), -0.2 * 50.0))  # straight-through: d a / d g = -beta c
    lp = torch.log(torch.tensor([[0.9, 0.8, 0.7, 0.6]]))
    mask = torch.ones(1, 4, dtype=torch.bool)
    hard = satga_plus_loss(lp, g.detach()[None], mask, 0.2, 50.0, selection="hard")
    sel = (g.detach() > 0.5).float()
    want = -(g.detach() * torch.exp(0.2 * (1 + 50 * (1 - sel)) * lp[0]) * -lp[0]).sum() / g.detach().sum()
    torch.testing.assert_close(hard, want)
    with pytest.raises(ValueError, match="selection"):
        satga_plus_exponent(g, 0.2, 50.0, selection="top")

    trainer = _trainer(tiny_target, synthetic, tmp_path, saturation_c_warmup_steps=4, saturation_c=40.0)
    assert [trainer.saturation_c(s) for s in range(6)] == pytest.approx([10.0, 20.0, 30.0, 40.0, 40.0, 40.0])
    assert _trainer(tiny_target, synthetic, tmp_path / "c", saturation_c=40.0).saturation_c(0) == 40.0
    for bad in (dict(scorer_warmup_steps=-1), dict(saturation_c_warmup_steps=1.5), dict(satga_selection="top")):
        with pytest.raises(ValueError, match=next(iter(bad))):
            _trainer(tiny_target, synthetic, tmp_path / "bad", **bad)
