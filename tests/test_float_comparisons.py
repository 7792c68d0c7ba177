"""Comparisons of floats from different code paths hold on every CPU.

A GROM edit loaded from disk holds contiguous copies of the audit factors, the in-memory edit may hold views in
another layout, and BLAS may then round differently. The audit check of the save/load and Hub round trips
(``test_grom._assert_same_audit``) must accept the same audit state in another memory layout, whatever the CPU,
and still reject an audit state that is off by a relative 1e-7.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from test_grom import _assert_same_audit

from hf_unlearn.methods.grom import GROMConfig, fit_grom
from hf_unlearn.methods.grom.solve import GROMSolution


@pytest.fixture(scope="module")
def edit(tiny_pair, synthetic):
    from hf_unlearn.demo import load_tiny

    model, tok = load_tiny(tiny_pair.target)
    return fit_grom(model, tok, synthetic["forget10"][:8], synthetic["retain90"][:60], GROMConfig(
        target_modules=["down_proj", "lm_head"], layers=[1], progress=False))


def _column_major(t: torch.Tensor) -> torch.Tensor:
    """The same values stored column-major (a transposed contiguous copy, viewed back)."""
    return t.T.contiguous().T


def _relaid(edit, chol_scale: float = 1.0):
    """``edit`` with every audit factor in column-major layout (and its Cholesky factors scaled by ``chol_scale``)."""
    solutions = {
        name: GROMSolution(delta=_column_major(sol.delta), chol=_column_major(sol.chol * chol_scale),
                           forget_scale=sol.forget_scale)
        for name, sol in edit.solutions.items()
    }
    return dataclasses.replace(
        edit, solutions=solutions, forget_keys={n: _column_major(k) for n, k in edit.forget_keys.items()},
        targets={n: _column_major(t) for n, t in edit.targets.items()},
    )


def test_audit_check_accepts_another_layout_and_rejects_a_perturbed_audit(edit):
    relaid = _relaid(edit)
    assert all(not s.chol.is_contiguous() for s in relaid.solutions.values())
    for name, sol in relaid.solutions.items():
        assert torch.equal(sol.chol, edit.solutions[name].chol) and torch.equal(sol.delta, edit.solutions[name].delta)
    _assert_same_audit(relaid, edit)  # same values, other layout: equal up to rounding
    with pytest.raises(AssertionError, match="influence"):
        _assert_same_audit(_relaid(edit, chol_scale=1 + 1e-7), edit)  # A off by 2e-7: a different audit


def test_torch_runs_on_the_requested_thread_count():
    """CI's second pass sets ``HF_UNLEARN_TEST_THREADS=2``: the suite's thread fixture must honour it (and keep
    one thread otherwise), or that pass would repeat the first one's reduction order."""
    assert torch.get_num_threads() == int(os.environ.get("HF_UNLEARN_TEST_THREADS", "1"))
