"""GROM's late-layer band, the tied-LM-head edit, general retain rows in A, and count-scaled specificity
smoothing (hand-worked example)."""

from __future__ import annotations

import json

import pytest
import torch

from hf_unlearn.methods.grom import GROMConfig, fit_grom
from hf_unlearn.methods.grom.targets import specificity_weights


@pytest.fixture(scope="module")
def rows(synthetic):
    return synthetic["forget10"], synthetic["retain90"]


@pytest.fixture(scope="module")
def tok(tiny_pair):
    from hf_unlearn.demo import load_tiny

    return load_tiny(tiny_pair.target)[1]


def _llama(tok, layers, tied, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=tied, pad_token_id=tok.pad_token_id)
    return LlamaForCausalLM(config).eval()


# ----- late-layer band ---------------------------------------------------------------------------------------------


def test_auto_band_lies_in_the_last_third_of_a_six_layer_model(tok, rows):
    forget, retain = rows
    model = _llama(tok, 6, tied=False)
    edit = fit_grom(model, tok, forget[:4], retain[:20], GROMConfig(progress=False))
    assert sorted(edit.layer_scores) == [4, 5]  # ceil(6 / 3) = 2 late layers searched
    assert len(edit.selected_layers) == 1 and set(edit.selected_layers) <= {4, 5}  # band ceil(6 / 10) = 1
    assert edit.stats["candidate_layers"] == [4, 5]
    assert list(edit.deltas) == [f"model.layers.{edit.selected_layers[0]}.mlp.down_proj"]
    # the band is the best-scoring one among the candidates
    best = max(edit.layer_scores, key=lambda k: edit.layer_scores[k]["score"])
    assert edit.selected_layers == [best]
    wide = fit_grom(model, tok, forget[:4], retain[:20], GROMConfig(candidate_layers=[0, 1, 2], num_layers=2,
                                                                    progress=False))
    assert sorted(wide.layer_scores) == [0, 1, 2] and len(wide.selected_layers) == 2
    assert set(wide.selected_layers) <= {0, 1, 2}
    with pytest.raises(ValueError, match=r"candidate_layers \[9\] have no"):
        fit_grom(model, tok, forget[:4], retain[:20], GROMConfig(candidate_layers=[9], progress=False))
    with pytest.raises(ValueError, match="candidate_layers only applies to layers='auto'"):
        GROMConfig(layers=[1], candidate_layers=[1])
    assert GROMConfig().candidates(list(range(30))) == list(range(20, 30))
    assert GROMConfig().candidates([0, 1]) == [1]


# ----- tied LM head ------------------------------------------------------------------------------------------------


def test_untied_lm_head_edit_leaves_input_embeddings_unchanged(tok, rows, tmp_path):
    from peft import PeftModel

    from hf_unlearn.methods.grom import load_grom_adapter

    forget, retain = rows
    model = _llama(tok, 2, tied=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    embed0 = model.model.embed_tokens.weight.detach().clone()
    with pytest.raises(ValueError, match=r"tied to the input embeddings.*untie_lm_head=True"):
        fit_grom(model, tok, forget[:4], retain[:20], GROMConfig(target_modules="lm_head", progress=False))
    cfg = GROMConfig(target_modules="lm_head", untie_lm_head=True, progress=False)
    edit = fit_grom(model, tok, forget[:4], retain[:20], cfg)
    assert edit.untied_lm_head == "lm_head"
    assert model.lm_head.weight is model.model.embed_tokens.weight  # fitting does not modify the model
    p = edit.deltas["lm_head"]
    assert float(p.abs().max()) > 1e-3

    merged = edit.to_peft(model).merge_and_unload()
    assert torch.equal(merged.model.embed_tokens.weight, embed0)  # untouched, not recomputed
    err = edit.lora_factors()["lm_head"].relative_error  # the export's recorded error (its rank cap may bind)
    assert float((merged.lm_head.weight - embed0 - p).norm()) <= (err + 1e-5) * float(p.norm())

    edit.save_pretrained(tmp_path / "a")
    meta = json.loads((tmp_path / "a" / "grom_metadata.json").read_text())
    assert meta["untied_lm_head"] == "lm_head" and meta["config"]["untie_lm_head"] is True
    fresh = _llama(tok, 2, tied=True)
    merged = load_grom_adapter(fresh, tmp_path / "a").merge_and_unload()
    assert torch.equal(merged.model.embed_tokens.weight, embed0)
    assert float((merged.lm_head.weight - embed0 - p).norm()) <= (err + 1e-5) * float(p.norm())

    applied = edit.apply_(_llama(tok, 2, tied=True))
    assert torch.equal(applied.model.embed_tokens.weight, embed0)
    torch.testing.assert_close(applied.lm_head.weight, embed0 + p, rtol=1e-5, atol=1e-6)

    # plain PEFT (documented in GROMConfig.untie_lm_head): unmerged, the embeddings are untouched; merging writes
    # the edit into the shared matrix, so the input embeddings change too
    plain = PeftModel.from_pretrained(_llama(tok, 2, tied=True), tmp_path / "a")
    assert torch.equal(plain.get_base_model().model.embed_tokens.weight, embed0)
    plain_merged = plain.merge_and_unload()
    assert float((plain_merged.model.embed_tokens.weight - embed0 - p).norm()) <= (err + 1e-5) * float(p.norm())


# ----- general retain rows -----------------------------------------------------------------------------------------


def _head_inputs(model, tok, rows):
    """Slow reference: LM-head inputs at every answer-predicting position, one example at a time."""
    from hf_unlearn.data import collate_qa, tokenize_qa

    keys, seen = [], {}
    hook = model.lm_head.register_forward_hook(lambda m, a, o: seen.__setitem__("x", a[0]))
    try:
        for r in rows:
            batch = collate_qa([tokenize_qa(tok, r["question"], r["answer"])], tok.pad_token_id)
            with torch.no_grad():
                model(input_ids=batch["input_ids"])
            labels = batch["labels"][0]
            keys += [seen["x"][0, t].double() for t in range(labels.shape[0] - 1) if labels[t + 1] != -100]
    finally:
        hook.remove()
    return torch.stack(keys)


def test_generic_retain_enters_the_normal_matrix_as_the_closed_form_says(tiny_pair, rows):
    from hf_unlearn.demo import load_tiny

    model, tok = load_tiny(tiny_pair.target)
    forget, retain = rows
    forget, retain, generic = forget[:5], retain[:30], retain[30:70]
    cfg = GROMConfig(target_modules="lm_head", generic_retain_weight=3.0, progress=False)
    edit = fit_grom(model, tok, forget, retain, cfg, generic_retain=generic)
    xr, xg = _head_inputs(model, tok, retain), _head_inputs(model, tok, generic)
    assert edit.stats["num_generic_keys"] == xg.shape[0] and edit.stats["num_generic_rows_read"] == len(generic)
    xf, dt = edit.forget_keys["lm_head"].double(), edit.targets["lm_head"].double()
    s, d = xf.shape
    # P = (w_f/s) D X_f^T A^{-1},  A = (w_r/r) X_r X_r^T + (w_g/g) X_g X_g^T + (w_f/s) X_f X_f^T + mu I
    a = (cfg.retain_weight / xr.shape[0]) * xr.T @ xr + (cfg.generic_retain_weight / xg.shape[0]) * xg.T @ xg
    a = a + (cfg.forget_weight / s) * xf.T @ xf + cfg.ridge * torch.eye(d, dtype=torch.float64)
    ref = torch.linalg.solve(a, (cfg.forget_weight / s) * xf.T @ dt).T
    got = edit.solutions["lm_head"].delta
    # keys of batched and one-at-a-time float32 forward passes agree to ~1e-6 relative; A is well conditioned
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max()))
    plain = fit_grom(model, tok, forget, retain, cfg).solutions["lm_head"].delta
    assert float((plain - got).abs().max()) > 100 * 1e-4 * float(ref.abs().max())  # the term matters
    off = fit_grom(model, tok, forget, retain, GROMConfig(target_modules="lm_head", generic_retain_weight=0.0,
                                                          progress=False), generic_retain=generic)
    torch.testing.assert_close(off.solutions["lm_head"].delta, plain, rtol=1e-10, atol=1e-12)  # w_g = 0: no term
    with pytest.raises(ValueError, match="generic_retain must not contain forget rows|also occur in generic_retain"):
        fit_grom(model, tok, forget, retain, cfg, generic_retain=generic + forget[:1])
    with pytest.raises(ValueError, match="generic_retain row 0 is a str"):
        fit_grom(model, tok, forget, retain, cfg, generic_retain=["general text"])


# ----- specificity smoothing ---------------------------------------------------------------------------------------


def test_specificity_smoothing_hand_worked_example():
    # V = 4 tokens; forget counts c_f = [6, 2, 0, 0] (N_f = 8), retain counts c_r = [2, 0, 1, 1] (N_r = 4), beta = 0.5
    cf, cr = torch.tensor([6, 2, 0, 0]), torch.tensor([2, 0, 1, 1])
    # fraction: p_x = (c_x + beta N_x / V) / ((1 + beta) N_x)
    #   p_f = (c_f + 1) / 12 = [7, 3, 1, 1] / 12,  p_r = (c_r + 0.5) / 6 = [5, 1, 3, 3] / 12
    #   alpha = 1 - p_r / p_f = [1 - 5/7, 1 - 1/3] = [2/7, 2/3] on the tokens seen in forget answers, 0 elsewhere
    fraction = specificity_weights(cf, cr, power=1.0, smoothing=0.5, mode="fraction")
    torch.testing.assert_close(fraction, torch.tensor([2 / 7, 2 / 3, 0.0, 0.0], dtype=torch.float64))
    # pseudo_count: p_x = (c_x + beta) / (N_x + beta V): p_f = [6.5, 2.5] / 10, p_r = [2.5, 0.5] / 6
    #   alpha = [1 - (2.5/6)/(0.65), 1 - (0.5/6)/(0.25)] = [14/39, 2/3]
    pseudo = specificity_weights(cf, cr, power=1.0, smoothing=0.5, mode="pseudo_count")
    torch.testing.assert_close(pseudo, torch.tensor([14 / 39, 2 / 3, 0.0, 0.0], dtype=torch.float64))
    squared = specificity_weights(cf, cr, power=2.0, smoothing=0.5, mode="fraction")
    torch.testing.assert_close(squared, fraction**2)
    # fraction compares rates: the same retain rates from 30x more retain tokens give the same weights ...
    torch.testing.assert_close(specificity_weights(cf, 30 * cr, 1.0, 0.5, "fraction"), fraction)
    # ... while pseudo counts over a large vocabulary compare raw counts (a rare forget token looks retain-like)
    big_f = torch.zeros(50_000, dtype=torch.long)
    big_r = torch.zeros(50_000, dtype=torch.long)
    big_f[:2], big_r[:2] = torch.tensor([6, 2]), torch.tensor([2, 0])
    big_r[2] = 3_000  # many retain tokens: token 0's retain *rate* is tiny
    assert float(specificity_weights(big_f, big_r, 1.0, 0.5, "fraction")[0]) > 0.99
    assert float(specificity_weights(big_f, big_r, 1.0, 0.5, "pseudo_count")[0]) < 0.7
    assert GROMConfig().specificity_smoothing_mode == "fraction"
    older = {k: v for k, v in GROMConfig().saved_dict().items() if k != "specificity_smoothing_mode"}
    assert GROMConfig.from_saved(older).specificity_smoothing_mode == "pseudo_count"  # what such a save used
    with pytest.raises(ValueError, match="specificity_smoothing_mode must be one of"):
        GROMConfig(specificity_smoothing_mode="laplace")
