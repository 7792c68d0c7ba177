"""T3ClassifierConfig.extra_memory_bytes: the buffers it declares to the memory plan are the sizes of a tiny fit's
tensors."""

from __future__ import annotations

from hf_unlearn.methods.t3 import T3ClassifierConfig, fit_t3
from hf_unlearn.methods.t3.cache import _prepare, cache_fit_states
from hf_unlearn.model_shape import ModelShape


def test_declared_t3_memory_is_the_fit_tensors(tiny_target, synthetic):
    model, tok = tiny_target
    forget, retain = synthetic["forget10"][:20], synthetic["retain90"][:40]
    config = T3ClassifierConfig(rank=4, epochs=1, batch_size=8)
    prep = _prepare(model, tok, forget, retain, config, {}, fingerprint=False)
    (xf, tf, of), (xr, tr, orr) = cache_fit_states(model, prep, tok.pad_token_id, False)
    n = len(xf) + len(xr)
    shape = ModelShape.from_config(model.config)
    declared = config.extra_memory_bytes(shape, xf.element_size(), num_positions=n)
    # the per-set caches and their concatenation
    assert declared["t3_pooled_states"] == 2 * (xf.numel() + xr.numel()) * xf.element_size()
    labels = 2 * sum(t.numel() * t.element_size() for t in (tf, tr, of, orr)) + 4 * n
    assert declared["t3_position_labels"] == labels
    head = fit_t3(model, tok, forget, retain, config, progress=False)
    assert head.fit_report["n_forget_positions"] + head.fit_report["n_retain_positions"] == n
    params = sum(p.numel() * p.element_size() for p in head.parameters())
    weights = sum(w.numel() * w.element_size() for w in (head.down.weight, head.up.weight))
    assert declared["t3_head"] == params + 3 * weights  # the head, the weights' gradients and two AdamW moments
    assert set(config.extra_memory_bytes(shape, 4)) == {"t3_head"}
