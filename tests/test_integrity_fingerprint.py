"""The base-model fingerprint shared by GROM and T3 (:mod:`hf_unlearn.integrity`): one digest per weight in its
stored dtype, computed once per tensor state, covering every parameter; and T3's scoring chunks sized by memory."""

from __future__ import annotations

import pytest
import torch
from test_t3 import random_head
from transformers import LlamaConfig, LlamaForCausalLM

from hf_unlearn import integrity
from hf_unlearn.integrity import BaseModelMismatchError, check_model_fingerprint, model_fingerprint


def _tiny_llama(seed: int = 0, tied: bool = True) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         tie_word_embeddings=tied)
    return LlamaForCausalLM(config).eval()


@pytest.fixture()
def hash_calls(monkeypatch):
    calls = []
    real = integrity.tensor_sha256

    def spy(tensor):
        calls.append(tensor)
        return real(tensor)

    monkeypatch.setattr(integrity, "tensor_sha256", spy)
    return calls


def test_each_weight_is_hashed_once_and_an_in_place_edit_is_seen(hash_calls):
    model = _tiny_llama()
    first = model_fingerprint(model)
    unique = {id(p) for p in model.parameters()}
    assert len(hash_calls) == len(unique)  # the tied head is listed under its name but hashed once
    assert "lm_head.weight" in first["parameters"]
    assert model_fingerprint(model) == first and len(hash_calls) == len(unique)  # cached for the process
    weight = model.model.layers[0].mlp.up_proj.weight
    with torch.no_grad():
        weight.add_(0.01)
    second = model_fingerprint(model)
    assert len(hash_calls) == len(unique) + 1 and hash_calls[-1] is weight
    changed = [n for n in first["parameters"] if first["parameters"][n] != second["parameters"][n]]
    assert changed == ["model.layers.0.mlp.up_proj.weight"]


def test_untying_the_head_keeps_the_fingerprint_and_another_dtype_is_refused():
    from hf_unlearn.methods.grom.edit import untie_lm_head

    model = _tiny_llama()
    recorded = model_fingerprint(model)
    untie_lm_head(model)
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    check_model_fingerprint(recorded, model, "This artifact", "Refit it.")
    with pytest.raises(BaseModelMismatchError, match="dtype bfloat16 != float32"):
        check_model_fingerprint(recorded, model.to(torch.bfloat16), "This artifact", "Refit it.")
    with pytest.raises(BaseModelMismatchError, match="records no fingerprint"):
        check_model_fingerprint({"version": 1, "modules": {}}, model, "This artifact", "Refit it.")


def test_grom_adapter_refuses_a_base_changed_before_the_edited_layer(tiny_pair, synthetic, tmp_path, hash_calls):
    from hf_unlearn.demo import load_tiny
    from hf_unlearn.methods.grom import GROMConfig, fit_grom, load_grom_adapter

    model, tok = load_tiny(tiny_pair.target)
    edit = fit_grom(model, tok, synthetic["forget10"][:2], synthetic["retain90"][:20],
                    GROMConfig(layers=[1], progress=False))
    assert list(edit.deltas) == ["model.layers.1.mlp.down_proj"]
    hashed = len(hash_calls)
    assert hashed == len({id(p) for p in model.parameters()})
    edit.save_pretrained(tmp_path / "a")
    edit.verify_base(model)
    assert len(hash_calls) == hashed  # the same unchanged model is not hashed again
    other, _ = load_tiny(tiny_pair.target)
    with torch.no_grad():
        other.model.layers[0].mlp.up_proj.weight.add_(0.01)  # only an earlier layer differs
    with pytest.raises(BaseModelMismatchError, match=r"model\.layers\.0\.mlp\.up_proj\.weight: weights differ"):
        load_grom_adapter(other, tmp_path / "a")
    same, _ = load_tiny(tiny_pair.target)
    load_grom_adapter(same, tmp_path / "a")


def test_t3_refuses_another_base_and_hashes_once(hash_calls):
    from hf_unlearn.methods.t3 import T3LogitsProcessor

    model = _tiny_llama(tied=False)
    head = random_head(model)  # records the fingerprint
    hashed = len(hash_calls)
    T3LogitsProcessor(model, head).close()
    T3LogitsProcessor(model, head).close()
    assert len(hash_calls) == hashed
    other = _tiny_llama(tied=False)
    with torch.no_grad():
        other.model.layers[0].mlp.up_proj.weight.copy_(model.model.layers[0].mlp.up_proj.weight + 0.01)
    with pytest.raises(BaseModelMismatchError, match="another base model"):
        T3LogitsProcessor(other, head)


def test_t3_scoring_chunks_by_memory_give_the_same_scores():
    from hf_unlearn.methods.t3.scoring import (
        BUFFERS_PER_POSITION,
        chunk_positions,
        t3_candidate_log_probs,
        t3_log_probs,
    )

    model = _tiny_llama(tied=False)
    head = random_head(model)
    vocab = model.config.vocab_size
    per_position = BUFFERS_PER_POSITION * 4 * vocab
    assert chunk_positions(vocab, 1) == 1 and chunk_positions(vocab, 7 * per_position + 1) == 7
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (3, 12), generator=g)
    labels = ids.clone()
    labels[:, :4] = -100
    settings = [(1.0, 0.0), (1.5, 2.0), (2.0, 5.0)]
    args = (model, head, ids, labels, None, None)
    whole = t3_candidate_log_probs(*args, settings, scoring_memory=10**9)
    single = t3_log_probs(model, head, ids, labels, tilt_weight=2.0, temperature=1.5, scoring_memory=10**9)
    for budget in (1, 3 * per_position, 10 * per_position):
        torch.testing.assert_close(t3_candidate_log_probs(*args, settings, scoring_memory=budget), whole,
                                   rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(t3_log_probs(model, head, ids, labels, tilt_weight=2.0, temperature=1.5,
                                                scoring_memory=budget), single, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(whole[..., 1], single, rtol=1e-5, atol=1e-5)
    assert bool((whole[:, 5:] != 0).all())
