"""T3 (Temper-Then-Tilt) with the authors' per-vocabulary guidance head: tilt math and exact scoring vs slow
references, the hook-based logits processor vs plain generate and vs the exact scorer, padding independence,
the unlearning effect on the tiny memorizing model, save/load, truncation, refusals."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import AutoConfig, AutoModel, LogitsProcessorList

import hf_unlearn  # noqa: F401  (registers the T3 classes with the Auto classes)
from hf_unlearn.data import build_prompt, collate_qa, tokenize_qa
from hf_unlearn.demo import TinyRecipe, load_tiny
from hf_unlearn.demo.tofu_tiny import build_tiny_llama
from hf_unlearn.logprobs import answer_nll, label_log_probs
from hf_unlearn.methods.t3 import (
    T3Classifier,
    T3ClassifierConfig,
    T3LogitsProcessor,
    fit_t3,
    t3_log_probs,
    t3_scorer,
)
from hf_unlearn.methods.t3.hidden import causal_mean_pool, layer_hidden
from hf_unlearn.methods.t3.tilt import tilted_log_probs, tilted_scores


# ----------------------------------------------------------------------------- helpers
def random_head(model, layer: int = -1, scale: float = 3.0, seed: int = 0, **config) -> T3Classifier:
    """An unfitted head with large random weights, so the tilt visibly changes the distribution."""
    torch.manual_seed(seed)
    clf = T3Classifier(T3ClassifierConfig(rank=4, layer=layer, **config).for_base(model))
    with torch.no_grad():  # N(0, scale^2 / fan_in) weights, whatever the head's own initialisation
        for weight in (clf.down.weight, clf.up.weight):
            weight.normal_(0.0, scale / weight.shape[1] ** 0.5)
        clf.down.bias.normal_(0.0, scale)  # the bottleneck offset c (the head has no per-token bias)
    return clf.eval()


def zero_head(model) -> T3Classifier:
    clf = T3Classifier(T3ClassifierConfig(rank=2).for_base(model))
    with torch.no_grad():
        for p in clf.parameters():
            p.zero_()
    return clf.eval()


def left_pad(prompts: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(p) for p in prompts)
    return {
        "input_ids": torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts]),
        "attention_mask": torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts]),
    }


def prompt_ids(tokenizer, questions) -> list[list[int]]:
    return [tokenizer(build_prompt(tokenizer, q))["input_ids"] for q in questions]


@torch.no_grad()
def slow_t3_log_probs(model, clf, seq: torch.Tensor, start: int, temperature: float, tilt_weight: float):
    """log q(seq[t] | seq[:t]) for t >= start, each prefix re-encoded alone, pooled and tilted by hand."""
    layer = clf.config.layer
    out = []
    for t in range(start, len(seq)):
        res = model(seq[None, :t], output_hidden_states=True)
        pool = res.hidden_states[layer][0].float().mean(0)  # causal mean over positions <= t-1
        g = clf.up.weight.float() @ (clf.down.weight.float() @ pool + clf.down.bias.float())  # U (D pool + c)
        base = torch.log_softmax(res.logits[0, -1].float(), -1)
        z = base / temperature + tilt_weight * torch.log(torch.sigmoid(g.double())).float()
        out.append(z[seq[t]] - torch.logsumexp(z, 0))
    return torch.stack(out)


def qa_batch(tokenizer, rows, padding_side="right"):
    feats = [tokenize_qa(tokenizer, r["question"], r["answer"]) for r in rows]
    return feats, collate_qa(feats, tokenizer.pad_token_id, padding_side)


class Recording(T3LogitsProcessor):
    """Keeps every step's input and output."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.steps = []

    def __call__(self, input_ids, scores):
        out = super().__call__(input_ids, scores)
        self.steps.append((input_ids.clone(), out.clone()))
        return out


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def target(tiny_pair):
    model, tok = load_tiny(tiny_pair.target)
    return model.eval(), tok


@pytest.fixture(scope="module")
def fitted(target, synthetic):
    model, tok = target
    return fit_t3(model, tok, synthetic["forget10"], synthetic["retain90"], T3ClassifierConfig(rank=8), progress=False)


# ----------------------------------------------------------------------------- pure math
def test_tilt_formula_and_causal_pool_match_references():
    torch.manual_seed(0)
    logits, g = torch.randn(3, 11) * 4, torch.randn(3, 11) * 3
    for temperature, weight in [(1.0, 1.0), (2.5, 0.7), (1.0, 0.0)]:
        ref = torch.log_softmax(logits, -1) / temperature + weight * torch.log(torch.sigmoid(g))
        assert torch.allclose(tilted_scores(logits + 5.0, g, temperature, weight), ref, atol=1e-5)
        lq = tilted_log_probs(logits, g, temperature, weight)
        assert torch.allclose(lq, ref - torch.logsumexp(ref, -1, keepdim=True), atol=1e-5)
        assert torch.allclose(lq.exp().sum(-1), torch.ones(3), atol=1e-5)
    hidden = torch.randn(2, 6, 4)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])
    pooled = causal_mean_pool(hidden, mask)
    for b in range(2):
        for t in range(6):
            keep = [s for s in range(t + 1) if mask[b, s]]
            if keep:
                assert torch.allclose(pooled[b, t], hidden[b, keep].mean(0), atol=1e-6)


@pytest.mark.parametrize("layer", [0, 1, -1])
def test_hook_reads_output_hidden_states(target, layer):
    model, tok = target
    batch = tok(["Question: who wrote it?\nAnswer: a", "Question: where?\nAnswer:"], return_tensors="pt", padding=True)
    with torch.no_grad():
        want = model(**batch, output_hidden_states=True).hidden_states[layer]
    got = layer_hidden(model, batch["input_ids"], batch["attention_mask"], None, layer)
    assert torch.allclose(got, want, atol=1e-6)


# ----------------------------------------------------------------------------- exact scoring
@pytest.mark.parametrize(("layer", "temperature", "weight"), [(-1, 2.0, 1.0), (1, 1.0, 3.0)])
def test_t3_log_probs_equal_slow_per_position_reference(target, synthetic, layer, temperature, weight):
    model, tok = target
    clf = random_head(model, layer=layer)
    rows = [synthetic["forget10"][0], synthetic["retain90"][3], synthetic["retain90"][40]]
    feats, batch = qa_batch(tok, rows, "right")
    lp = t3_log_probs(model, clf, batch["input_ids"], batch["labels"], batch["attention_mask"], batch["position_ids"],
                      temperature=temperature, tilt_weight=weight)
    _, left = qa_batch(tok, rows, "left")
    lp_left = t3_log_probs(model, clf, left["input_ids"], left["labels"], left["attention_mask"], left["position_ids"],
                           temperature=temperature, tilt_weight=weight)
    for i, f in enumerate(feats):
        seq, start, n = torch.tensor(f["input_ids"]), f["prompt_length"], len(f["input_ids"])
        ref = slow_t3_log_probs(model, clf, seq, start, temperature, weight)
        assert torch.allclose(lp[i, start:n], ref, atol=1e-4), (i, (lp[i, start:n] - ref).abs().max())
        assert torch.all(lp[i, :start] == 0) and torch.all(lp[i, n:] == 0)
        width = left["input_ids"].shape[1]
        assert torch.allclose(lp_left[i, width - n + start :], ref, atol=1e-4)  # left padding: same numbers
    # The tilt changed the distribution (else the comparison above would say little).
    base = label_log_probs(model(**{k: batch[k] for k in ("input_ids", "attention_mask")}).logits, batch["labels"])
    assert (lp - base).abs().max() > 0.5


def test_tilt_weight_zero_is_tempering_and_unit_temperature_is_the_base(target, synthetic):
    model, tok = target
    clf = random_head(model)
    _, batch = qa_batch(tok, synthetic["forget10"][:4], "right")
    args = (batch["input_ids"], batch["labels"], batch["attention_mask"], batch["position_ids"])
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits
    tempered = t3_log_probs(model, clf, *args, temperature=3.0, tilt_weight=0.0)
    assert torch.allclose(tempered, label_log_probs(logits / 3.0, batch["labels"]), atol=1e-5)
    plain = t3_log_probs(model, clf, *args, temperature=1.0, tilt_weight=0.0)
    assert torch.allclose(plain, label_log_probs(logits, batch["labels"]), atol=1e-5)
    assert not torch.allclose(tempered, plain, atol=1e-2)


# ----------------------------------------------------------------------------- the logits processor
@pytest.mark.parametrize("temperature", [1.0, 3.0])
def test_zero_head_greedy_equals_plain_greedy(target, synthetic, temperature):
    model, tok = target
    enc = left_pad(prompt_ids(tok, [r["question"] for r in synthetic["forget10"][:4]]), tok.pad_token_id)
    kw = dict(max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
    plain = model.generate(**enc, **kw)
    with T3LogitsProcessor(model, zero_head(model), temperature=temperature) as t3:
        tilted = model.generate(**enc, **kw, logits_processor=LogitsProcessorList([t3]))
    assert torch.equal(tilted, plain)


def test_processor_steps_equal_exact_scorer_with_sampling_and_warpers(target, synthetic):
    """Sampling, a top-k warper after T3, batch > 1, KV cache: every step's tilted distribution equals t3_log_probs
    of the generated sequence; a second generate call starts afresh."""
    model, tok = target
    clf = random_head(model, seed=1)
    enc = left_pad(prompt_ids(tok, [r["question"] for r in synthetic["retain90"][:3]]), tok.pad_token_id)
    width = enc["input_ids"].shape[1]
    with Recording(model, clf, temperature=2.0, tilt_weight=1.5) as t3:
        for seed in (0, 1):
            t3.steps.clear()
            torch.manual_seed(seed)
            # (no min_new_tokens: its EOS mask runs before T3 and would change the normalisation)
            out = model.generate(**enc, max_new_tokens=8, do_sample=True, top_k=50,
                                 pad_token_id=tok.pad_token_id, logits_processor=LogitsProcessorList([t3]))
            n_new = out.shape[1] - width
            mask = torch.cat([enc["attention_mask"], torch.ones(3, n_new, dtype=torch.long)], 1)
            labels = out.clone()
            labels[:, :width] = -100
            lp = t3_log_probs(model, clf, out, labels, mask, (mask.cumsum(-1) - 1).clamp_min(0),
                              temperature=2.0, tilt_weight=1.5)
            finished = torch.zeros(3, dtype=torch.bool)
            assert len(t3.steps) == n_new >= 4
            for i, (ids, scores) in enumerate(t3.steps):
                assert torch.equal(ids, out[:, : width + i])
                chosen = out[:, width + i]
                step_lp = torch.log_softmax(scores, -1).gather(1, chosen[:, None]).squeeze(1)
                assert torch.allclose(step_lp[~finished], lp[~finished, width + i], atol=1e-4)
                finished |= chosen == tok.eos_token_id


def test_beam_search_follows_reordered_beams(target, synthetic):
    """num_beams=4: the running sums follow beam reordering; a reference re-encoding every beam from scratch at
    every step (no cache, no hook state) gives the same beams."""
    from transformers import LogitsProcessor

    model, tok = target
    clf = random_head(model, seed=2)

    class FromScratch(LogitsProcessor):
        @torch.no_grad()
        def __call__(self, input_ids, scores):
            hs = model(input_ids, output_hidden_states=True).hidden_states[-1].float().mean(1)
            return tilted_scores(scores, clf(hs).logits, 1.5, 2.0)

    prompt = torch.tensor(prompt_ids(tok, [synthetic["forget10"][2]["question"]]))
    kw = dict(max_new_tokens=8, num_beams=4, num_return_sequences=4, do_sample=False, pad_token_id=tok.pad_token_id)
    with T3LogitsProcessor(model, clf, temperature=1.5, tilt_weight=2.0) as t3:
        fast = model.generate(prompt, **kw, logits_processor=LogitsProcessorList([t3]))
    slow = model.generate(prompt, **kw, logits_processor=LogitsProcessorList([FromScratch()]))
    assert torch.equal(fast, slow)
    assert not torch.equal(fast, model.generate(prompt, **kw))


def test_processor_hooks_errors_and_close(target, tiny_retain):
    model, tok = target
    clf = random_head(model)
    n_hooks = len(model.model._forward_hooks) + len(model.model._forward_pre_hooks)
    t3 = T3LogitsProcessor(model, clf)
    assert (t3.temperature, t3.tilt_weight) == (clf.config.temperature, clf.config.tilt_weight)
    with pytest.raises(RuntimeError, match="saw no forward"):
        t3(torch.tensor([[1, 2, 3]]), torch.zeros(1, model.config.vocab_size))
    other, _ = tiny_retain  # same architecture, another model: generate runs it, the hook never fires
    enc = tok(["Question: who?\nAnswer:"], return_tensors="pt")
    with pytest.raises(RuntimeError, match="saw no forward"):
        other.generate(**enc, max_new_tokens=2, logits_processor=LogitsProcessorList([t3]))
    t3.close()
    assert len(model.model._forward_hooks) + len(model.model._forward_pre_hooks) == n_hooks
    with pytest.raises(RuntimeError, match="closed"):
        model.generate(**enc, max_new_tokens=2, logits_processor=LogitsProcessorList([t3]))
    t3.attach()  # hooks back: works again, with the same tokens as a fresh processor
    again = model.generate(**enc, max_new_tokens=4, do_sample=False, logits_processor=LogitsProcessorList([t3]))
    t3.close()
    with T3LogitsProcessor(model, clf) as fresh:
        assert torch.equal(again, model.generate(**enc, max_new_tokens=4, do_sample=False,
                                                 logits_processor=LogitsProcessorList([fresh])))
    assert len(model.model._forward_hooks) + len(model.model._forward_pre_hooks) == n_hooks


# ----------------------------------------------------------------------------- fitting and the unlearning effect
def test_fit_caches_answer_positions_only_and_keeps_the_tokenizer(target, synthetic):
    model, tok = target
    tok = copy.deepcopy(tok)
    tok.pad_token = None  # fitting needs no pad token and must not set one
    side = tok.padding_side
    forget, retain = synthetic["forget10"][:5], synthetic["retain90"][:10]
    clf = fit_t3(model, tok, forget, retain, T3ClassifierConfig(rank=3), steps=20, holdout_fraction=0.0,
                 progress=False)
    assert tok.pad_token is None and tok.padding_side == side
    def n_answer(rows):
        return sum(sum(lab != -100 for lab in tokenize_qa(tok, r["question"], r["answer"])["labels"][1:]) for r in rows)

    report = clf.fit_report
    assert (report["n_forget_positions"], report["n_retain_positions"]) == (n_answer(forget), n_answer(retain))
    assert report["cache_seconds"] > 0 and report["train_seconds"] > 0
    assert report["trainable_parameters"] == 3 * (model.config.hidden_size + model.config.vocab_size + 1)
    with pytest.raises(ValueError, match="unknown settings"):
        fit_t3(model, tok, forget, retain, top_k=20, progress=False)
    # A prompt template reaches the tokenization (and is saved with the head).
    from hf_unlearn.methods.t3.cache import _tokenize

    feats, _, _ = _tokenize(tok, forget, None, "tofu-llama2")
    assert feats[0]["input_ids"] == tokenize_qa(tok, forget[0]["question"], forget[0]["answer"],
                                                template="tofu-llama2")["input_ids"]
    assert feats[0]["input_ids"] != tokenize_qa(tok, forget[0]["question"], forget[0]["answer"])["input_ids"]
    clf = fit_t3(model, tok, forget, retain, prompt_template="tofu-llama2", steps=2, progress=False)
    assert clf.config.prompt_template == "tofu-llama2"
    with pytest.raises(ValueError, match="no-such-template"):
        fit_t3(model, tok, forget, retain, prompt_template="no-such-template", steps=2, progress=False)


def test_t3_raises_forget_nll_far_more_than_retain(target, fitted, synthetic):
    """Head fit on forget10 vs retain90, scored on forget10 and every 6th retain90 row."""
    model, tok = target
    report = fitted.fit_report
    assert report["heldout_balanced_accuracy"] > 0.7
    forget, retain = synthetic["forget10"], synthetic["retain90"][::6]
    fq, fa = [r["question"] for r in forget], [r["answer"] for r in forget]
    rq, ra = [r["question"] for r in retain], [r["answer"] for r in retain]
    base_f, base_r = answer_nll(model, tok, fq, fa).mean(), answer_nll(model, tok, rq, ra).mean()
    deltas = {}
    for temperature, weight in [(1.0, 1.0), (2.0, 1.0), (1.0, 3.0)]:
        scorer = t3_scorer(model, fitted, temperature=temperature, tilt_weight=weight)
        deltas[temperature, weight] = (float(answer_nll(model, tok, fq, fa, scorer=scorer).mean() - base_f),
                                       float(answer_nll(model, tok, rq, ra, scorer=scorer).mean() - base_r))
    print(f"\nT3 tiny: base NLL forget {base_f:.3f} retain {base_r:.3f}; (T, w): (dNLL forget, dNLL retain) {deltas}")
    # The pure tilt: forget answers less likely, retain ones kept. (The head is trained on class-balanced batches,
    # without a per-token prior, and stopped early on held-out BCE: it is less confident than a head fitted to
    # train accuracy 1, so w = 1 moves the forget NLL by tenths of a nat on this tiny set.)
    d_forget, d_retain = deltas[1.0, 1.0]
    assert d_forget > 0.3 and abs(d_retain) < 0.1
    d_forget, d_retain = deltas[2.0, 1.0]  # tempering costs both, the tilt mostly forget
    assert d_forget > 3 * d_retain > 0
    d_forget, d_retain = deltas[1.0, 3.0]  # a stronger tilt
    assert d_forget > max(math.log(20), 3 * deltas[1.0, 1.0][0] - 1) and abs(d_retain) < 0.1


# ----------------------------------------------------------------------------- save / load
def test_save_automodel_and_processor_from_pretrained_round_trip(target, fitted, synthetic, tmp_path):
    model, tok = target
    defaults = fitted.config.temperature, fitted.config.tilt_weight
    fitted.config.temperature, fitted.config.tilt_weight = 1.5, 2.0
    try:
        fitted.save_pretrained(tmp_path)
    finally:
        fitted.config.temperature, fitted.config.tilt_weight = defaults
    assert (tmp_path / "model.safetensors").is_file() and not list(tmp_path.glob("*.bin"))
    config = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(config, T3ClassifierConfig)
    assert (config.rank, config.layer, config.pooling, config.temperature, config.tilt_weight) == (8, -1, "mean", 1.5, 2.0)
    assert (config.hidden_size, config.vocab_size) == (model.config.hidden_size, model.config.vocab_size)
    assert config.base_model_name_or_path == model.name_or_path
    assert config.fit_report["heldout_accuracy"] == fitted.fit_report["heldout_accuracy"]
    loaded = AutoModel.from_pretrained(tmp_path)
    assert isinstance(loaded, T3Classifier)
    for a, b in zip(loaded.state_dict().values(), fitted.state_dict().values()):
        assert torch.equal(a, b)
    enc = left_pad(prompt_ids(tok, [r["question"] for r in synthetic["forget10"][:3]]), tok.pad_token_id)
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
    with Recording.from_pretrained(model, str(tmp_path)) as a, Recording(model, fitted, 1.5, 2.0) as b:
        assert (a.temperature, a.tilt_weight) == (1.5, 2.0)
        out_a = model.generate(**enc, **kw, logits_processor=LogitsProcessorList([a]))
        out_b = model.generate(**enc, **kw, logits_processor=LogitsProcessorList([b]))
    assert torch.equal(out_a, out_b)  # token ids
    # The steps' float32 scores: the loaded head's weights equal the fitted one's byte for byte (above), but they
    # are fresh contiguous copies, so the BLAS path (hence the last bits) may differ; 1e-5 of the largest score
    # is ~100 float32 roundings.
    assert len(a.steps) == len(b.steps)
    for x, y in zip(a.steps, b.steps):
        torch.testing.assert_close(x[1], y[1], rtol=1e-5, atol=1e-5 * float(y[1][y[1].isfinite()].abs().max()))


# ----------------------------------------------------------------------------- refusals
def test_refusals(target, tiny_retain, synthetic):
    model, tok = target
    clf = zero_head(model)
    with pytest.raises(ValueError, match="temperature"):
        T3LogitsProcessor(model, clf, temperature=0.5)
    T3LogitsProcessor(model, clf, temperature=0.5, allow_temperature_below_one=True).close()
    ids = torch.tensor([[0, 5, 6, 7]])
    with pytest.raises(ValueError, match="temperature"):
        t3_log_probs(model, clf, ids, ids, temperature=0.9)
    with pytest.raises(ValueError, match="tilt_weight"):
        t3_scorer(model, clf, tilt_weight=float("nan"))
    other = build_tiny_llama(tok, TinyRecipe(hidden_size=32, intermediate_size=64, num_attention_heads=2))
    with pytest.raises(ValueError, match="hidden size"):
        T3LogitsProcessor(other, clf)
    with pytest.raises(ValueError, match="hidden size"):
        t3_log_probs(other, clf, ids, ids)
    retain_model, _ = tiny_retain
    with pytest.raises(ValueError, match="another base model"):
        T3LogitsProcessor(retain_model, clf)
    T3LogitsProcessor(retain_model, clf, check_base_weights=False).close()  # sizes alone match
    with pytest.raises(ValueError, match="forget set is empty"):
        fit_t3(model, tok, [], synthetic["retain90"], progress=False)
    with pytest.raises(ValueError, match="retain set is empty"):
        fit_t3(model, tok, synthetic["forget10"], [], progress=False)
    with pytest.raises(ValueError, match="also occur in the retain set"):
        fit_t3(model, tok, synthetic["forget10"], synthetic["forget10"][:3], progress=False)
    for bad in (dict(pooling="max"), dict(rank=0), dict(steps=0), dict(holdout_fraction=1.0), dict(temperature=0.0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            T3ClassifierConfig(**bad)
    with pytest.raises(ValueError, match="out of range"):
        T3ClassifierConfig(layer=7).for_base(model)
