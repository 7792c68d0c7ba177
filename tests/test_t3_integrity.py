"""T3 safety: finite settings and weights (no NaN head is ever returned or saved), refusals before any work (a
prompt that fills the context, a layer out of range, an unknown template), and the base check by weight
fingerprint (the same weights under another path are accepted, other weights under the same name refused)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from test_t3 import qa_batch, random_head
from transformers import AutoModelForCausalLM

from hf_unlearn.demo import load_tiny
from hf_unlearn.integrity import BaseModelMismatchError, model_fingerprint
from hf_unlearn.methods.t3 import (
    T3Classifier,
    T3ClassifierConfig,
    T3LogitsProcessor,
    fit_t3,
    t3_log_probs,
)
from hf_unlearn.methods.t3.cache import _prepare


def validate_t3_fit(model, tok, forget, retain, config=None, **overrides):
    """Every check fit_t3 makes before its first forward pass, without running the base."""
    return _prepare(model, tok, forget, retain, config, overrides, fingerprint=False).config


@pytest.fixture(scope="module")
def target(tiny_pair):
    model, tok = load_tiny(tiny_pair.target)
    return model.eval(), tok


class ForwardCounter:
    """Counts forward passes of the base's decoder (to show a refusal came before any work)."""

    def __init__(self, model):
        self.calls = 0
        self._handle = model.model.register_forward_pre_hook(self._count)

    def _count(self, *args):
        self.calls += 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._handle.remove()


# ----------------------------------------------------------------------------- finite settings and weights
@pytest.mark.parametrize(
    "bad",
    [dict(learning_rate=float("inf")), dict(learning_rate=float("nan")), dict(learning_rate=0.0),
     dict(learning_rate=-1e-3), dict(weight_decay=float("nan")), dict(weight_decay=-1.0),
     dict(tilt_weight=float("inf")), dict(temperature=float("nan")), dict(holdout_fraction=float("nan")),
     dict(log_f_floor=0.0), dict(log_f_floor=float("-inf")), dict(log_f_floor=float("nan")),
     dict(epochs=0), dict(steps=0), dict(forget_batch_size=0), dict(early_stopping_patience=0),
     dict(prompt_template="no-such-template")],
)
def test_config_refuses_non_finite_and_out_of_range_settings(bad):
    name = next(iter(bad))
    with pytest.raises(ValueError, match=name):
        T3ClassifierConfig(**bad)


def test_a_diverging_fit_returns_nothing(target, synthetic):
    """learning_rate 1e30 is finite and positive, so the config accepts it; the fit must refuse the NaN head it
    produces instead of returning it."""
    model, tok = target
    with pytest.raises(ValueError, match="learning_rate"):
        fit_t3(model, tok, synthetic["forget10"][:6], synthetic["retain90"][:12], rank=2, epochs=5,
               learning_rate=1e30, progress=False)


def test_non_finite_head_is_never_saved_or_used(target, synthetic, tmp_path):
    model, tok = target
    clf = random_head(model)
    clf.save_pretrained(tmp_path / "ok")
    assert (tmp_path / "ok" / "model.safetensors").is_file()
    with torch.no_grad():
        clf.up.weight[3, 1] = float("nan")
    out = tmp_path / "nan"
    with pytest.raises(ValueError, match="non-finite"):
        clf.save_pretrained(out)
    assert not out.exists() or not any(out.iterdir())
    with pytest.raises(ValueError, match="non-finite"):
        T3LogitsProcessor(model, clf)
    _, batch = qa_batch(tok, synthetic["forget10"][:2])
    with pytest.raises(ValueError, match="non-finite"):
        t3_log_probs(model, clf, batch["input_ids"], batch["labels"], batch["attention_mask"])


# ----------------------------------------------------------------------------- refusals before any work
def test_prompt_filling_the_context_is_refused_by_row_before_any_forward(target, synthetic):
    model, tok = target
    forget = [dict(r) for r in synthetic["forget10"][:6]]
    forget[4] = {"question": " ".join(["unusually long question"] * 60), "answer": "short"}
    retain = synthetic["retain90"][:12]
    with ForwardCounter(model) as counter:
        for check in (validate_t3_fit, fit_t3):
            kwargs = {} if check is validate_t3_fit else {"progress": False}
            with pytest.raises(ValueError, match=r"forget row.*first 48 positions.*row 4 "):
                check(model, tok, forget, retain, rank=2, epochs=2, max_length=48, **kwargs)
        # a retain row too
        with pytest.raises(ValueError, match=r"retain row.*row 0 "):
            fit_t3(model, tok, synthetic["forget10"][:6], [forget[4]] + retain, rank=2, max_length=48,
                   progress=False)
    assert counter.calls == 0
    # without the long row the same settings fit
    clf = fit_t3(model, tok, forget[:4] + forget[5:], retain, rank=2, epochs=2, max_length=48, progress=False)
    assert clf.fit_report["n_forget_examples"] == 5


def test_layer_out_of_range_is_refused_before_any_forward(target, synthetic):
    model, tok = target
    n = model.config.num_hidden_layers
    config = T3ClassifierConfig(layer=99)  # fine on its own: the range depends on the model
    with pytest.raises(ValueError, match="layer=99 is out of range"):
        config.check_for(model)
    T3ClassifierConfig(layer=n).check_for(model)
    T3ClassifierConfig(layer=-(n + 1)).check_for(model)
    with ForwardCounter(model) as counter:
        with pytest.raises(ValueError, match="out of range"):
            validate_t3_fit(model, tok, synthetic["forget10"][:4], synthetic["retain90"][:8], layer=-(n + 2))
        with pytest.raises(ValueError, match="out of range"):
            fit_t3(model, tok, synthetic["forget10"][:4], synthetic["retain90"][:8], layer=99, progress=False)
        with pytest.raises(ValueError, match="no-such-template"):
            fit_t3(model, tok, synthetic["forget10"][:4], synthetic["retain90"][:8], prompt_template="no-such-template",
                   progress=False)
    assert counter.calls == 0


# ----------------------------------------------------------------------------- base check by weight fingerprint
def test_same_weights_under_another_path_are_accepted(target, synthetic, tmp_path):
    model, tok = target
    clf = fit_t3(model, tok, synthetic["forget10"][:6], synthetic["retain90"][:12], rank=2, epochs=3,
                 progress=False)
    assert clf.config.base_weights_fingerprint == model_fingerprint(model)
    clf.save_pretrained(tmp_path / "head")
    saved = json.loads((tmp_path / "head" / "config.json").read_text())
    assert saved["base_weights_fingerprint"]["parameters"] == clf.config.base_weights_fingerprint["parameters"]
    model.save_pretrained(tmp_path / "elsewhere" / "copy")
    moved = AutoModelForCausalLM.from_pretrained(tmp_path / "elsewhere" / "copy").eval()
    assert moved.name_or_path != model.name_or_path
    head = T3Classifier.from_pretrained(tmp_path / "head")
    _, batch = qa_batch(tok, synthetic["forget10"][:3])
    args = (batch["input_ids"], batch["labels"], batch["attention_mask"], batch["position_ids"])
    want = t3_log_probs(model, clf, *args, tilt_weight=3.0)
    got = t3_log_probs(moved, head, *args, tilt_weight=3.0)
    # same weights, another process path for loading: float32 results agree to rounding
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    T3LogitsProcessor(moved, head).close()
    # the fingerprint is of the stored bytes: the same weights held in bfloat16 are refused, naming the dtype
    with pytest.raises(BaseModelMismatchError, match="dtype bfloat16 != float32"):
        T3LogitsProcessor(copy.deepcopy(moved).to(torch.bfloat16), head)


def test_other_weights_under_the_same_name_are_refused(target, tiny_retain):
    model, _ = target
    clf = random_head(model)
    T3LogitsProcessor(model, clf).close()
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.model.layers[0].mlp.down_proj.weight[0, 0] += 1e-3  # one weight of one block
    assert other.name_or_path == model.name_or_path
    with pytest.raises(BaseModelMismatchError, match="weights differ"):
        T3LogitsProcessor(other, clf)
    retain_model = copy.deepcopy(tiny_retain[0])  # another fine-tune of the same architecture
    retain_model.name_or_path = model.name_or_path
    retain_model.config._name_or_path = model.config._name_or_path
    with pytest.raises(ValueError, match="another base model"):
        T3LogitsProcessor(retain_model, clf)
    ids = torch.tensor([[0, 5, 6, 7]])
    with pytest.raises(ValueError, match="another base model"):
        t3_log_probs(retain_model, clf, ids, ids)
    T3LogitsProcessor(retain_model, clf, check_base_weights=False).close()  # the explicit opt-out


def test_an_in_place_change_after_a_check_is_seen(target):
    model, _ = target
    model = copy.deepcopy(model)
    clf = random_head(model)
    T3LogitsProcessor(model, clf).close()  # verified (and remembered)
    T3LogitsProcessor(model, clf).close()
    with torch.no_grad():
        model.lm_head.weight[1, 2] += 0.5
    with pytest.raises(BaseModelMismatchError, match="weights differ"):
        T3LogitsProcessor(model, clf)


def test_a_head_without_a_fingerprint_is_refused(target):
    model, _ = target
    config = T3ClassifierConfig(rank=2, hidden_size=model.config.hidden_size, vocab_size=model.config.vocab_size)
    clf = T3Classifier(config).eval()
    with pytest.raises(BaseModelMismatchError, match="records no fingerprint"):
        T3LogitsProcessor(model, clf)
