"""GROM: solver minimality, Woodbury audit, exact LoRA round trip, unlearning effect, layer attribution, bad input."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from hf_unlearn.logprobs import answer_nll
from hf_unlearn.methods.grom import GROMConfig, fit_grom
from hf_unlearn.methods.grom.peft_export import lora_factors
from hf_unlearn.methods.grom.solve import normal_matrix, solve_grom, woodbury_drop

# Hyperparameters that give a strong, specific effect on the tiny memorizing model (see the report).
STRONG = dict(target_modules="lm_head", forget_weight=10.0, suppression_margin=30.0, ridge=1e-2, progress=False)


def grom_objective(delta, forget_keys, targets, retain_keys, forget_weight=1.0, retain_weight=1.0, ridge=1e-2):
    """Slow reference: ``L(P) = (w_f/s)||P X_f - D||^2 + (w_r/r)||P X_r||^2 + mu ||P||^2`` (keys as rows)."""
    s, r = forget_keys.shape[0], retain_keys.shape[0]
    fit = ((forget_keys @ delta.T - targets) ** 2).sum()
    keep = ((retain_keys @ delta.T) ** 2).sum() if r else delta.new_zeros(())
    return (forget_weight / s) * fit + (retain_weight / max(r, 1)) * keep + ridge * (delta**2).sum()


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
    from hf_unlearn.demo import load_tiny

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


def test_lora_round_trip_is_exact(tiny_pair, sets, tmp_path):
    from peft import PeftModel

    from hf_unlearn.demo import load_tiny

    model, tok = load_tiny(tiny_pair.target)  # a fresh base: the fingerprint is exact
    forget, retain = sets
    edit = fit_grom(model, tok, forget[:2], retain[:60], GROMConfig(  # fewer keys than the factor budget: exact
        target_modules=["down_proj", "lm_head"], layers=[1], progress=False))
    assert set(edit.deltas) == {"model.layers.1.mlp.down_proj", "lm_head"}
    edit.save_pretrained(tmp_path / "adapter")
    cfg = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    meta = json.loads((tmp_path / "adapter" / "grom_metadata.json").read_text())
    assert cfg["lora_alpha"] == cfg["r"] == meta["lora_rank"]
    assert all(not m["truncated"] for m in meta["modules"].values())
    assert all(m["rank"] <= edit.stats["num_forget_keys"] for m in meta["modules"].values())
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
    s = torch.linalg.svdvals(edit.solutions["lm_head"].delta)
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
    edit = fit_grom(model, tok, forget, retain, GROMConfig(layers="auto", candidate_layers=[0, 1], num_layers=1,
                                                           progress=False))
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
    with pytest.raises(ValueError, match=r"forget example 0: .*no room for an answer token.*max_length"):
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
    from hf_unlearn.methods.grom.attribution import find_target_modules

    with pytest.raises(ValueError, match="Conv1D"):
        find_target_modules(gpt2, ["c_proj"])


def test_normal_matrix_formula():
    xf, _, xr = _random_problem()
    a = normal_matrix(xr.T @ xr, xr.shape[0], xf, 2.0, 3.0, 0.5)
    ref = 3.0 / xr.shape[0] * xr.T @ xr + 2.0 / xf.shape[0] * xf.T @ xf + 0.5 * torch.eye(xf.shape[1], dtype=torch.float64)
    torch.testing.assert_close(a, ref)


# ----- save / load / push (#17.3), provenance (#12.6) -------------------------------------------------------------


@pytest.fixture(scope="module")
def two_module_edit(tiny_pair, sets):
    from hf_unlearn.demo import load_tiny

    model, tok = load_tiny(tiny_pair.target)  # a fresh base (others apply_ and undo edits on `tiny`, not bit-exact)
    forget, retain = sets  # two rows: fewer forget keys than the factor budget, so the export is exact
    return fit_grom(model, tok, forget[:2], retain[:60], GROMConfig(
        target_modules=["down_proj", "lm_head"], layers=[1], progress=False))


def _assert_same_audit(loaded, edit):
    assert loaded.num_forget_examples == edit.num_forget_examples
    assert torch.equal(loaded.example_ids, edit.example_ids)  # integer ids
    for name, p in edit.deltas.items():  # P recomputed from the audit's Cholesky factor, keys and targets
        torch.testing.assert_close(loaded.deltas[name], p, rtol=1e-6, atol=1e-9)
    for i in range(edit.num_forget_examples):
        want, got = edit.influence(i), loaded.influence(i)
        assert set(got) == set(want)
        for name in want:
            # Recomputed from the loaded (contiguous) factors: the BLAS path, hence the last bits, may differ from
            # the in-memory views'. Measured differences are ~3e-15 of the largest entry (float64, other layouts
            # and thread counts); 1e-10 leaves five orders of margin and still catches any wrong audit state.
            scale = float(want[name].abs().max())
            torch.testing.assert_close(got[name], want[name], rtol=1e-10, atol=1e-10 * scale,
                                       msg=lambda m, where=(i, name): f"influence{where}: {m}")


def _fresh(tiny_pair):
    from hf_unlearn.demo import load_tiny

    return load_tiny(tiny_pair.target)


def test_save_and_from_pretrained_restore_the_audit(tiny_pair, two_module_edit, tmp_path):
    from peft import PeftModel

    model, tok = _fresh(tiny_pair)
    edit = two_module_edit
    out = tmp_path / "adapter"
    edit.save_pretrained(out)
    assert sorted(p.name for p in out.iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors", "grom_audit.safetensors", "grom_metadata.json"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left behind
    meta = json.loads((out / "grom_metadata.json").read_text())
    assert "batch_size" not in meta["config"] and "progress" not in meta["config"]  # runtime settings not saved
    every = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    assert set(meta["base_fingerprint"]["parameters"]) == every  # every weight, not only the edited ones

    from hf_unlearn.methods.grom import GROMEdit

    loaded = GROMEdit.from_pretrained(out, model=model)
    assert loaded.config.saved_dict() == edit.config.saved_dict()
    assert loaded.selected_layers == edit.selected_layers and loaded.retain_indices == edit.retain_indices
    _assert_same_audit(loaded, edit)
    # PEFT loads the same folder and computes W + P
    ids = torch.tensor([tok("Question: who?\nAnswer: The")["input_ids"]])
    with torch.no_grad():
        want = edit.apply_(_fresh(tiny_pair)[0])(input_ids=ids).logits
        got = PeftModel.from_pretrained(model, out)(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_save_refuses_overwrite_and_non_finite(two_module_edit, tmp_path):
    from dataclasses import replace

    from hf_unlearn.safe_output import OutputDirError

    out = tmp_path / "adapter"
    two_module_edit.save_pretrained(out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(OutputDirError, match="already holds an adapter"):
        two_module_edit.save_pretrained(out)
    bad = replace(two_module_edit, deltas={**two_module_edit.deltas, "lm_head": two_module_edit.deltas["lm_head"].clone()})
    bad.deltas["lm_head"][0, 0] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        bad.save_pretrained(out, overwrite=True)
    with pytest.raises(ValueError, match="non-finite"):
        bad.save_pretrained(tmp_path / "fresh")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the previous adapter is untouched
    assert not (tmp_path / "fresh").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"]
    # overwrite replaces the adapter as a whole (no audit file left from the previous save) and keeps other files
    (out / "logs.jsonl").write_text("{}\n")
    two_module_edit.save_pretrained(out, overwrite=True, save_audit=False)
    assert sorted(p.name for p in out.iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors", "grom_metadata.json", "logs.jsonl"]
    # a run folder holding only other files (the CLI's logs) takes the adapter beside them
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    two_module_edit.save_pretrained(run_dir)
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors", "grom_audit.safetensors", "grom_metadata.json", "logs"]
    shutil.rmtree(run_dir)

    from hf_unlearn.methods.grom import GROMEdit

    slim = GROMEdit.from_pretrained(out)
    for name, p in two_module_edit.deltas.items():  # P from the LoRA factors B @ A
        torch.testing.assert_close(slim.deltas[name], p, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="audit state"):
        slim.influence(0)
    with pytest.raises(ValueError, match="not a GROM adapter"):
        (out / "grom_metadata.json").unlink()
        GROMEdit.from_pretrained(out)


def test_load_grom_adapter_checks_the_base(tiny_pair, two_module_edit, tmp_path):
    from hf_unlearn.demo import load_tiny
    from hf_unlearn.integrity import BaseModelMismatchError
    from hf_unlearn.methods.grom import load_grom_adapter

    two_module_edit.save_pretrained(tmp_path / "a")
    base, tok = load_tiny(tiny_pair.target)
    ids = torch.tensor([tok("Question: who?\nAnswer: The")["input_ids"]])
    peft_model = load_grom_adapter(base, tmp_path / "a")
    with torch.no_grad():
        got = peft_model(input_ids=ids).logits
        ref, _ = load_tiny(tiny_pair.target)
        want = two_module_edit.apply_(ref)(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # the fingerprint is of the stored bytes: the same base held in bfloat16 is refused in one line naming the dtype
    bf16, _ = load_tiny(tiny_pair.target)
    with pytest.raises(BaseModelMismatchError, match=r"and \d+ more weights: dtype bfloat16 != float32 \(load the base"):
        two_module_edit.verify_base(bf16.to(torch.bfloat16))
    # an already-edited model is a different base: to_peft refuses to stack the edit twice
    edited, _ = load_tiny(tiny_pair.target)
    two_module_edit.apply_(edited)
    with pytest.raises(BaseModelMismatchError, match="another base"):
        two_module_edit.to_peft(edited)




def test_push_to_hub_one_commit_and_pull_back(hub, tiny_pair, two_module_edit):
    from peft import PeftModel

    from hf_unlearn.methods.grom import GROMEdit

    model, tok = _fresh(tiny_pair)
    report = {"forget_quality": 0.5, "model_utility": 0.4, "forget_rouge_l": 0.3, "forget_truth_ratio": 0.6,
              "forget_split": "forget10", "model_name": two_module_edit.base_model_name_or_path}
    two_module_edit.push_to_hub("tester/grom", token=hub.token, report=report)
    commits = hub.commits("tester/grom")
    assert [c.title for c in commits[:-1]] == ["initial commit"]  # the repo's creation, then our one commit
    files = hub.files("tester/grom")
    assert {"adapter_config.json", "adapter_model.safetensors", "grom_metadata.json", "grom_audit.safetensors",
            "README.md", "unlearning_report.json"} <= set(files)
    assert json.loads(files["unlearning_report.json"]) == report
    pulled = GROMEdit.from_pretrained("tester/grom", model=model)
    _assert_same_audit(pulled, two_module_edit)
    ids = torch.tensor([tok("Question: who?\nAnswer: The")["input_ids"]])
    with torch.no_grad():
        want = two_module_edit.apply_(_fresh(tiny_pair)[0])(input_ids=ids).logits
        got = PeftModel.from_pretrained(model, "tester/grom")(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError):
        two_module_edit.push_to_hub("not a repo id!", token=hub.token)
    assert len(hub.commits("tester/grom")) == 2


# ----- cost: retain_sample (#16.5) ---------------------------------------------------------------------------------


def test_default_retain_subsample_is_deterministic():
    from hf_unlearn.methods.grom.inputs import retain_subsample

    k = GROMConfig().retain_sample
    assert k == 256
    a, b = retain_subsample(3600, k, 0), retain_subsample(3600, k, 0)
    assert a == b and len(a) == k == len(set(a)) and a == sorted(a) and 0 <= a[0] and a[-1] < 3600
    assert retain_subsample(3600, k, 1) != a
    assert retain_subsample(180, k, 0) == list(range(180))  # a small retain set is read whole
    assert retain_subsample(10, None, 0) == list(range(10))
    # uniform: over many seeds every row is drawn about k / n of the time
    counts = torch.zeros(40)
    for seed in range(400):
        counts[retain_subsample(40, 10, seed)] += 1
    assert (counts / 400 - 0.25).abs().max() < 0.09


def _module_inputs(model, tok, rows, module):
    """Slow reference: inputs of ``module`` at every answer-predicting position, one example at a time."""
    from hf_unlearn.data import collate_qa, tokenize_qa

    keys, seen = [], {}
    hook = module.register_forward_hook(lambda m, a, o: seen.__setitem__("x", a[0]))
    try:
        for r in rows:
            batch = collate_qa([tokenize_qa(tok, r["question"], r["answer"])], tok.pad_token_id)
            with torch.no_grad():
                model(input_ids=batch["input_ids"])
            labels = batch["labels"][0]
            for t in range(labels.shape[0] - 1):
                if labels[t + 1] != -100:
                    keys.append(seen["x"][0, t].double())
    finally:
        hook.remove()
    return torch.stack(keys)


def test_retain_sample_solve_satisfies_its_objective(tiny, sets):
    from hf_unlearn.methods.grom.inputs import retain_subsample

    model, tok = tiny
    forget, retain = sets
    cfg = GROMConfig(target_modules="lm_head", retain_sample=40, seed=3, progress=False)
    edit = fit_grom(model, tok, forget[:6], retain, cfg)
    assert edit.retain_indices == retain_subsample(len(retain), 40, 3)
    assert edit.stats["num_retain_rows_read"] == 40
    again = fit_grom(model, tok, forget[:6], retain, cfg)
    assert torch.equal(again.deltas["lm_head"], edit.deltas["lm_head"])
    # P is the minimiser of the objective whose retain term holds exactly the sampled rows' keys
    xr = _module_inputs(model, tok, [retain[i] for i in edit.retain_indices], model.lm_head)
    assert xr.shape[0] == edit.stats["num_retain_keys"]
    xf, dt = edit.forget_keys["lm_head"].double(), edit.targets["lm_head"].double()
    w = (cfg.forget_weight, cfg.retain_weight, cfg.ridge)
    p = edit.solutions["lm_head"].delta.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(grom_objective(p, xf, dt, xr, *w), p)
    scale = float((cfg.forget_weight / xf.shape[0]) * (xf.T @ dt).abs().max())
    assert float(grad.abs().max()) < 1e-6 * scale
    # ... and not of the objective over all retain rows (the sample really is what was read)
    xr_all = _module_inputs(model, tok, retain, model.lm_head)
    (grad_all,) = torch.autograd.grad(grom_objective(p, xf, dt, xr_all, *w), p)
    assert float(grad_all.abs().max()) > 1e-3 * scale
    # the Woodbury audit stays exact on the sampled solve
    a = edit.solutions["lm_head"].chol @ edit.solutions["lm_head"].chol.T
    c = edit.solutions["lm_head"].forget_scale
    rows = edit.example_ids == 2
    resolved = torch.linalg.solve(a - c * xf[rows].T @ xf[rows], c * xf[~rows].T @ dt[~rows]).T
    torch.testing.assert_close(edit.solutions["lm_head"].delta + edit.influence(2)["lm_head"], resolved,
                               rtol=1e-7, atol=1e-9)


# ----- length limits (#12.7) ---------------------------------------------------------------------------------------


def _short_gpt2(n_positions=64):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    words = ["<unk>", "<eos>", "Question:", "Answer:", *[f"w{i}" for i in range(40)]]
    vocab = {w: i for i, w in enumerate(words)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>", pad_token="<eos>")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(
        vocab_size=len(vocab), n_positions=n_positions, n_embd=32, n_layer=2, n_head=2, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=1, pad_token_id=1))
    return model.eval(), tok


def test_gpt2_answers_longer_than_n_positions_are_cut():
    from hf_unlearn.methods.grom.inputs import model_max_positions

    model, tok = _short_gpt2(64)
    assert model_max_positions(model) == 64

    def row(i, n):
        return {"question": f"w{i} w{i + 1}", "answer": " ".join(f"w{(i + j) % 40}" for j in range(n))}

    forget = [row(i, 150) for i in range(3)]  # 150-word answers, well past 64 positions
    retain = [row(i, 90 + i) for i in range(10, 30)]
    edit = fit_grom(model, tok, forget, retain, GROMConfig(target_modules="lm_head", progress=False))
    # each example is cut to 64 tokens: prompt "Question: wi wi+1 Answer:" (4 tokens) + 60 answer tokens
    assert edit.stats["num_forget_keys"] == 3 * 60 and edit.stats["num_retain_keys"] == 20 * 60
    assert edit.stats["max_positions"] == 64 and torch.isfinite(edit.deltas["lm_head"]).all()
    # a prompt that alone fills the 64 positions is refused before any forward pass
    long_q = [{"question": " ".join(["w1"] * 70), "answer": "w2 w3"}]
    with pytest.raises(ValueError, match=r"forget example 0: .*no room .* 64 tokens, the model's maximum positions"):
        fit_grom(model, tok, long_q, retain, GROMConfig(target_modules="lm_head", progress=False))


# ----- config ------------------------------------------------------------------------------------------------------


def test_config_fields_documented_and_band_defaults():
    from dataclasses import fields

    from hf_unlearn.methods.grom.config import RUNTIME_FIELDS

    for f in fields(GROMConfig):
        assert f.metadata.get("help"), f.name
        assert f"{f.name} (`" in GROMConfig.__doc__, f.name  # listed in the docstring with its default
    cfg = GROMConfig()
    assert cfg.band_width(30) == 3 and cfg.band_width(2) == 1 and GROMConfig(num_layers=5).band_width(30) == 5
    assert set(cfg.to_dict()) - set(cfg.saved_dict()) == set(RUNTIME_FIELDS)
    assert GROMConfig.from_saved(cfg.saved_dict()).to_dict() == cfg.to_dict()
    with pytest.raises(ValueError, match="unknown fields"):
        GROMConfig.from_saved({"nonsense": 1})
    with pytest.raises(ValueError, match="retain_sample"):
        GROMConfig(retain_sample=0)


def test_two_pass_auto_equals_one_pass_and_deep_models_take_two(tiny, sets):
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_unlearn.methods.grom.attribution import find_target_modules
    from hf_unlearn.methods.grom.fit import _one_pass_affordable

    model, tok = tiny
    forget, retain = sets
    one = fit_grom(model, tok, forget[:6], retain[:30], GROMConfig(progress=False))
    two = fit_grom(model, tok, forget[:6], retain[:30], GROMConfig(progress=False, max_stat_memory_gb=0.0))
    assert (one.stats["forward_passes_over_data"], two.stats["forward_passes_over_data"]) == (1, 2)
    assert one.selected_layers == two.selected_layers
    for name, p in one.deltas.items():
        torch.testing.assert_close(two.deltas[name], p, rtol=1e-5, atol=1e-7)
    # a SmolLM2-135M-shaped model (30 layers, hidden 576, MLP 1536): collecting the retain moments of all 30
    # down-projections would cost more than the second forward pass, so auto selection reads only the band's keys
    config = LlamaConfig(num_hidden_layers=30, hidden_size=576, intermediate_size=1536, vocab_size=49152,
                         num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
    with torch.device("meta"):
        deep = LlamaForCausalLM(config)
    candidates = find_target_modules(deep, ["down_proj"])
    band = GROMConfig().band_width(len(candidates))
    assert len(candidates) == 30 and band == 3
    assert not _one_pass_affordable(deep, candidates, band, 2000, 4.0)
    tiny_candidates = find_target_modules(model, ["down_proj"])
    assert _one_pass_affordable(model, tiny_candidates, 1, 2000, 4.0)


def test_prompt_template_is_passed_to_the_prompt_module():
    from hf_unlearn.data.prompts import tokenize_qa

    model, tok = _short_gpt2(64)
    forget = [{"question": f"w{i} w{i + 1}", "answer": " ".join(f"w{(i + j) % 40}" for j in range(5))} for i in range(4)]
    retain = [{"question": f"w{i}", "answer": f"w{i + 2} w{i + 3} w{i + 4}"} for i in range(10, 30)]

    def keys(template):  # reference: answer-predicting positions of the prompt module's labels
        return sum(sum(label != -100 for label in tokenize_qa(tok, r["question"], r["answer"], template=template)
                       ["labels"]) for r in forget)

    for template in (None, "tofu-phi"):
        edit = fit_grom(model, tok, forget, retain, GROMConfig(target_modules="lm_head", prompt_template=template,
                                                               progress=False))
        assert edit.stats["num_forget_keys"] == keys(template)
        assert edit.config.saved_dict()["prompt_template"] == template
    assert keys("tofu-phi") == keys(None) + len(forget)  # tofu-phi scores "Answer:" with the answer
    with pytest.raises(ValueError, match="nknown prompt template"):
        GROMConfig(prompt_template="no-such-template")


def test_solve_with_factor_is_the_inverse_of_the_factored_matrix():
    """``solve_with_factor(L, B) = A^{-1} B`` for ``A = L L^T``, checked against a float64 dense solve."""
    from hf_unlearn.methods.grom.solve import solve_with_factor

    g = torch.Generator().manual_seed(0)
    m = torch.randn(12, 12, dtype=torch.float64, generator=g)
    a = m @ m.T + 12 * torch.eye(12, dtype=torch.float64)
    b = torch.randn(12, 5, dtype=torch.float64, generator=g)
    torch.testing.assert_close(solve_with_factor(torch.linalg.cholesky(a), b), torch.linalg.solve(a, b))
