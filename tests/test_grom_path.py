"""GROM's strength path: every point is the exact edit of its settings, from one key collection, and selection
picks one with the criterion's rule and records it in the saved adapter."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from hf_unlearn.methods.grom import GROMConfig, GROMEdit, fit_grom
from hf_unlearn.methods.grom.strength_path import fit_grom_path, grom_path_from_edit

BASE = dict(target_modules="lm_head", forget_weight=10.0, suppression_margin=30.0, retain_weight=1.0, ridge=1e-2,
            progress=False)


@pytest.fixture(scope="module")
def tiny(tiny_pair):
    from hf_unlearn.demo import load_tiny

    return load_tiny(tiny_pair.target)


@pytest.fixture(scope="module")
def sets(synthetic):
    return synthetic["forget10"], synthetic["retain90"][:60]


@pytest.fixture(scope="module")
def path(tiny, sets):
    model, tok = tiny
    return fit_grom_path(model, tok, *sets, GROMConfig(**BASE), scales=(0.5, 1.0, 2.0), retain_weights=(1.0, 10.0),
                         ridges=(1e-2, 1e-3))


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_path_points_equal_independent_fits(tiny, sets, path):
    model, tok = tiny
    assert len(path) == 12 and len(path.edits) == len(path.points)
    for w_r, mu in ((10.0, 1e-3), (1.0, 1e-2)):
        i = path.points.index({"scale": 1.0, "retain_weight": w_r, "ridge": mu})
        ref = fit_grom(model, tok, *sets, GROMConfig(**{**BASE, "retain_weight": w_r, "ridge": mu}))
        edit = path.edits[i]
        assert edit.config.retain_weight == w_r and edit.config.ridge == mu
        assert set(edit.deltas) == set(ref.deltas)
        for name, sol in ref.solutions.items():
            assert _relative_error(edit.solutions[name].delta, sol.delta) < 1e-6
            torch.testing.assert_close(edit.solutions[name].delta, sol.delta, rtol=1e-6, atol=1e-9)
            torch.testing.assert_close(edit.deltas[name], ref.deltas[name], rtol=1e-5, atol=1e-7)


def test_scale_points_are_exact_multiples_and_the_order_is_by_edit_size(path):
    unit = path.points.index({"scale": 1.0, "retain_weight": 10.0, "ridge": 1e-3})
    for scale in (0.5, 2.0):
        j = path.points.index({"scale": scale, "retain_weight": 10.0, "ridge": 1e-3})
        assert path.edits[j].stats["target_scale"] == scale
        for name, sol in path.edits[unit].solutions.items():
            torch.testing.assert_close(path.edits[j].solutions[name].delta, scale * sol.delta, rtol=1e-12, atol=0)
            torch.testing.assert_close(path.edits[j].targets[name], scale * path.edits[unit].targets[name])
    assert path.norms == sorted(path.norms)
    # a weaker retain weight or a smaller ridge never makes the same-scale edit smaller
    small = path.points.index({"scale": 1.0, "retain_weight": 10.0, "ridge": 1e-2})
    large = path.points.index({"scale": 1.0, "retain_weight": 1.0, "ridge": 1e-2})
    assert small < large


def test_path_point_audit_is_consistent(path):
    """influence() of a path point equals a re-solve without the example (the audit state is the point's own)."""
    from hf_unlearn.methods.grom.solve import solve_grom

    edit = path.edits[path.points.index({"scale": 2.0, "retain_weight": 10.0, "ridge": 1e-3})]
    name = next(iter(edit.solutions))
    sol = edit.solutions[name]
    keys, targets = edit.forget_keys[name].double(), edit.targets[name]
    rows = (edit.example_ids == 0).nonzero().squeeze(-1)
    keep = (edit.example_ids != 0).nonzero().squeeze(-1)
    # A minus the dropped keys' term at the same per-key weight, solved directly
    xf = keys
    a = sol.chol @ sol.chol.T - sol.forget_scale * (xf[rows].T @ xf[rows])
    rhs = sol.forget_scale * (xf[keep].T @ targets[keep])
    expected = torch.linalg.solve(a, rhs).T - sol.delta
    torch.testing.assert_close(edit.influence(0)[name], expected, rtol=1e-6, atol=1e-9)
    assert callable(solve_grom)


def test_from_edit_refuses_bad_grids(tiny, sets, path):
    edit = path.edits[0]
    with pytest.raises(ValueError, match="scales"):
        grom_path_from_edit(edit, scales=(0.0,))
    with pytest.raises(ValueError, match="ridges"):
        grom_path_from_edit(edit, ridges=(-1.0,))
    with pytest.raises(ValueError, match="audit state"):
        grom_path_from_edit(dataclasses.replace(edit, solutions={}))


def test_fit_grom_path_refuses_a_bad_grid_before_any_forward_pass(tiny, sets, monkeypatch):
    import hf_unlearn.methods.grom.strength_path as path_module

    model, tok = tiny
    monkeypatch.setattr(path_module, "_fit_grom", lambda *a, **k: pytest.fail("keys were collected"))
    with pytest.raises(ValueError, match="retain_weights must be finite"):
        fit_grom_path(model, tok, *sets, GROMConfig(**BASE), retain_weights=(1.0, float("inf")))


def test_select_picks_by_the_rule_restores_the_model_and_saves_the_record(tiny, sets, synthetic, tmp_path):
    from hf_unlearn.selection import SelectionCriterion

    model, tok = tiny
    forget, retain = sets
    small = fit_grom_path(model, tok, forget, retain, GROMConfig(**BASE), scales=(0.25, 1.0), retain_weights=(1.0,))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    criterion = SelectionCriterion(forget, synthetic["holdout10"], synthetic["retain90"][100:120])
    chosen = small.select(criterion, model, tok)
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n  # restored bit for bit (copied back, not subtracted)
    record = small.record
    assert len(record.measurements) == 2 and chosen is small.edits[record.index]
    expected, _, _ = __import__("hf_unlearn.selection", fromlist=["select_candidate"]).select_candidate(
        record.measurements, criterion.retain_tolerance, criterion.holdout_level)
    assert record.index == expected
    # the stronger point moves the forget rows toward the holdout rows (the target memorises them)
    assert record.measurements[1]["forget_nll"] > record.measurements[0]["forget_nll"]
    chosen.save_pretrained(tmp_path / "adapter")
    meta = json.loads((tmp_path / "adapter" / "grom_metadata.json").read_text())
    assert meta["stats"]["selection"]["index"] == record.index
    assert meta["stats"]["selection"]["candidates"][record.index]["scale"] == small.points[record.index]["scale"]
    loaded = GROMEdit.from_pretrained(tmp_path / "adapter", model=model)
    assert loaded.stats["selection"]["reason"] == record.reason


def test_path_from_the_saved_factor_equals_the_fitted_path_and_direct_solves(tiny, sets, path, tmp_path):
    """The path rebuilt from a loaded edit (preservation recovered from L L^T) gives the fitted path's points, each
    the direct closed-form solve of its settings at several strengths."""
    from hf_unlearn.methods.grom.solve import normal_matrix

    model, tok = tiny
    base = path.base
    base.save_pretrained(tmp_path / "edit")
    loaded = GROMEdit.from_pretrained(tmp_path / "edit")
    again = grom_path_from_edit(loaded, scales=(0.5, 1.0, 2.0), retain_weights=(1.0, 10.0), ridges=(1e-2, 1e-3))
    assert again.points == path.points
    name = next(iter(base.solutions))
    xf, d = base.forget_keys[name].double(), base.targets[name].double()
    c_f = base.solutions[name].forget_scale
    r = base.solutions[name].chol @ base.solutions[name].chol.T - normal_matrix(
        torch.zeros(xf.shape[1], xf.shape[1], dtype=torch.float64), 0, xf, BASE["forget_weight"], 0.0, BASE["ridge"])
    for i, point in enumerate(path.points):
        a = point["retain_weight"] * r + c_f * (xf.T @ xf) + point["ridge"] * torch.eye(xf.shape[1], dtype=torch.float64)
        direct = point["scale"] * torch.linalg.solve(a, c_f * (xf.T @ d)).T
        torch.testing.assert_close(path.edits[i].solutions[name].delta, direct, rtol=1e-6, atol=1e-9)
        torch.testing.assert_close(again.point_deltas(i)[name], path.point_deltas(i)[name], rtol=1e-5, atol=1e-7)


def test_cached_path_of_a_module_that_is_not_its_blocks_last_writer_replays_the_block(tiny, sets, synthetic):
    """o_proj's output goes through the MLP: the tail shortcut's check fails, the band replay from the block is used
    and gives the full passes' measurements."""
    import warnings

    from hf_unlearn.methods.grom.band_cache import BandCache
    from hf_unlearn.selection import SelectionCriterion

    model, tok = tiny
    forget, retain = sets
    small = fit_grom_path(model, tok, forget, retain, GROMConfig(**{**BASE, "target_modules": "o_proj",
                                                                     "layers": [1]}),
                          scales=(1.0,), retain_weights=(1.0, 10.0))
    checks: list[tuple[bool, bool]] = []
    original = BandCache.replays_exactly

    def spy(self, atol=1e-4):
        checks.append((self.entry.tail is not None, original(self, atol)))
        return checks[-1][1]

    criterion = lambda: SelectionCriterion(forget[:12], synthetic["holdout10"][:12],  # noqa: E731
                                           synthetic["retain90"][100:112], batch_size=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        BandCache.replays_exactly = spy
        try:
            small.select(criterion(), model, tok)
        finally:
            BandCache.replays_exactly = original
        fast = small.record
        small.select(criterion(), model, tok, cached=False)
    assert checks == [(True, False), (False, True)]
    compared = 0
    for a, b in zip(fast.measurements, small.record.measurements):
        for key, value in b.items():
            if key != "seconds" and isinstance(value, float) and value == value:
                assert a[key] == pytest.approx(value, abs=1e-5), key
                compared += 1
    assert compared >= 6 and fast.index == small.record.index
