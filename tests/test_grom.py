"""GROM: solver minimality, Woodbury audit, exact LoRA round trip, unlearning effect, layer attribution, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hf_unlearn.grom import GROMConfig, fit_grom, grom_objective, lora_factors, solve_grom, woodbury_drop
from hf_unlearn.grom.solve import normal_matrix
from hf_unlearn.logprobs import answer_nll

# Hyperparameters that give a strong, specific effect on the tiny memorizing model (see the report).
STRONG = dict(target_modules="lm_head", forget_weight=10.0, suppression_margin=30.0, ridge=1e-2, progress=False)


def _random_problem(seed=0, d_in=12, d_out=7, s=9, r=40):
    g = torch.Generator().manual_seed(seed)
    xf = torch.randn(s, d_in, generator=g, dtype=torch.float64)
    dt = torch.randn(s, d_out, generator=g, dtype=torch.float64)
    xr = torch.randn(r, d_in, generator=g, dtype=torch.float64)
    return xf, dt, xr


@pytest.mark.parametrize("ridge", [0.3, 0.0])
def test_solver_is_the_minimiser(ridge):
    xf, dt, xr = _random_problem()
    wf, wr = 2.0, 0.7
    sol = solve_grom(xr.T @ xr, xr.shape[0], xf, dt, wf, wr, ridge)
    p = sol.delta.clone().requires_grad_(True)
    loss = grom_objective(p, xf, dt, xr, wf, wr, ridge)
    (grad,) = torch.autograd.grad(loss, p)
    assert grad.abs().max() < 1e-10
    # equals the least-squares solution of the stacked system [sqrt(c_f) X_f^T; sqrt(c_r) X_r^T; sqrt(mu) I] P^T = [sqrt(c_f) D^T; 0; 0]
    s, r, d_in = xf.shape[0], xr.shape[0], xf.shape[1]
    lhs = torch.cat([(wf / s) ** 0.5 * xf, (wr / r) ** 0.5 * xr, ridge**0.5 * torch.eye(d_in, dtype=torch.float64)])
    rhs = torch.cat([(wf / s) ** 0.5 * dt, torch.zeros(r + d_in, dt.shape[1], dtype=torch.float64)])
    ref = torch.linalg.lstsq(lhs, rhs).solution.T
    torch.testing.assert_close(sol.delta, ref, rtol=1e-9, atol=1e-10)
    # and any perturbation increases the objective
    bump = 1e-3 * torch.randn_like(sol.delta)
    assert grom_objective(sol.delta + bump, xf, dt, xr, wf, wr, ridge) > grom_objective(sol.delta, xf, dt, xr, wf, wr, ridge)


def test_singular_normal_matrix_with_zero_ridge_is_explained():
    xf, dt, xr = _random_problem(d_in=30, s=5, r=10)  # 15 keys cannot span 30 dimensions
    with pytest.raises(ValueError, match=r"singular.*ridge"):
        solve_grom(xr.T @ xr, xr.shape[0], xf, dt, 1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="ridge"):
        GROMConfig(ridge=-1.0)


def test_woodbury_drop_equals_resolve():
    xf, dt, xr = _random_problem(s=15)
    wf, wr, mu = 1.5, 1.0, 0.05
    sol = solve_grom(xr.T @ xr, xr.shape[0], xf, dt, wf, wr, mu)
    drop = torch.tensor([3, 4, 5])
    keep = torch.tensor([i for i in range(15) if i not in drop.tolist()])
    change = woodbury_drop(sol, xf[drop], dt[drop])
    # re-solve without those keys at the same per-key weight c = w_f/s
    resolved = solve_grom(xr.T @ xr, xr.shape[0], xf[keep], dt[keep], sol.forget_scale * len(keep), wr, mu)
    torch.testing.assert_close(sol.delta + change, resolved.delta, rtol=1e-9, atol=1e-11)


def test_lora_factors_exact_and_truncated():
    g = torch.Generator().manual_seed(1)
    p = torch.randn(20, 5, generator=g, dtype=torch.float64) @ torch.randn(5, 30, generator=g, dtype=torch.float64)
    exact = lora_factors(p)
    assert exact.rank == 5 and exact.relative_error < 1e-12 and not exact.truncated
    torch.testing.assert_close(exact.lora_B @ exact.lora_A, p, rtol=0, atol=1e-10)
    cut = lora_factors(p, max_rank=2)
    true_err = float((p - cut.lora_B @ cut.lora_A).norm() / p.norm())
    assert cut.rank == 2 and cut.truncated and abs(cut.relative_error - true_err) < 1e-9 and cut.relative_error > 0.01


def _nll(model, tok, rows):
    return float(answer_nll(model, tok, [r["question"] for r in rows], [r["answer"] for r in rows]).mean())


@pytest.fixture(scope="module")
def sets(synthetic):
    return synthetic["forget10"], synthetic["retain90"]


@pytest.fixture(scope="module")
def tiny(tiny_pair):
    from hf_unlearn.bench.subjects import load_tiny

    return load_tiny(tiny_pair.target)


@pytest.fixture(scope="module")
def strong_edit(tiny, sets):
    model, tok = tiny
    return fit_grom(model, tok, *sets, GROMConfig(**STRONG))


def test_edit_unlearns_forget_much_more_than_retain(tiny, sets, strong_edit):
    model, tok = tiny
    forget, retain = sets
    f0, r0 = _nll(model, tok, forget), _nll(model, tok, retain)
    strong_edit.apply_(model)
    try:
        f1, r1 = _nll(model, tok, forget), _nll(model, tok, retain)
    finally:
        strong_edit.apply_(model, -1)
    assert f0 < 0.3  # the target memorizes the forget set
    assert f1 - f0 > 2.0, (f0, f1)
    assert r1 - r0 < 0.3, (r0, r1)
    assert (f1 - f0) > 8 * max(r1 - r0, 0.01)
    assert strong_edit.stats["num_forget_keys"] > 0 and strong_edit.stats["forward_passes_over_data"] == 1


def test_lora_round_trip_is_exact(tiny, tiny_pair, sets, tmp_path):
    from peft import PeftModel

    from hf_unlearn.bench.subjects import load_tiny

    model, tok = tiny
    forget, retain = sets
    edit = fit_grom(model, tok, forget[:8], retain[:60], GROMConfig(
        target_modules=["down_proj", "lm_head"], layers=[1], progress=False))
    assert set(edit.deltas) == {"model.layers.1.mlp.down_proj", "lm_head"}
    edit.save_pretrained(tmp_path / "adapter")
    cfg = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    meta = json.loads((tmp_path / "adapter" / "grom_metadata.json").read_text())
    assert cfg["lora_alpha"] == cfg["r"] == meta["lora_rank"]
    assert all(not m["truncated"] for m in meta["modules"].values())
    base, _ = load_tiny(tiny_pair.target)
    reference = {n: m.weight.detach().clone() for n, m in base.named_modules() if n in edit.deltas}
    merged = PeftModel.from_pretrained(base, tmp_path / "adapter").merge_and_unload()
    modules = dict(merged.named_modules())
    for name, p in edit.deltas.items():
        err = (modules[name].weight - (reference[name] + p)).abs().max()
        assert err < 1e-5, (name, float(err))
    # to_peft gives the same outputs as adding P in place
    ids = torch.tensor([tok("Question: who?\nAnswer: The")["input_ids"]])
    base2, _ = load_tiny(tiny_pair.target)
    with torch.no_grad():
        want = edit.apply_(base2)(input_ids=ids).logits
        base3, _ = load_tiny(tiny_pair.target)
        got = edit.to_peft(base3)(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_truncated_export_reports_error(tiny, sets, tmp_path):
    model, tok = tiny
    forget, retain = sets
    edit = fit_grom(model, tok, forget[:4], retain[:40], GROMConfig(target_modules="lm_head", max_rank=3, progress=False))
    edit.save_pretrained(tmp_path)
    meta = json.loads((tmp_path / "grom_metadata.json").read_text())["modules"]["lm_head"]
    p = edit.deltas["lm_head"].double()
    s = torch.linalg.svdvals(p)
    expected = float((s[3:] ** 2).sum().sqrt() / p.norm())
    assert meta["truncated"] and meta["rank"] == 3
    assert abs(meta["relative_frobenius_error"] - expected) < 1e-6


def test_influence_equals_resolve_without_example(strong_edit):
    edit = strong_edit
    name = "lm_head"
    sol = edit.solutions[name]
    keys, targets, ex = edit.forget_keys[name].double(), edit.targets[name].double(), edit.example_ids
    a = sol.chol @ sol.chol.T
    c = sol.forget_scale
    for i in (0, 7):
        rows, rest = ex == i, ex != i
        assert rows.any()
        a_i = a - c * keys[rows].T @ keys[rows]
        resolved = torch.linalg.solve(a_i, c * keys[rest].T @ targets[rest]).T
        change = edit.influence(i)[name]
        torch.testing.assert_close(edit.solutions[name].delta + change, resolved, rtol=1e-7, atol=1e-9)
        assert change.norm() > 0
    with pytest.raises(ValueError, match="example_index"):
        edit.influence(10_000)


def test_auto_layer_selection_scores_match_reference(tiny, sets):
    model, tok = tiny
    forget, retain = sets
    forget, retain = forget[:6], retain[:30]
    edit = fit_grom(model, tok, forget, retain, GROMConfig(layers="auto", num_layers=1, progress=False))
    scores = edit.layer_scores
    assert sorted(scores) == [0, 1]
    best = max(scores, key=lambda k: scores[k]["score"])
    assert edit.selected_layers == [best] and list(edit.deltas) == [f"model.layers.{best}.mlp.down_proj"]
    # slow reference: autograd of the gold logit through final norm + LM head w.r.t. the residual, dotted with
    # each layer's MLP output, averaged over answer-predicting positions
    from hf_unlearn.data import collate_qa, tokenize_qa

    outs, final = {}, {}

    def mean_contrib(rows):
        sums, count = np.zeros(2), 0
        for r in rows:
            batch = collate_qa([tokenize_qa(tok, r["question"], r["answer"])], tok.pad_token_id)
            hooks = [model.model.layers[i].mlp.register_forward_hook(lambda m, a, o, i=i: outs.__setitem__(i, o)) for i in range(2)]
            hooks.append(model.model.norm.register_forward_hook(lambda m, a, o: final.__setitem__("h", a[0])))
            with torch.no_grad():
                model(input_ids=batch["input_ids"])
            for h in hooks:
                h.remove()
            labels = batch["labels"][0]
            for t in range(labels.shape[0] - 1):
                if labels[t + 1] == -100:
                    continue
                h = final["h"][0, t].detach().clone().requires_grad_(True)
                logit = model.lm_head(model.model.norm(h))[labels[t + 1]]
                (g,) = torch.autograd.grad(logit, h)
                for i in range(2):
                    sums[i] += float(g @ outs[i][0, t])
                count += 1
        return sums / count

    f_ref, r_ref = mean_contrib(forget), mean_contrib(retain)
    for i in range(2):
        assert abs(scores[i]["forget"] - f_ref[i]) < 1e-4 * (1 + abs(f_ref[i]))
        assert abs(scores[i]["retain"] - r_ref[i]) < 1e-4 * (1 + abs(r_ref[i]))
        assert abs(scores[i]["score"] - (f_ref[i] - r_ref[i])) < 1e-3


def test_representation_corruption_targets(tiny, sets):
    model, tok = tiny
    forget, retain = sets
    edit = fit_grom(model, tok, forget[:4], retain[:40], GROMConfig(
        objective="representation_corruption", layers=[1], progress=False))
    d = edit.targets["model.layers.1.mlp.down_proj"]
    nz = d[d.norm(dim=-1) > 0]
    assert nz.shape[0] > 0
    cos = (nz / nz.norm(dim=-1, keepdim=True)) @ (nz[0] / nz[0].norm())
    assert torch.allclose(cos, torch.ones_like(cos))  # one fixed direction


def test_bad_input(tiny, sets):
    model, tok = tiny
    forget, retain = sets
    cfg = GROMConfig(progress=False)
    with pytest.raises(ValueError, match=r"matches no module.*down_proj"):
        fit_grom(model, tok, forget, retain, GROMConfig(target_modules="c_fc", progress=False))
    with pytest.raises(ValueError, match="no answer tokens"):
        fit_grom(model, tok, forget, retain, GROMConfig(max_length=2, progress=False))
    with pytest.raises(ValueError, match="singular"):  # 2 forget examples, no retain term, no ridge
        fit_grom(model, tok, forget[:2], retain[:2], GROMConfig(ridge=0.0, retain_weight=0.0, layers=[1], progress=False))
    with pytest.raises(ValueError, match="empty"):
        fit_grom(model, tok, [], retain, cfg)
    with pytest.raises(ValueError, match="disjoint"):
        fit_grom(model, tok, forget, retain + forget[:1], cfg)
    with pytest.raises(ValueError, match=r"layers \[7\]"):
        fit_grom(model, tok, forget, retain, GROMConfig(layers=[7], progress=False))
    with pytest.raises(ValueError, match="residual stream"):
        fit_grom(model, tok, forget, retain, GROMConfig(target_modules="up_proj", progress=False))
    big = type(tok).from_pretrained(tok.name_or_path)
    big.add_tokens([f"extra_token_{i}" for i in range(64)])
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        fit_grom(model, big, forget, retain, cfg)


def test_gpt2_conv1d_refused_by_name():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=32))
    from hf_unlearn.grom import find_target_modules

    with pytest.raises(ValueError, match="Conv1D"):
        find_target_modules(gpt2, ["c_proj"])


def test_normal_matrix_formula():
    xf, _, xr = _random_problem()
    a = normal_matrix(xr.T @ xr, xr.shape[0], xf, 2.0, 3.0, 0.5)
    ref = 3.0 / xr.shape[0] * xr.T @ xr + 2.0 / xf.shape[0] * xf.T @ xf + 0.5 * torch.eye(xf.shape[1], dtype=torch.float64)
    torch.testing.assert_close(a, ref)
