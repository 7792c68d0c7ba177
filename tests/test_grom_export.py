"""GROM's export: the LoRA factors from the edit's low-rank form, their size, the audit's size and exactness, and
one factorisation per run."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors import safe_open

from hf_unlearn.methods.grom import GROMConfig, GROMEdit, fit_grom
from hf_unlearn.methods.grom import edit as edit_module
from hf_unlearn.methods.grom.peft_export import factor_budget, lora_factors, pack_lower, unpack_lower
from hf_unlearn.methods.grom.solve import delta_from_cholesky, low_rank_form, solve_grom


def _problem(s: int, d_in: int = 24, d_out: int = 40, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    xf = torch.randn(s, d_in, generator=g, dtype=torch.float64)
    dt = torch.randn(s, d_out, generator=g, dtype=torch.float64)
    xr = torch.randn(50, d_in, generator=g, dtype=torch.float64)
    return solve_grom(xr.T @ xr, 50, xf, dt, 1.5, 1.0, 0.05), xf, dt


def test_low_rank_form_is_the_solved_delta_and_gives_exact_factors():
    sol, xf, dt = _problem(s=5)
    left, right = low_rank_form(sol, xf, dt)
    torch.testing.assert_close(left @ right, sol.delta, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(delta_from_cholesky(sol.chol, xf, dt, sol.forget_scale), sol.delta, rtol=1e-12, atol=0)
    f = lora_factors(None, low_rank=(left, right))
    assert f.rank == 5 and not f.truncated and f.relative_error == 0.0
    torch.testing.assert_close(f.lora_B @ f.lora_A, sol.delta, rtol=1e-10, atol=1e-12)
    # the same factors (up to sign) as the SVD of the dense delta
    dense = lora_factors(sol.delta)
    torch.testing.assert_close(dense.lora_B @ dense.lora_A, f.lora_B @ f.lora_A, rtol=1e-10, atol=1e-12)
    assert f.lora_A.numel() + f.lora_B.numel() < sol.delta.numel()


def test_full_rank_delta_is_cut_at_the_factor_budget_with_its_error():
    sol, xf, dt = _problem(s=60)  # more keys than either dimension: P has full rank 24
    budget = factor_budget(40, 24)
    assert budget == 15
    f = lora_factors(sol.delta, low_rank=low_rank_form(sol, xf, dt))
    assert f.rank == budget and f.truncated
    assert f.lora_A.numel() + f.lora_B.numel() <= sol.delta.numel()
    measured = float((sol.delta - f.lora_B @ f.lora_A).norm() / sol.delta.norm())
    assert abs(f.relative_error - measured) < 1e-9 and f.relative_error > 0
    assert lora_factors(sol.delta, max_rank=4).rank == 4


def test_packed_cholesky_round_trip():
    sol, _, _ = _problem(s=5)
    packed = pack_lower(sol.chol)
    assert packed.numel() == 24 * 25 // 2
    assert torch.equal(unpack_lower(packed), sol.chol)
    with pytest.raises(ValueError, match="lower triangle"):
        unpack_lower(packed[:-1])


@pytest.fixture(scope="module")
def small_edit(tiny_pair, synthetic):
    from hf_unlearn.demo import load_tiny

    model, tok = load_tiny(tiny_pair.target)
    edit = fit_grom(model, tok, synthetic["forget10"][:2], synthetic["retain90"][:40], GROMConfig(
        target_modules=["down_proj", "lm_head"], layers=[1], progress=False))
    return model, tok, edit


def _numbers(path) -> int:
    with safe_open(str(path), "pt") as fh:
        return sum(math.prod(fh.get_slice(k).get_shape()) for k in fh.keys())


def test_saved_adapter_reproduces_the_edit_and_is_no_larger(small_edit, tiny_pair, tmp_path):
    from peft import PeftModel

    from hf_unlearn.demo import load_tiny

    model, tok, edit = small_edit
    edit.save_pretrained(tmp_path / "a")
    meta = json.loads((tmp_path / "a" / "grom_metadata.json").read_text())
    dense = sum(p.numel() for p in edit.deltas.values())
    assert _numbers(tmp_path / "a" / "adapter_model.safetensors") <= dense
    s = edit.stats["num_forget_keys"]
    for info in meta["modules"].values():
        assert info["rank"] <= s and not info["truncated"] and info["relative_frobenius_error"] < 1e-6
    # the audit holds the packed Cholesky factor, c_f, keys and targets: no more than those statistics
    audit_numbers = _numbers(tmp_path / "a" / "grom_audit.safetensors")
    needed = s + sum(p.shape[1] * (p.shape[1] + 1) // 2 + 1 + s * (p.shape[0] + p.shape[1])
                     for p in edit.deltas.values())
    assert audit_numbers <= needed
    ids = torch.tensor([tok("Question: Who wrote it?\nAnswer: The")["input_ids"]])
    with torch.no_grad():
        want = edit.apply_(load_tiny(tiny_pair.target)[0])(input_ids=ids).logits
        got = PeftModel.from_pretrained(load_tiny(tiny_pair.target)[0], tmp_path / "a")(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_loaded_audit_is_exact_against_a_refit_without_the_example(small_edit, tmp_path):
    _, _, edit = small_edit
    edit.save_pretrained(tmp_path / "a")
    loaded = GROMEdit.from_pretrained(tmp_path / "a")
    for name in edit.deltas:
        sol = loaded.solutions[name]
        keys, targets, ex = loaded.forget_keys[name].double(), loaded.targets[name].double(), loaded.example_ids
        a, c = sol.chol @ sol.chol.T, sol.forget_scale
        torch.testing.assert_close(sol.delta, edit.solutions[name].delta, rtol=1e-9, atol=1e-12)
        rows, rest = ex == 1, ex != 1
        resolved = torch.linalg.solve(a - c * keys[rows].T @ keys[rows], c * keys[rest].T @ targets[rest]).T
        torch.testing.assert_close(sol.delta + loaded.influence(1)[name], resolved, rtol=1e-7, atol=1e-9)


def test_one_factorisation_per_run(tiny_pair, synthetic, tmp_path, monkeypatch):
    from hf_unlearn.demo import load_tiny
    from hf_unlearn.methods.grom import GROMConfig, GROMFit

    calls = []
    real = edit_module.lora_factors

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(edit_module, "lora_factors", spy)
    model, tok = load_tiny(tiny_pair.target)
    settings = {"target_modules": ["down_proj", "lm_head"], "layers": [1]}
    result = GROMFit()(model, tok, synthetic["forget10"][:2], synthetic["retain90"][:40], GROMConfig(**settings))
    result.artifact.save_pretrained(tmp_path / "a")
    result.artifact.truncation_errors()
    assert len(calls) == 2  # one per edited module, for the merge, the size, the errors and the save together
