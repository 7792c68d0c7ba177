"""Documents (plain texts) for GROM, T3, MASC, the selection criterion and the attacks, on the tiny models."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_unlearn.data.documents import (
    as_documents,
    chunk_documents,
    document_heads,
    documents_dataset,
)
from hf_unlearn.logprobs import causal_lm_scorer

CHUNK = 48


def _texts(rows):
    """One document per row: the question and its answer as running text."""
    return [f"{r['question']} {r['answer']}" for r in rows]


def _chunk_keys(docs, tok, length=CHUNK):
    """Every position of every chunk predicts a token: a chunk of ``n`` tokens has ``n - 1`` keys."""
    return sum(len(c["input_ids"]) - 1 for c in chunk_documents(docs, tok, length))


def _slow_doc_nll(model, tok, docs, length):
    """Reference: each document alone (BOS first when the tokenizer adds one), its first ``length`` tokens, one
    forward each, ``-mean_t log softmax(logits_{t-1})[y_t]`` over every token but the first."""
    out = []
    bos = [tok.bos_token_id] if tok("a")["input_ids"][:1] == [tok.bos_token_id] else []
    for d in docs:
        ids = torch.tensor([(bos + tok(d, add_special_tokens=False)["input_ids"])[:length]])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), -1)
        out.append(float(-logp.gather(-1, ids[0, 1:, None]).mean()))
    return np.array(out)


def test_as_documents_tells_documents_from_rows(tmp_path, synthetic):
    texts = _texts(synthetic["forget10"][:3])
    assert as_documents(texts) == texts
    assert as_documents(texts, plain_lists=False) is None  # a plain list only where the caller allows it
    assert as_documents([{"text": t} for t in texts], plain_lists=False) == texts
    assert as_documents(documents_dataset(texts), plain_lists=False) == texts
    assert as_documents(synthetic["forget10"]) is None and as_documents(None) is None and as_documents([]) is None
    assert as_documents("no such file") is None
    (tmp_path / "a.txt").write_text(texts[0])
    assert as_documents(tmp_path / "a.txt") == [texts[0]]


def test_document_heads_cut_each_document_alone(tiny_pair):
    from hf_unlearn.demo import load_tiny

    _, tok = load_tiny(tiny_pair.target)
    docs = ["short text", "a much longer text " * 20]
    feats, cut = document_heads(docs, tok, 16)
    assert cut == 1 and len(feats) == 2 and len(feats[1]["input_ids"]) == 16
    assert all(f["labels"] == f["input_ids"] for f in feats)
    whole = tok(docs[0], add_special_tokens=False)["input_ids"]
    assert feats[0]["input_ids"][-len(whole):] == whole


def test_grom_on_documents_keys_every_chunk_position_and_unlearns(tiny_target, synthetic, tmp_path):
    import json

    from hf_unlearn.methods.grom import GROMConfig, fit_grom
    from hf_unlearn.methods.grom.inputs import _prepare

    model, tok = tiny_target
    forget, retain = _texts(synthetic["forget10"]), _texts(synthetic["retain90"][:60])
    cfg = GROMConfig(target_modules="lm_head", forget_weight=10.0, suppression_margin=30.0, ridge=1e-2,
                     max_length=CHUNK, progress=False)
    path = tmp_path / "forget.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in forget))
    prep = _prepare(model, tok, path, documents_dataset(retain), cfg, None)
    assert len(prep.forget_feats) == len(chunk_documents(forget, tok, CHUNK))
    assert len(prep.retain_feats) == len(chunk_documents(retain, tok, CHUNK))
    sampled = _prepare(model, tok, path, documents_dataset(retain), GROMConfig(
        target_modules="lm_head", max_length=CHUNK, retain_sample=3, progress=False), None)
    assert len(sampled.retain_feats) == 3  # the retain sample is drawn over chunks
    edit = fit_grom(model, tok, documents_dataset(forget), [{"text": t} for t in retain], cfg)
    assert edit.stats["num_forget_keys"] == _chunk_keys(forget, tok)
    assert edit.stats["num_retain_keys"] == _chunk_keys(retain, tok)
    assert edit.num_forget_examples == len(chunk_documents(forget, tok, CHUNK))

    def nll(docs):
        return float(_slow_doc_nll(model, tok, docs, CHUNK).mean())

    f0, r0 = nll(forget), nll(retain)
    edit.apply_(model)
    f1, r1 = nll(forget), nll(retain)
    edit.apply_(model, -1)
    assert f1 - f0 > 4 * max(r1 - r0, 0.01), (f0, f1, r0, r1)
    # documents to forget, question/answer rows to keep: each side read as what it is
    mixed = fit_grom(model, tok, documents_dataset(forget), synthetic["retain90"][:20], cfg)
    assert mixed.stats["num_forget_keys"] == edit.stats["num_forget_keys"]
    with pytest.raises(ValueError, match="also occur in the retain set"):
        fit_grom(model, tok, documents_dataset(forget), documents_dataset(retain + forget[:1]), cfg)


def test_grom_path_selects_on_a_documents_criterion_cached_as_full(tiny_target, synthetic):
    from hf_unlearn.methods.grom import GROMConfig
    from hf_unlearn.methods.grom.strength_path import fit_grom_path
    from hf_unlearn.selection import SelectionCriterion

    model, tok = tiny_target
    forget, retain = _texts(synthetic["forget10"]), _texts(synthetic["retain90"][:60])
    path = fit_grom_path(model, tok, documents_dataset(forget), documents_dataset(retain),
                         GROMConfig(max_length=CHUNK, progress=False), scales=(0.25, 1.0), retain_weights=(1.0,))
    records = []
    for cached in (True, False):
        criterion = SelectionCriterion(forget, _texts(synthetic["holdout10"]), _texts(synthetic["retain90"][100:110]),
                                       max_length=CHUNK)
        path.select(criterion, model, tok, cached=cached)
        records.append(path.record)
    for a, b in zip(records[0].measurements, records[1].measurements):
        assert a["forget_nll"] == pytest.approx(b["forget_nll"], rel=1e-4)
        assert a["holdout_nll"] == pytest.approx(b["holdout_nll"], rel=1e-4)
    assert records[0].measurements[1]["forget_nll"] > records[0].measurements[0]["forget_nll"]


def test_t3_on_documents_caches_every_chunk_position(tiny_target, synthetic):
    from hf_unlearn.methods.t3 import T3ClassifierConfig, fit_t3

    model, tok = tiny_target
    forget, retain = _texts(synthetic["forget10"]), _texts(synthetic["retain90"][:60])
    clf = fit_t3(model, tok, documents_dataset(forget), documents_dataset(retain), T3ClassifierConfig(rank=8),
                 max_length=CHUNK, progress=False)
    report = clf.fit_report
    assert report["n_forget_examples"] == len(chunk_documents(forget, tok, CHUNK))
    assert report["n_retain_examples"] == len(chunk_documents(retain, tok, CHUNK))
    assert report["n_forget_positions"] == _chunk_keys(forget, tok)
    assert report["n_retain_positions"] == _chunk_keys(retain, tok)
    assert report["train_balanced_accuracy"] > 0.6, report["train_balanced_accuracy"]
    with pytest.raises(ValueError, match="also occur in the retain set"):
        fit_t3(model, tok, documents_dataset(forget), documents_dataset(forget[:2] + retain), progress=False)
    # calibrated on a documents criterion: the one-pass measurements are the tilted scorer's own
    from hf_unlearn.methods.t3 import t3_scorer
    from hf_unlearn.methods.t3.calibration import calibrate_t3
    from hf_unlearn.selection import SelectionCriterion

    criterion = SelectionCriterion(forget[:10], _texts(synthetic["holdout10"][:10]),
                                   _texts(synthetic["retain90"][100:110]), max_length=CHUNK)
    record = calibrate_t3(model, tok, clf, criterion, temperatures=(1.0, 2.0), tilt_weights=(1.0,))
    p = record.candidates[-1]
    again = criterion.measure(model, tok, scorer=t3_scorer(model, clf, p["temperature"], p["tilt_weight"]))
    assert again["forget_nll"] == pytest.approx(record.measurements[-1]["forget_nll"], rel=1e-6)
    assert again["holdout_nll"] == pytest.approx(record.measurements[-1]["holdout_nll"], rel=1e-6)


def test_criterion_with_holdout_documents_scores_every_token(tiny_target, synthetic):
    from hf_unlearn.selection import SelectionCriterion

    model, tok = tiny_target
    forget = _texts(synthetic["forget10"][:8])
    holdout = [t[::-1] for t in _texts(synthetic["forget10"][8:16])]  # text the model never saw
    validation = _texts(synthetic["retain90"][:6])
    crit = SelectionCriterion(forget, holdout, validation, max_length=CHUNK, groups=2)
    assert len(crit.forget) == 8 and len(crit.holdout) == 8
    got = np.array([-lp.mean() for lp in crit._score(model, tok, crit.holdout, causal_lm_scorer(model))])
    np.testing.assert_allclose(got, _slow_doc_nll(model, tok, holdout, CHUNK), rtol=1e-4)
    m = crit.measure(model, tok)
    np.testing.assert_allclose(m["forget_nll"], _slow_doc_nll(model, tok, forget, CHUNK).mean(), rtol=1e-4)
    assert m["holdout_nll"] > m["forget_nll"]  # the target knows its forget documents
    np.testing.assert_allclose(m["retain_validation_nll"], _slow_doc_nll(model, tok, validation, CHUNK).mean(),
                               rtol=1e-4)
    assert m["retain_change"] == 0.0  # the first measurement is the original
    with pytest.raises(ValueError, match="documents for both"):
        SelectionCriterion(forget, synthetic["forget10"][8:16], validation)
    with pytest.raises(ValueError, match="also occur in the holdout"):
        SelectionCriterion(forget, holdout + forget[:1], validation)


def test_masc_on_documents_penalises_the_continuation_of_each_chunk(tiny_target, synthetic, tmp_path):
    from hf_unlearn.methods.masc import MASCConfig, MASCTrainer

    model, tok = tiny_target
    forget = _texts(synthetic["forget10"])
    cfg = MASCConfig(
        output_dir=str(tmp_path / "masc"), report_to="none", save_strategy="no", gradient_checkpointing=False,
        disable_tqdm=True, seed=0, recipe="llama2-7b", learning_rate=1e-3, per_device_train_batch_size=4,
        use_peft=False, forget_weight=1.0, continuation_min_prefix_tokens=4, continuation_min_suffix_tokens=4,
        check_every=2, max_steps=4, retain_weight=0.0, max_length=CHUNK,
    )
    with pytest.raises(ValueError, match="also in the forget set"):
        MASCTrainer(model, cfg, train_dataset=forget, processing_class=tok, calibrate_stop_on=forget[:2])
    trainer = MASCTrainer(model, cfg, train_dataset=forget, processing_class=tok)
    chunks = chunk_documents(forget, tok, CHUNK)
    assert len(trainer.forget_dataset) == len(chunks)
    labels = torch.tensor([c["labels"] for c in chunks if len(c["labels"]) == CHUNK])
    active = trainer.active_mask(labels, torch.Generator().manual_seed(0))
    n = CHUNK - 1  # every token but the first is an "answer" token
    kept = active.sum(-1)
    assert bool(((kept >= n - int(0.6 * n) - 1) & (kept <= n - int(0.2 * n) + 1)).all()), kept
    for row in active:  # the active positions are the chunk's tail after the cut
        first = int(row.nonzero()[0])
        assert bool(row[first:].all()) and not bool(row[:first].any())
    before = trainer.probe(trainer.model, "trigger", 0)  # per-chunk violation rates over the continuations
    trainer.train()
    after = trainer.probe(trainer.model, "trigger", 0)
    assert np.mean(after) < np.mean(before), (before, after)  # the margins of the continuations went down


def test_relearning_and_quantization_attacks_on_documents(tiny_pair, tiny_target, synthetic):
    from hf_unlearn.demo import load_tiny
    from hf_unlearn.evaluation.attack_relearn import relearning_attack, split_forget_rows
    from hf_unlearn.evaluation.attacks import quantization_attack

    model, tok = tiny_target
    original, _ = load_tiny(tiny_pair.target)
    forget, retain = _texts(synthetic["forget10"]), _texts(synthetic["retain90"][:8])
    # unlearn a little: gradient ascent on the forget documents
    opt = torch.optim.SGD(model.parameters(), lr=5e-2)
    for _ in range(6):
        for f in chunk_documents(forget, tok, 256):
            ids = torch.tensor([f["input_ids"]])
            loss = -model(input_ids=ids, labels=ids).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.zero_grad(set_to_none=True)
    model.eval()
    result = relearning_attack(model, tok, forget, retain, original=original, learning_rate=3e-3, progress=False)
    _, eval_docs = split_forget_rows([{"text": t} for t in forget], 0.1, 0)
    limit = 2048 if model.config.max_position_embeddings is None else min(2048, model.config.max_position_embeddings)
    expected = _slow_doc_nll(model, tok, [r["text"] for r in eval_docs], limit).mean()
    np.testing.assert_allclose(result["forget_nll_before"], expected, rtol=1e-4)
    assert result["num_eval_rows"] == len(eval_docs) and result["forget_rouge_l_before"] is None
    assert result["forget_nll_after"] < result["forget_nll_before"]
    assert result["benign"]["num_train_rows"] == len(retain)
    quant = quantization_attack(model, tok, documents_dataset(forget), bits=(8,), rouge=False)
    assert quant["num_rows"] == len(forget)
    np.testing.assert_allclose(quant["full_precision"]["forget_nll"],
                               _slow_doc_nll(model, tok, forget, limit).mean(), rtol=1e-4)
    assert np.isfinite(quant["bits"]["8"]["forget_nll"])
