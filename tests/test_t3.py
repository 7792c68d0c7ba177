"""T3 (Temper-Then-Tilt): tilt math vs slow references, processor vs re-encoding from scratch,
teacher-forced scoring, unlearning effect on the tiny memorizing model, save/load, refusals."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoConfig, AutoModel, LogitsProcessorList

import hf_unlearn  # noqa: F401  (registers the T3 classes with the Auto classes)
from hf_unlearn.bench.subjects import TinyRecipe, build_tiny_llama, load_tiny
from hf_unlearn.data import build_prompt, collate_qa, tokenize_qa
from hf_unlearn.logprobs import answer_nll
from hf_unlearn.t3 import (
    T3Classifier,
    T3ClassifierConfig,
    T3LogitsProcessor,
    candidates_with_target,
    fit_t3,
    prefix_pooled_states,
    t3_log_probs,
    t3_scorer,
    tilted_log_probs,
    tree_attention_mask,
)


# ----------------------------------------------------------------------------- helpers
def random_classifier(model, layer: int = -1, pooling: str = "mean", scale: float = 20.0, seed: int = 0) -> T3Classifier:
    """An unfitted head with large random weights, so the tilt visibly changes the distribution."""
    torch.manual_seed(seed)
    clf = T3Classifier(T3ClassifierConfig(rank=4, layer=layer, pooling=pooling).for_base(model))
    with torch.no_grad():
        clf.down.weight.mul_(scale)
        clf.feature_mean.normal_()
        clf.feature_scale.uniform_(0.5, 1.5)
    return clf.eval()


def constant_classifier(model, value: float = 1.5) -> T3Classifier:
    clf = T3Classifier(T3ClassifierConfig(rank=2).for_base(model))
    with torch.no_grad():
        clf.down.weight.zero_()
        clf.up.weight.zero_()
        clf.up.bias.fill_(value)
    return clf.eval()


def left_padded_prompts(tokenizer, questions):
    tokenizer.padding_side = "left"
    return tokenizer([build_prompt(tokenizer, q) for q in questions], return_tensors="pt", padding=True)


@torch.no_grad()
def slow_log_f(model, clf, seq: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """log f of an unpadded sequence, re-encoded from scratch (no cache, no custom mask)."""
    hs = model(seq[None], output_hidden_states=True).hidden_states[clf.config.layer][0].float()
    pooled = hs[prompt_len:].mean(0) if clf.config.pooling == "mean" else hs[-1]
    return torch.nn.functional.logsigmoid(clf(pooled).logits)


@torch.no_grad()
def slow_t3_step(model, clf, seq, prompt_len, temperature, top_k, tilt_weight=1.0, extra=None):
    """Reference T3 distribution at the end of ``seq``: candidates (top-k, plus ``extra``), log f and log q."""
    log_p = torch.log_softmax(model(seq[None]).logits[0, -1].float(), -1)
    cands = log_p.topk(top_k).indices.tolist()
    if extra is not None and extra not in cands:
        cands.append(extra)
    log_f = torch.stack([slow_log_f(model, clf, torch.cat([seq, seq.new_tensor([v])]), prompt_len) for v in cands])
    z = log_p[cands] / temperature + tilt_weight * log_f
    return torch.tensor(cands), log_f, z - torch.logsumexp(z, 0)


class RecordingProcessor(T3LogitsProcessor):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.steps = []

    def __call__(self, input_ids, scores):
        out = super().__call__(input_ids, scores)
        self.steps.append(dict(self.last_step, input_ids=input_ids.clone(), out=out.clone()))
        return out


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def target(tiny_pair):
    model, tok = load_tiny(tiny_pair.target)
    return model.eval(), tok


@pytest.fixture(scope="module")
def fitted(target, synthetic):
    model, tok = target
    config = T3ClassifierConfig(rank=8, layer=1, pooling="mean")
    return fit_t3(model, tok, synthetic["forget10"], synthetic["retain90"], config, steps=500, progress=False)


# ----------------------------------------------------------------------------- pure tilt math
def test_tilted_log_probs_match_reference():
    torch.manual_seed(0)
    log_p = torch.log_softmax(torch.randn(3, 5, 7), -1)
    log_f = torch.nn.functional.logsigmoid(torch.randn(3, 5, 7))
    valid = torch.rand(3, 5, 7) > 0.2
    valid[..., 0] = True
    for temperature, w in [(1.0, 1.0), (2.5, 0.5), (4.0, 3.0)]:
        got = tilted_log_probs(log_p, log_f, temperature, w, valid)
        weights = log_p.exp() ** (1 / temperature) * log_f.exp() ** w * valid
        ref = weights / weights.sum(-1, keepdim=True)
        assert torch.allclose(got.exp(), ref, atol=1e-6)
        assert torch.isneginf(got[~valid]).all()


def test_candidates_with_target_and_pooling_and_mask():
    torch.manual_seed(1)
    logits = torch.randn(4, 6, 11)
    targets = torch.randint(0, 11, (4, 6))
    ids, log_p, valid, slot = candidates_with_target(logits, targets, 3)
    for b in range(4):
        for t in range(6):
            top = set(logits[b, t].topk(3).indices.tolist())
            got = ids[b, t][valid[b, t]].tolist()
            assert set(got) == top | {int(targets[b, t])} and len(got) == len(set(got))
            assert ids[b, t, slot[b, t]] == targets[b, t]
    assert torch.allclose(log_p, torch.log_softmax(logits, -1).gather(-1, ids))

    hidden = torch.randn(2, 6, 4)
    answer = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1]], dtype=torch.bool)
    pooled = prefix_pooled_states(hidden, answer, "mean")
    for b in range(2):
        for t in range(6):
            if answer[b, t]:
                ref = hidden[b, : t + 1][answer[b, : t + 1]].mean(0)
                assert torch.allclose(pooled[b, t], ref, atol=1e-6)

    key_valid = torch.tensor([[False, True, True, True, True]])
    mask = tree_attention_mask(key_valid, torch.tensor([[2, 3, 3]]), torch.tensor([[1, 3, 4]]), torch.float32)
    allowed = (mask[0, 0] == 0).int().tolist()
    assert allowed == [[0, 1, 0, 0, 0], [0, 1, 1, 1, 0], [0, 1, 1, 0, 1]]


# ----------------------------------------------------------------------------- processor
@pytest.mark.parametrize("temperature", [1.0, 3.0])
def test_constant_classifier_greedy_equals_plain_greedy(target, synthetic, temperature):
    model, tok = target
    qs = [synthetic["forget10"][0]["question"], synthetic["retain90"][5]["question"], "Who wrote it?"]
    enc = left_padded_prompts(tok, qs)
    plain = model.generate(**enc, max_new_tokens=16, do_sample=False)
    proc = T3LogitsProcessor(model, constant_classifier(model), temperature=temperature, top_k=5)
    tilted = model.generate(**enc, max_new_tokens=16, do_sample=False, logits_processor=LogitsProcessorList([proc]))
    assert torch.equal(plain, tilted)


def test_constant_classifier_full_vocabulary_beam_search_equals_plain(target):
    """T = 1, constant f and k = |V| make T3 the base distribution: beam search (which reorders rows) is unchanged."""
    model, tok = target
    enc = left_padded_prompts(tok, ["Where was the author born?", "Who is Yara Northcott?"])
    plain = model.generate(**enc, num_beams=3, max_new_tokens=8, do_sample=False)
    proc = T3LogitsProcessor(model, constant_classifier(model), temperature=1.0, top_k=model.config.vocab_size)
    tilted = model.generate(**enc, num_beams=3, max_new_tokens=8, do_sample=False, logits_processor=LogitsProcessorList([proc]))
    assert torch.equal(plain, tilted)


@pytest.mark.parametrize(("layer", "pooling"), [(1, "mean"), (-1, "last")])
def test_processor_matches_reencoding_from_scratch(target, synthetic, layer, pooling):
    """Greedy T3 with left padding: every step's candidates, log f and log q equal a slow
    reference that re-encodes each prefix + candidate from scratch, and the chosen token is the argmax."""
    model, tok = target
    clf = random_classifier(model, layer=layer, pooling=pooling)
    qs = [synthetic["forget10"][3]["question"], "Where was the author born?"]
    enc = left_padded_prompts(tok, qs)
    proc = RecordingProcessor(model, clf, temperature=2.0, top_k=4, tilt_weight=1.5)
    out = model.generate(**enc, max_new_tokens=4, do_sample=False, logits_processor=LogitsProcessorList([proc]))
    assert len(proc.steps) == 4
    prompt_width = enc["input_ids"].shape[1]
    changed = False
    for step_index, step in enumerate(proc.steps):
        for b in range(2):
            valid = enc["attention_mask"][b].bool()
            seq = torch.cat([enc["input_ids"][b][valid], step["input_ids"][b, prompt_width:]])
            cands, log_f, log_q = slow_t3_step(model, clf, seq, int(valid.sum()), 2.0, 4, 1.5)
            order_ref, order_got = cands.argsort(), step["candidate_ids"][b].argsort()
            assert torch.equal(cands[order_ref], step["candidate_ids"][b][order_got])
            assert torch.allclose(log_f[order_ref], step["log_f"][b][order_got], atol=1e-4)
            assert torch.allclose(log_q[order_ref], step["log_q"][b][order_got], atol=1e-4)
            chosen = out[b, prompt_width + step_index]
            assert chosen == cands[log_q.argmax()]
            changed |= bool(chosen != cands[0])
            assert torch.isneginf(step["out"][b]).sum() == step["out"].shape[-1] - 4
    assert changed, "the random tilt never changed a greedy choice: the test would not detect a missing tilt"


def test_processor_sampling_resets_between_calls(target, synthetic):
    model, tok = target
    clf = random_classifier(model)
    enc_a = left_padded_prompts(tok, [synthetic["retain90"][0]["question"], "Name the author."])
    enc_b = left_padded_prompts(tok, [synthetic["forget10"][1]["question"]])
    kwargs = dict(max_new_tokens=6, do_sample=True, top_k=0, top_p=1.0, temperature=1.0)
    shared = RecordingProcessor(model, clf, temperature=2.0, top_k=3)
    torch.manual_seed(0)
    first = model.generate(**enc_a, logits_processor=LogitsProcessorList([shared]), **kwargs)
    torch.manual_seed(1)
    second = model.generate(**enc_b, logits_processor=LogitsProcessorList([shared]), **kwargs)
    torch.manual_seed(1)
    fresh = model.generate(**enc_b, logits_processor=LogitsProcessorList([T3LogitsProcessor(model, clf, 2.0, 3)]), **kwargs)
    assert torch.equal(second, fresh)
    width = enc_a["input_ids"].shape[1]
    checked = 0
    for i, step in enumerate(shared.steps[: first.shape[1] - width]):
        for b in range(2):
            if (first[b, width : width + i] == tok.eos_token_id).any():
                continue  # finished rows are padded by generate, whatever the processor says
            assert first[b, width + i] in step["candidate_ids"][b]
            checked += 1
    assert checked >= 6


@torch.no_grad()
def test_processor_reencodes_reordered_beams(target):
    """Beam search reorders rows between steps: the processor re-encodes them, keeping the prompt boundary."""
    model, tok = target
    clf = random_classifier(model, layer=1)
    prompt = tok([build_prompt(tok, "Where was the author born?")] * 2, return_tensors="pt")["input_ids"]
    n_prompt = prompt.shape[1]
    proc = T3LogitsProcessor(model, clf, temperature=2.0, top_k=4)
    ids = prompt
    steps = [None, torch.tensor([[50], [60]]), "reorder", torch.tensor([[80], [90]])]
    for step in steps:
        if isinstance(step, str):
            ids = torch.cat([ids[[1, 1]], torch.tensor([[70], [71]])], dim=-1)
        elif step is not None:
            ids = torch.cat([ids, step], dim=-1)
        proc(ids, model(ids).logits[:, -1])
        if ids.shape[1] > n_prompt + 1:
            for b in range(2):
                cands, log_f, log_q = slow_t3_step(model, clf, ids[b], n_prompt, 2.0, 4)
                got = proc.last_step
                order_ref, order_got = cands.argsort(), got["candidate_ids"][b].argsort()
                assert torch.equal(cands[order_ref], got["candidate_ids"][b][order_got])
                assert torch.allclose(log_f[order_ref], got["log_f"][b][order_got], atol=1e-4)
                assert torch.allclose(log_q[order_ref], got["log_q"][b][order_got], atol=1e-4)


# ----------------------------------------------------------------------------- teacher-forced scoring
def _batch(tok, rows, padding_side):
    features = [tokenize_qa(tok, r["question"], r["answer"]) for r in rows]
    return collate_qa(features, tok.pad_token_id, padding_side)


def test_t3_log_probs_normalise_and_match_slow_reference(target, synthetic):
    model, tok = target
    clf = random_classifier(model, layer=1)
    # Answers the model has never seen, so many targets fall outside the top-k (the k+1 slot path).
    rows = [
        {"question": synthetic["forget10"][0]["question"], "answer": "Blue river stone."},
        {"question": "Where was the author born?", "answer": synthetic["retain90"][2]["answer"][:30]},
    ]
    right = _batch(tok, rows, "right")
    left = _batch(tok, rows, "left")
    args = (model, clf)
    lp_r, details = t3_log_probs(
        *args, right["input_ids"], right["labels"], right["attention_mask"], right["position_ids"],
        temperature=2.0, top_k=3, return_details=True,
    )
    lp_l = t3_log_probs(*args, left["input_ids"], left["labels"], left["attention_mask"], left["position_ids"],
                        temperature=2.0, top_k=3)
    # Same numbers with left padding (per example, aligned on the answer tokens).
    for b in range(2):
        assert torch.allclose(lp_r[b][right["labels"][b] != -100], lp_l[b][left["labels"][b] != -100], atol=1e-4)
    # Normalisation over the candidate set, target included.
    slots = details["positions"] >= 0
    probs = details["log_q"].exp().masked_fill(~details["valid"], 0).sum(-1)
    assert torch.allclose(probs[slots], torch.ones_like(probs[slots]), atol=1e-5)
    assert (details["valid"].sum(-1)[slots] == 4).any(), "no target outside the top-k: the k+1 path is untested"
    # Slow reference at every answer position.
    for b, row in enumerate(rows):
        feats = tokenize_qa(tok, row["question"], row["answer"])
        ids, n_prompt = torch.tensor(feats["input_ids"]), feats["prompt_length"]
        for t in range(n_prompt, len(ids)):
            cands, _, log_q = slow_t3_step(model, clf, ids[:t], n_prompt, 2.0, 3, extra=int(ids[t]))
            ref = log_q[cands.tolist().index(int(ids[t]))]
            assert abs(float(lp_r[b, t]) - float(ref)) < 1e-4
    assert torch.all(lp_r[right["labels"] == -100] == 0)


def test_t3_log_probs_equal_processor_distribution(target, synthetic):
    """Scoring a T3 greedy generation teacher-forced reproduces the processor's log q of each chosen token."""
    model, tok = target
    clf = random_classifier(model, layer=-1, seed=3)
    enc = left_padded_prompts(tok, [synthetic["retain90"][7]["question"]])
    proc = RecordingProcessor(model, clf, temperature=1.5, top_k=5)
    out = model.generate(**enc, max_new_tokens=6, do_sample=False, logits_processor=LogitsProcessorList([proc]))
    width = enc["input_ids"].shape[1]
    labels = out.clone()
    labels[:, :width] = -100
    lp = t3_log_probs(model, clf, out, labels, temperature=1.5, top_k=5)
    for i, step in enumerate(proc.steps):
        chosen = out[0, width + i]
        expected = step["log_q"][0][step["candidate_ids"][0] == chosen]
        assert torch.allclose(lp[0, width + i], expected, atol=1e-4)


# ----------------------------------------------------------------------------- unlearning effect
def test_t3_lowers_forget_far_more_than_retain(target, fitted, synthetic):
    """Classifier fit on forget10 vs retain90; scored on the same question sets (forget10, every 6th retain90 row)."""
    model, tok = target
    report = fitted.fit_report
    assert report["heldout_balanced_accuracy"] > 0.75 and report["train_balanced_accuracy"] > 0.9
    assert report["parameter_share"] < 0.01
    forget = synthetic["forget10"]
    retain = synthetic["retain90"][::6]
    fq, fa = [r["question"] for r in forget], [r["answer"] for r in forget]
    rq, ra = [r["question"] for r in retain], [r["answer"] for r in retain]
    base_f, base_r = answer_nll(model, tok, fq, fa).mean(), answer_nll(model, tok, rq, ra).mean()
    deltas = {}
    for temperature, weight in [(1.0, 1.0), (2.0, 1.0), (1.0, 3.0)]:
        scorer = t3_scorer(model, fitted, temperature=temperature, top_k=20, tilt_weight=weight)
        nf = answer_nll(model, tok, fq, fa, scorer=scorer).mean()
        nr = answer_nll(model, tok, rq, ra, scorer=scorer).mean()
        deltas[temperature, weight] = (round(float(nf - base_f), 3), round(float(nr - base_r), 3))
    print(f"\nT3 tiny: base NLL forget {base_f:.3f} retain {base_r:.3f}; (T, w): (dNLL forget, dNLL retain) {deltas}")
    print(f"fit report {report}")
    d_forget, d_retain = deltas[1.0, 1.0]  # pure tilt: forget answers less likely, retain ones untouched
    assert d_forget > 0.2 and abs(d_retain) < 0.05
    d_forget, d_retain = deltas[2.0, 1.0]  # tempering costs both, the tilt mostly forget
    assert d_forget > 0.8 and d_forget > 2.5 * d_retain
    d_forget, d_retain = deltas[1.0, 3.0]  # a stronger tilt: forget probability / 5 or less, retain kept
    assert d_forget > math.log(5) and abs(d_retain) < 0.05


# ----------------------------------------------------------------------------- save / load
def test_save_reload_automodel_round_trip(target, fitted, tmp_path):
    model, _ = target
    fitted.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    assert not list(tmp_path.glob("*.bin"))
    config = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(config, T3ClassifierConfig) and config.model_type == "t3_classifier"
    assert (config.rank, config.layer, config.pooling) == (8, 1, "mean")
    assert config.hidden_size == model.config.hidden_size and config.vocab_size == model.config.vocab_size
    assert config.base_model_name_or_path == model.name_or_path
    assert config.fit_report["heldout_balanced_accuracy"] == fitted.fit_report["heldout_balanced_accuracy"]
    loaded = AutoModel.from_pretrained(tmp_path)
    assert isinstance(loaded, T3Classifier)
    x = torch.randn(5, model.config.hidden_size)
    assert torch.allclose(loaded(x).logits, fitted(x).logits, atol=1e-6)
    assert torch.equal(loaded.feature_mean, fitted.feature_mean)
    loaded.check_base(model)


# ----------------------------------------------------------------------------- refusals
def test_refusals(target, tiny_retain, synthetic):
    model, tok = target
    clf = constant_classifier(model)
    with pytest.raises(ValueError, match="temperature"):
        T3LogitsProcessor(model, clf, temperature=0.5)
    T3LogitsProcessor(model, clf, temperature=0.5, allow_temperature_below_one=True)
    ids = torch.tensor([[0, 5, 6, 7]])
    with pytest.raises(ValueError, match="temperature"):
        t3_log_probs(model, clf, ids, ids, temperature=0.9)
    with pytest.raises(ValueError, match="temperature"):
        t3_scorer(model, clf, temperature=0.9)
    for k in (0, -3):
        with pytest.raises(ValueError, match="top_k"):
            T3LogitsProcessor(model, clf, temperature=2.0, top_k=k)
        with pytest.raises(ValueError, match="top_k"):
            t3_log_probs(model, clf, ids, ids, top_k=k)
    # Another base: different sizes, or the same sizes but another model.
    tok_small = tok
    other = build_tiny_llama(tok_small, TinyRecipe(hidden_size=32, intermediate_size=64, num_attention_heads=2))
    with pytest.raises(ValueError, match="hidden size"):
        T3LogitsProcessor(other, clf)
    with pytest.raises(ValueError, match="hidden size"):
        t3_log_probs(other, clf, ids, ids)
    retain_model, _ = tiny_retain
    with pytest.raises(ValueError, match="another base model"):
        T3LogitsProcessor(retain_model, clf)
    T3LogitsProcessor(retain_model, clf, check_base_name=False)
    # Empty or overlapping forget/retain sets, bad config values.
    with pytest.raises(ValueError, match="forget set is empty"):
        fit_t3(model, tok, [], synthetic["retain90"], progress=False)
    with pytest.raises(ValueError, match="retain set is empty"):
        fit_t3(model, tok, synthetic["forget10"], [], progress=False)
    with pytest.raises(ValueError, match="also occur in the retain set"):
        fit_t3(model, tok, synthetic["forget10"], synthetic["forget10"][:3], progress=False)
    with pytest.raises(ValueError, match="pooling"):
        T3ClassifierConfig(pooling="max")
    with pytest.raises(ValueError, match="rank"):
        T3ClassifierConfig(rank=0)
    with pytest.raises(ValueError, match="out of range"):
        T3ClassifierConfig(layer=7).for_base(model)
