"""Selection at the price of one pass: T3's calibration scores every (T, w) from one pass of the frozen base, GROM's
path measures every point from the hidden states cached at the edited band; both give the measurements of the
per-candidate passes they replace."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from hf_unlearn.methods.grom import GROMConfig
from hf_unlearn.methods.grom.band_cache import BandCache, band_entry
from hf_unlearn.methods.grom.strength_path import fit_grom_path
from hf_unlearn.methods.t3 import T3ClassifierConfig, fit_t3
from hf_unlearn.methods.t3.calibration import (
    DEFAULT_TEMPERATURES,
    DEFAULT_TILT_WEIGHTS,
    calibrate_t3,
    calibration_grid,
)
from hf_unlearn.methods.t3.scoring import candidate_answer_log_probs
from hf_unlearn.methods.t3.tilt import tilted_log_probs
from hf_unlearn.selection import SelectionCriterion

GROM_BASE = dict(forget_weight=10.0, suppression_margin=30.0, retain_weight=1.0, ridge=1e-2, progress=False)


@pytest.fixture(scope="module")
def tiny(tiny_pair):
    from hf_unlearn.demo import load_tiny

    model, tok = load_tiny(tiny_pair.target)
    tok.pad_token = tok.pad_token or tok.eos_token
    return model, tok


def _criterion(synthetic) -> SelectionCriterion:
    return SelectionCriterion(synthetic["forget10"][:12], synthetic["holdout10"][:12], synthetic["retain90"][100:112],
                              generic=synthetic["retain90"][150:160], batch_size=8)


def _assert_same_measurements(cached, uncached, tol=1e-4):
    assert cached.index == uncached.index and cached.candidates == uncached.candidates
    for a, b in zip(cached.measurements, uncached.measurements):
        assert set(a) == set(b)
        for key, value in b.items():
            if key == "seconds" or not isinstance(value, float):
                assert key == "seconds" or a[key] == value, key
                continue
            assert math.isfinite(value) == math.isfinite(a[key]), key
            if math.isfinite(value):
                assert a[key] == pytest.approx(value, abs=tol, rel=tol), key


def _count_calls(module: torch.nn.Module) -> tuple[list[int], object]:
    calls = [0]
    handle = module.register_forward_pre_hook(lambda m, a: calls.__setitem__(0, calls[0] + 1))
    return calls, handle


# ----------------------------------------------------------------------------------------------------------- T3
@pytest.mark.parametrize("floor", [None, -3.0])
def test_candidate_log_probs_equal_the_per_candidate_tilted_distribution(floor):
    gen = torch.Generator().manual_seed(0)
    base = 4 * torch.randn(37, 50, generator=gen)
    guidance = 3 * torch.randn(37, 50, generator=gen)
    targets = torch.randint(0, 50, (37,), generator=gen)
    settings = [(1.0, 0.0), (1.0, 1.0), (1.5, 0.5), (2.5, 1.0), (2.5, 2.0), (2.0, -0.5)]
    out = candidate_answer_log_probs(base, guidance, targets, settings, floor)
    assert out.shape == (37, len(settings)) and out.dtype == torch.float32
    for k, (t, w) in enumerate(settings):
        slow = tilted_log_probs(base, guidance, t, w, floor).gather(-1, targets[:, None]).squeeze(-1)
        torch.testing.assert_close(out[:, k], slow, rtol=0, atol=1e-5)
    torch.testing.assert_close(out[:, 0], torch.log_softmax(base, -1).gather(-1, targets[:, None]).squeeze(-1))
    assert not torch.equal(out[:, 3], out[:, 4])  # T and w act separately on the scores


def test_default_grid_holds_the_authors_setting_and_stays_small():
    grid = calibration_grid(DEFAULT_TEMPERATURES, DEFAULT_TILT_WEIGHTS)
    assert {"temperature": 2.5, "tilt_weight": 1.0} in grid  # the authors' released sweep
    assert {"temperature": 1.0, "tilt_weight": 0.25} == grid[0]  # a tilt weaker than the point that lands
    assert len(grid) <= 16
    assert max(p["temperature"] for p in grid) == 2.5 and max(p["tilt_weight"] for p in grid) == 2.0
    strengths = [(p["temperature"] * p["tilt_weight"], p["temperature"]) for p in grid]
    assert strengths == sorted(strengths)


@pytest.fixture(scope="module")
def head(tiny, synthetic):
    model, tok = tiny
    return fit_t3(model, tok, synthetic["forget10"][:10], synthetic["retain90"][:40], T3ClassifierConfig(rank=4),
                  steps=20, progress=False)


def test_cached_calibration_equals_the_uncached_one_from_one_base_pass(tiny, head, synthetic):
    model, tok = tiny
    decoder_calls, handle = _count_calls(model.model)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            fast_criterion = _criterion(synthetic)
            fast = calibrate_t3(model, tok, head, fast_criterion)
            fast_calls = decoder_calls[0]
            slow_criterion = _criterion(synthetic)
            slow = calibrate_t3(model, tok, head, slow_criterion, cached=False)
            slow_calls = decoder_calls[0] - fast_calls
    finally:
        handle.remove()
    assert len(fast.candidates) == len(DEFAULT_TEMPERATURES) * len(DEFAULT_TILT_WEIGHTS)
    _assert_same_measurements(fast, slow)
    for key, value in slow_criterion.original.items():
        assert fast_criterion.original[key] == pytest.approx(value, abs=1e-5)
    # one base forward per batch of the four row sets (8 batches of <= 8 rows; the greedy regrets of the retain
    # sets come from the same pass), against one pass per point, the original's pass over the retain sets (4
    # batches) and one more over them for the greedy regrets (4 batches)
    assert fast_calls == 8 and slow_calls == 8 * len(DEFAULT_TEMPERATURES) * len(DEFAULT_TILT_WEIGHTS) + 4 + 4
    assert (head.config.temperature, head.config.tilt_weight) == (fast.chosen["temperature"],
                                                                  fast.chosen["tilt_weight"])


# --------------------------------------------------------------------------------------------------------- GROM
@pytest.mark.parametrize("target", [
    {"target_modules": "lm_head"},
    {"target_modules": "down_proj", "layers": [1]},
    {"target_modules": "down_proj", "layers": [0, 1]},
])
def test_cached_grom_path_equals_the_uncached_one(tiny, synthetic, target):
    model, tok = tiny
    config = GROMConfig(**{**GROM_BASE, **target})
    path = fit_grom_path(model, tok, synthetic["forget10"], synthetic["retain90"][:60], config, scales=(0.5, 1.0, 2.0),
                         retain_weights=(1.0, 10.0))
    assert len(path.unit_deltas) == 2 and len(path) == 6  # one float32 edit per (w_r, mu); scales are multiples
    assert not path.edits._built  # no point's full edit is built before it is asked for
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    first_block = model.model.layers[0]
    calls, handle = _count_calls(first_block)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            fast_criterion = _criterion(synthetic)
            chosen = path.select(fast_criterion, model, tok)
            fast = path.record
            fast_calls = calls[0]
            slow_criterion = _criterion(synthetic)
            path.select(slow_criterion, model, tok, cached=False)
            slow = path.record
    finally:
        handle.remove()
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n
    _assert_same_measurements(fast, slow, tol=1e-5)
    for key, value in slow_criterion.original.items():
        assert fast_criterion.original[key] == pytest.approx(value, abs=1e-6)
    starts_at_first_block = target.get("layers") == [0, 1]
    # the blocks before the band run once per batch (8 batches), not once per point; with the band at the first
    # block its down_proj is the block's tail, so block 0 runs again only in the shortcut's check of the first batch
    assert fast_calls == (8 + 1 if starts_at_first_block else 8)
    assert chosen is path.edits[fast.index] and set(path.edits._built) == {fast.index}
    for name, delta in path.point_deltas(fast.index).items():
        torch.testing.assert_close(delta, chosen.deltas[name], rtol=1e-5, atol=1e-7)


def test_band_cache_on_the_cpu_replays_the_plain_forward(tiny, synthetic):
    from hf_unlearn.logprobs import causal_lm_scorer

    model, tok = tiny
    criterion = _criterion(synthetic)
    entry = band_entry(model, ["model.layers.1.mlp.down_proj"])
    assert entry.start == 1 and entry.module is model.model.layers[1]
    assert band_entry(model, ["lm_head"]).start == len(model.model.layers)
    with pytest.raises(ValueError, match="neither in the decoder's blocks nor the LM head"):
        band_entry(model, ["model.embed_tokens"])
    rows = criterion.forget
    cache = BandCache(model, entry, lambda scorer: criterion._score(model, tok, rows, scorer), cache_device="cpu")
    assert cache.replays_exactly() and cache.nbytes > 0
    assert cache.logits_mode == "pairs"  # the replay computes the logits of the scored (row, position) pairs only
    assert all(h.device.type == "cpu" for h, _ in cache.batches.kept)
    reference = criterion._score(model, tok, rows, causal_lm_scorer(model))
    for plain, replayed, ref in zip(cache.plain(), cache.current(), reference):
        assert plain.shape == ref.shape and (plain == ref).all() and abs(replayed - ref).max() <= 1e-6
    assert len(model.model.layers) == 2  # the full list of blocks is back


def test_kept_label_log_probs_equal_the_full_ones():
    from hf_unlearn.logprobs import label_log_probs
    from hf_unlearn.methods.grom.band_cache import kept_label_log_probs, predicting_positions

    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 9, 20, generator=gen)
    labels = torch.full((3, 9), -100)
    labels[0, 3:7] = torch.tensor([1, 2, 3, 4])
    labels[1, 5:9] = torch.tensor([5, 6, 7, 8])
    labels[2, 2:4] = torch.tensor([9, 10])
    keep = predicting_positions(labels)
    assert keep.tolist() == [1, 2, 3, 4, 5, 6, 7]
    torch.testing.assert_close(kept_label_log_probs(logits[:, keep], labels, keep), label_log_probs(logits, labels))


def test_pair_label_log_probs_equal_the_full_ones():
    from hf_unlearn.logprobs import label_log_probs
    from hf_unlearn.methods.grom.band_cache import pair_label_log_probs, scored_pairs

    gen = torch.Generator().manual_seed(2)
    logits = 3 * torch.randn(3, 9, 20, generator=gen)
    labels = torch.full((3, 9), -100)
    labels[0, 3:7] = torch.tensor([1, 2, 3, 4])
    labels[1, 5:9] = torch.tensor([5, 6, 7, 8])
    labels[2, 0:4] = torch.tensor([9, 10, 11, 12])  # position 0 has no context: never scored
    rows, positions = scored_pairs(labels)
    assert len(rows) == 4 + 4 + 3 and (rows == 2).sum() == 3
    out = pair_label_log_probs(logits[rows, positions], labels, rows, positions)
    torch.testing.assert_close(out, label_log_probs(logits, labels))
    empty = labels.new_full(labels.shape, -100)
    r0, p0 = scored_pairs(empty)
    assert not pair_label_log_probs(logits[r0, p0], empty, r0, p0).any()


def _head_outputs(model) -> tuple[list[tuple[int, ...]], object]:
    shapes: list[tuple[int, ...]] = []
    handle = model.get_output_embeddings().register_forward_hook(lambda m, a, out: shapes.append(tuple(out.shape)))
    return shapes, handle


def test_band_cache_replay_computes_only_the_scored_pairs_logits(tiny, synthetic, monkeypatch):
    from hf_unlearn.logprobs import answer_mask, causal_lm_scorer

    model, tok = tiny
    criterion = _criterion(synthetic)
    rows = criterion.forget
    reference = criterion._score(model, tok, rows, causal_lm_scorer(model))
    cache = BandCache(model, band_entry(model, ["model.layers.1.mlp.down_proj"]),
                      lambda scorer: criterion._score(model, tok, rows, scorer))
    assert cache.replays_exactly() and cache.logits_mode == "pairs"
    shapes, handle = _head_outputs(model)
    try:
        replayed = cache.current()
    finally:
        handle.remove()
    scored = [int(answer_mask(labels)[:, 1:].sum()) for *_, labels in cache.batches.inputs]
    assert [s[:2] for s in shapes] == [(1, n) for n in scored]
    for mine, ref in zip(replayed, reference):
        assert mine.shape == ref.shape and abs(mine - ref).max() <= 1e-5
    # a model whose head cannot be hooked replays with the scored positions (logits_to_keep)
    monkeypatch.setattr(type(model), "get_output_embeddings", lambda self: None)
    assert cache.replays_exactly() and cache.logits_mode == "positions"
    for mine, ref in zip(cache.current(), reference):
        assert abs(mine - ref).max() <= 1e-5


def test_band_cache_stops_its_caching_pass_at_the_band(tiny, synthetic):
    model, tok = tiny
    criterion = _criterion(synthetic)
    rows = criterion.holdout  # 12 rows: 2 batches of 8
    entry = band_entry(model, ["model.layers.1.mlp.down_proj"])
    caches, calls = {}, {}
    for keep in ("first", False):
        norm_calls, handle = _count_calls(model.model.norm)
        try:
            caches[keep] = BandCache(model, entry, lambda scorer: criterion._score(model, tok, rows, scorer),
                                     keep_plain=keep)
        finally:
            handle.remove()
        calls[keep] = norm_calls[0]
    assert calls == {"first": 1, False: 0}  # only "first" runs on past the band, on its first batch
    first, none = caches["first"], caches[False]
    assert first.batches.kept[0][1] is not None and first.batches.kept[1][1] is None
    assert all(lp is None for _, lp in none.batches.kept)
    for cache in (first, none):
        assert len(cache.batches.kept) == 2
        assert all(h.shape[:2] == inputs[0].shape for (h, _), inputs in zip(cache.batches.kept, cache.batches.inputs))
        with pytest.raises(RuntimeError, match="keep_plain"):
            cache.plain()
    assert first.replays_exactly()
    with pytest.raises(RuntimeError, match="no plain scores"):
        none.replays_exactly()
    for a, b in zip(first.current(), none.current()):
        assert (a == b).all()
    with pytest.raises(ValueError, match="keep_plain"):
        BandCache(model, entry, lambda scorer: [], keep_plain="all")


def test_grom_path_caching_pass_runs_whole_only_for_the_original_figures(tiny, synthetic):
    model, tok = tiny
    path = fit_grom_path(model, tok, synthetic["forget10"], synthetic["retain90"][:60],
                         GROMConfig(**GROM_BASE, target_modules="down_proj", layers=[1]), scales=(1.0,),
                         retain_weights=(1.0,))
    given = _criterion(synthetic)
    given.measure_original(model, tok)
    fresh = _criterion(synthetic)
    counts = []
    for criterion in (fresh, given):
        head_calls, handle = _count_calls(model.lm_head)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                path.select(criterion, model, tok)
        finally:
            handle.remove()
        counts.append(head_calls[0])
        assert path.cache_seconds is not None and path.cache_seconds > 0
    # 8 batches (2 per set); the replay checks 3 (the logits mode, the tail shortcut under a perturbation and through
    # the block) and the point 4 (the edit is in the last block: one head call per set, every batch's scored pairs
    # at once). Caching: without original figures the retain and generic sets run whole (4) and forget/holdout stop
    # at the band; with them, only the forget rows' first batch runs whole (the replay check's).
    assert counts == [4 + 3 + 4, 1 + 3 + 4]
    for key, value in given.original.items():
        assert fresh.original[key] == pytest.approx(value, abs=1e-6)


def test_criterion_takes_the_original_figures_from_log_probs(synthetic):
    import numpy as np

    criterion = _criterion(synthetic)
    retain = [np.full(3, -1.0)] * len(criterion.retain_validation)
    generic = [np.full(2, -2.0)] * len(criterion.generic)
    assert criterion.set_original_from_log_probs(retain, generic) == {"retain_validation_nll": 1.0,
                                                                        "generic_nll": 2.0}
    with pytest.raises(ValueError, match="generic"):
        criterion.set_original_from_log_probs(retain)
    with pytest.raises(ValueError, match="retain_validation"):
        criterion.set_original_from_log_probs(retain[:-1], generic)


def test_row_batches_map_the_scoring_loop_back_to_rows(tiny, synthetic):
    """Rows of different lengths are sorted into batches by the loop; the map puts each row's scores back."""
    from hf_unlearn.logprobs import causal_lm_scorer
    from hf_unlearn.scoring_pass import RowBatches

    model, tok = tiny
    criterion = _criterion(synthetic)
    rows = criterion.retain_validation[::-1]  # a different order than the loop's length sorting
    scorer = causal_lm_scorer(model)
    batches = RowBatches(lambda s: criterion._score(model, tok, rows, s), scorer)
    assert len(batches.kept) == 2 and sorted(batches.where) != batches.where
    for mine, ref in zip(batches.rows_of(batches.kept), criterion._score(model, tok, rows, scorer)):
        assert mine.dtype == ref.dtype and (mine == ref).all()


def test_grom_path_falls_back_to_full_passes_when_the_replay_differs(tiny, synthetic, monkeypatch):
    model, tok = tiny
    path = fit_grom_path(model, tok, synthetic["forget10"], synthetic["retain90"][:60],
                         GROMConfig(**GROM_BASE, target_modules="lm_head"), scales=(1.0,), retain_weights=(1.0,))
    monkeypatch.setattr(BandCache, "replays_exactly", lambda self, atol=1e-4: False)
    with pytest.warns(UserWarning, match="full passes"):
        path.select(_criterion(synthetic), model, tok)
    assert len(path.record.measurements) == 1
