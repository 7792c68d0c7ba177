"""GROMConfig.extra_memory_bytes: the buffers it declares to the memory plan are the sizes of a tiny fit's tensors."""

from __future__ import annotations

import pytest

from hf_unlearn.methods.grom import GROMConfig
from hf_unlearn.methods.grom.fit import _fit_grom
from hf_unlearn.model_shape import ModelShape


@pytest.mark.parametrize("target", [{"target_modules": "down_proj", "layers": [1]},
                                    {"target_modules": "lm_head"},
                                    {"target_modules": ["down_proj"], "layers": "auto"}])
def test_declared_grom_memory_is_the_fit_tensors(tiny_target, synthetic, target):
    model, tok = tiny_target
    config = GROMConfig(progress=False, **target)
    edit, preservation = _fit_grom(model, tok, synthetic["forget10"], synthetic["retain90"][:40], config, None,
                                   None, None, with_preservation=True)
    s = edit.stats["num_forget_keys"]
    declared = config.extra_memory_bytes(ModelShape.from_config(model.config), 4, num_forget_keys=s)
    factors = [sol.chol for sol in edit.solutions.values()]
    assert declared["grom_cholesky_factors"] == sum(c.numel() * c.element_size() for c in factors)
    assert declared["grom_normal_matrix"] == 2 * max(c.numel() * c.element_size() for c in factors)  # A, its factor
    # the second moments: one float64 d x d per module whose keys were collected (here: the edited ones)
    assert declared["grom_second_moments"] == sum(r.numel() * r.element_size() for r in preservation.values())
    deltas = [t for n, sol in edit.solutions.items() for t in (sol.delta, edit.deltas[n])]
    assert declared["grom_deltas"] == sum(t.numel() * t.element_size() for t in deltas)  # float64 P, float32 copy
    held = [edit.forget_keys[n] for n in edit.solutions] + [edit.targets[n] for n in edit.solutions]
    assert declared["grom_forget_keys"] == sum(t.numel() * t.element_size() for t in held)
    assert "grom_forget_keys" not in config.extra_memory_bytes(ModelShape.from_config(model.config), 4)


def test_declared_grom_memory_reaches_the_memory_plan(tiny_target):
    from hf_unlearn.memory_plan import method_needs

    model, _ = tiny_target
    shape = ModelShape.from_config(model.config)
    config = GROMConfig(target_modules="down_proj", layers=[0, 1])
    needs = method_needs("grom", config, shape, 4)
    d = shape.intermediate_size
    assert needs.extra == {"grom_second_moments": 2 * 8 * d * d, "grom_cholesky_factors": 2 * 8 * d * d,
                           "grom_normal_matrix": 16 * d * d, "grom_deltas": 2 * 12 * d * shape.hidden_size}
