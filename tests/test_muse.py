"""MUSE: the three `evaluate` modules on hand-worked examples and against rouge-score and the authors' AUC, the
evaluator's pieces, the typed report's round trip, a tiny-model evaluate_muse and a tiny-model unlearning run on
MUSE-News documents."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import evaluate
import numpy as np
import pytest
import torch
from rouge_score import rouge_scorer

import hf_unlearn
from hf_unlearn.evaluation import (
    NEWS_RETRAIN_AUC,
    MUSEReport,
    build_knowmem_prompt,
    evaluate_muse,
    load_muse_part,
    min_k_score,
    render_muse_report,
    text_min_k_scores,
)
from hf_unlearn.evaluation.muse import cut_answer, fit_prompt, reference_auc_of, truncate_to_tokens

datasets.disable_progress_bars()

REPO_ROOT = Path(__file__).resolve().parents[1]
def _load(name):
    return evaluate.load(hf_unlearn.metric_path(name), keep_in_memory=True)


# ----- the evaluate modules -------------------------------------------------------------------------------------

def test_verbmem_hand_worked_and_against_rouge_score():
    verbmem = _load("muse_verbmem")
    # LCS("the cat sat on the mat", "the cat sat on a mat") = 5 of 6 words each side: P = R = F1 = 5/6;
    # "x y" against "y z w": LCS 1, P = 1/2, R = 1/3, F1 = 2 * (1/6) / (5/6) = 0.4
    out = verbmem.compute(predictions=["the cat sat on the mat", "x y"], references=["the cat sat on a mat", "y z w"])
    assert out["rouge_l_f1_per_example"] == pytest.approx([5 / 6, 0.4])
    assert out["verbmem"] == pytest.approx(100 * (5 / 6 + 0.4) / 2)
    # against rouge-score's own ROUGE-L F1, no stemming (the authors' RougeEvalLogger), on varied text
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)
    rng = np.random.default_rng(0)
    words = "running runs ran the a of Bank banks £55,000 1472 U.S. rate-cut".split()
    preds = [" ".join(rng.choice(words, size=rng.integers(0, 12))) for _ in range(20)]
    refs = [" ".join(rng.choice(words, size=rng.integers(1, 12))) for _ in range(20)]
    got = verbmem.compute(predictions=preds, references=refs)["rouge_l_f1_per_example"]
    want = [scorer.score(r, p)["rougeL"].fmeasure for p, r in zip(preds, refs)]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert verbmem.compute(predictions=["running"], references=["runs"])["verbmem"] == 0.0  # no stemming


def test_knowmem_cuts_at_the_stop_strings_then_scores():
    knowmem = _load("muse_knowmem")
    raw = ["1472\n\nQuestion: When", "in Paris\nQuestion: where", "Paris Question: x", "the Bank of England"]
    gold = ["1472", "Paris", "Paris", "Bank of England"]
    out = knowmem.compute(predictions=raw, references=gold)
    # cut answers: "1472" (F1 1), "in Paris" (P 1/2, R 1, F1 2/3), "Paris " (1), "the Bank of England" (P 3/4, R 1)
    expected = [1.0, 2 / 3, 1.0, 2 * 0.75 / 1.75]
    assert out["rouge_l_f1_per_example"] == pytest.approx(expected)
    assert out["knowmem"] == pytest.approx(100 * np.mean(expected))
    # the evaluator's cut is the module's (the authors' get_prefix_before_words_occur)
    assert [cut_answer(r) for r in raw] == ["1472", "in Paris", "Paris ", "the Bank of England"]


def _authors_auc(forget_scores, holdout_scores):
    """The authors' AUC, ``roc_curve(y, -score)`` with forget labelled 0 and holdout 1, as the probability that a
    holdout text outranks a forget text by ``-score`` (ties one half), pair by pair."""
    total = 0.0
    for h in holdout_scores:
        for f in forget_scores:
            total += 1.0 if -h > -f else 0.5 if h == f else 0.0
    return total / (len(forget_scores) * len(holdout_scores))


def test_privleak_hand_worked_and_against_the_authors_formula():
    privleak = _load("muse_privleak")
    # forget [0.1, 0.5], holdout [0.3, 0.5]: pairs (f > h): (0.5, 0.3) = 1, (0.5, 0.5) = 1/2 -> AUC = 1.5 / 4
    out = privleak.compute(predictions=[0.1, 0.5, 0.3, 0.5], references=[0, 0, 1, 1])
    assert out["auc"] == pytest.approx(0.375)
    assert out["reference_auc"] == NEWS_RETRAIN_AUC == pytest.approx(0.4772)
    assert out["privleak"] == pytest.approx((0.375 - 0.4772) / 0.4772 * 100)
    # a target that memorised the forget texts (low scores): AUC 0, PrivLeak -100 against any reference
    assert privleak.compute(predictions=[0.1, 0.2, 0.9, 1.0], references=[0, 0, 1, 1], reference_auc=0.6)[
        "privleak"] == pytest.approx(-100.0)
    rng = np.random.default_rng(1)
    forget, holdout = rng.normal(2.0, 1.0, 40).round(1), rng.normal(2.3, 1.0, 30).round(1)  # with ties
    out = privleak.compute(predictions=[*forget, *holdout], references=[0] * 40 + [1] * 30, reference_auc=0.51)
    auc = _authors_auc(forget, holdout)
    assert out["auc"] == pytest.approx(auc, abs=1e-12)
    assert out["privleak"] == pytest.approx((auc - 0.51) / 0.51 * 100)
    # MUSE's AUC is 1 - the TOFU module's (forget 0 / holdout 1 by the score itself), and the PrivLeaks agree
    tofu = _load("tofu_privleak").compute(predictions=[*forget, *holdout], references=[0] * 40 + [1] * 30,
                                          reference_auc=1 - 0.51)
    assert out["auc"] == pytest.approx(1 - tofu["auc"], abs=1e-12)
    assert out["privleak"] == pytest.approx(tofu["privleak"])
    with pytest.raises(ValueError, match="at least one"):
        privleak.compute(predictions=[0.1, 0.2], references=[0, 0])
    with pytest.raises(ValueError, match="reference AUC"):
        privleak.compute(predictions=[0.1, 0.2], references=[0, 1], reference_auc=0.0)


# ----- the evaluator's pieces -----------------------------------------------------------------------------------

def test_knowmem_prompt_and_prompt_fitting():
    icl = [{"question": "Q1?", "answer": "A1"}, {"question": "Q2?", "answer": "A2"}]
    assert build_knowmem_prompt("Q?", icl) == "Question: Q1?\nAnswer: A1\n\nQuestion: Q2?\nAnswer: A2\n\nQuestion: Q?\nAnswer: "
    assert build_knowmem_prompt("Q?", []) == "Question: Q?\nAnswer: "
    assert fit_prompt([0, 5, 6, 7, 8], 3, prefix=[0]) == [0, 7, 8]  # BOS kept, the prompt's end kept
    assert fit_prompt([5, 6, 7, 8], 3, prefix=[0]) == [6, 7, 8]
    assert fit_prompt([0, 5], 3, prefix=[0]) == [0, 5]


def test_muse_data_loads_from_the_local_folder(muse_dir, tmp_path):
    verbmem = load_muse_part(muse_dir, "verbmem_forget")
    assert len(verbmem) == 100 and set(verbmem[0]) == {"prompt", "gt"}
    assert len(load_muse_part(muse_dir, "knowmem_retain")) == 100  # retain2_qa.json
    assert len(load_muse_part(muse_dir, "knowmem_forget_icl")) == 10
    texts = load_muse_part(muse_dir, "privleak_holdout")
    assert len(texts) == 100 and isinstance(texts[0], str)
    # the authors' own naming (knowmem/retain_qa.json) is read too
    (tmp_path / "knowmem").mkdir()
    (tmp_path / "knowmem" / "retain_qa.json").write_text(json.dumps([{"question": "q", "answer": "a"}]))
    assert load_muse_part(tmp_path, "knowmem_retain") == [{"question": "q", "answer": "a"}]
    with pytest.raises(FileNotFoundError, match="forget_qa.json"):
        load_muse_part(tmp_path, "knowmem_forget")
    (tmp_path / "knowmem" / "forget_qa.json").write_text(json.dumps([{"question": "q"}]))
    with pytest.raises(ValueError, match="string fields"):
        load_muse_part(tmp_path, "knowmem_forget")
    with pytest.raises(FileNotFoundError, match="not a Hub dataset id"):
        load_muse_part(tmp_path / "missing" / "deeper", "verbmem_forget")
    with pytest.raises(ValueError, match="Unknown MUSE part"):
        load_muse_part(muse_dir, "verbmem_retain")


def test_min_k_scores_of_texts_match_one_text_at_a_time(tiny_target, muse_dir):
    model, tok = tiny_target
    texts = ["Short text.", *load_muse_part(muse_dir, "privleak_forget")[:2], "A second, somewhat longer text here."]
    batched, truncated = text_min_k_scores(model, tok, texts, batch_size=4)
    assert truncated == 2  # the two articles are longer than the tiny model's 256 positions
    model.eval()
    for text, got in zip(texts, batched):
        ids = tok(text, add_special_tokens=True)["input_ids"][:256]
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].double(), -1)
        lp = logp.gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1).numpy()
        k = max(1, int(len(lp) * 0.4))
        assert got == pytest.approx(-np.sort(lp)[:k].mean(), abs=1e-4)
        assert got == pytest.approx(min_k_score(lp, 0.4), abs=1e-4)


def test_verbmem_truth_is_cut_as_the_authors_cut_it(tiny_target):
    _, tok = tiny_target
    text = "The central bank raised its main rate to 5.25% on Thursday."
    ids = tok(text, add_special_tokens=True)["input_ids"]
    assert truncate_to_tokens(tok, text, 10) == tok.decode(ids[:10], skip_special_tokens=True)
    assert truncate_to_tokens(tok, text, 1000) == text


# ----- the report -----------------------------------------------------------------------------------------------

def _report(**overrides) -> MUSEReport:
    values = dict(model_name="m", source="muse-bench/MUSE-News", verbmem_forget=58.4, knowmem_forget=63.9,
                  privleak=-99.8, knowmem_retain=55.2, privleak_auc=0.001, reference_auc=0.4772,
                  reference_source="muse-news-retrain", num_examples={"verbmem_forget": 100},
                  per_example={"privleak": {"forget_min_k": [1.5, 2.0]}}, settings={"max_examples": None},
                  hf_unlearn_version="0")
    values.update(overrides)
    return MUSEReport(**values)


def test_report_round_trip(tmp_path):
    report = _report(extra={"note": "kept"})
    data = report.to_dict()
    assert data["format"] == "hf_unlearn.muse_report" and data["note"] == "kept"
    assert MUSEReport.from_dict(json.loads(json.dumps(data))) == report
    path = report.save(tmp_path / "muse.json")
    assert MUSEReport.load(path) == report and MUSEReport.load(path).to_dict() == data
    partial = MUSEReport(model_name="m", source="s", privleak=-5.0)
    assert MUSEReport.from_dict(partial.to_dict()) == partial and partial.verbmem_forget is None
    table = render_muse_report(report)
    assert "| VerbMem forget (C1) | 58.40 |" in table and "| KnowMem retain (C4) | 55.20 |" in table
    with pytest.raises(ValueError, match="finite number"):
        _report(privleak=float("nan"))
    with pytest.raises(ValueError, match="Not a MUSE report"):
        MUSEReport.from_dict({**data, "format": "other"})
    with pytest.raises(ValueError, match="lacks"):
        MUSEReport.from_dict({"format": "hf_unlearn.muse_report", "source": "s"})
    # a retain model's report gives PrivLeak's reference AUC
    assert reference_auc_of(path) == (0.001, "m")
    assert reference_auc_of(None) == (NEWS_RETRAIN_AUC, "muse-news-retrain")
    assert reference_auc_of(0.5) == (0.5, "given")
    with pytest.raises(ValueError, match="no privleak_auc"):
        reference_auc_of(_report(privleak_auc=None))


# ----- evaluate_muse on the tiny model --------------------------------------------------------------------------

def test_evaluate_muse_on_a_subset(tiny_target, muse_dir, tmp_path):
    model, tok = tiny_target
    report = evaluate_muse(model, tok, source=muse_dir, max_examples=3, batch_size=4, progress=False,
                           output_path=tmp_path / "muse.json", model_name="tiny")
    assert MUSEReport.load(tmp_path / "muse.json") == report
    assert report.num_examples == {"verbmem_forget": 3, "knowmem_forget": 3, "knowmem_forget_icl": 10,
                                   "privleak_forget": 3, "privleak_holdout": 3, "knowmem_retain": 3,
                                   "knowmem_retain_icl": 10}
    for key in ("verbmem_forget", "knowmem_forget", "knowmem_retain"):
        assert 0.0 <= getattr(report, key) <= 100.0
        assert getattr(report, key) == pytest.approx(100 * np.mean(report.per_example[key]["rouge_l_f1"]))
    verb = report.per_example["verbmem_forget"]
    assert all(len(tok(g, add_special_tokens=False)["input_ids"]) <= 130 for g in verb["generation"])
    assert all(len(tok(t, add_special_tokens=True)["input_ids"]) <= 129 for t in verb["truth"])
    assert all("\n\n" not in a and "Question" not in a for a in report.per_example["knowmem_forget"]["answer"])
    scores = report.per_example["privleak"]
    auc = _authors_auc(scores["forget_min_k"], scores["holdout_min_k"])
    assert report.privleak_auc == pytest.approx(auc)
    assert report.privleak == pytest.approx((auc - NEWS_RETRAIN_AUC) / NEWS_RETRAIN_AUC * 100)
    assert report.settings["num_truncated"]["verbmem_prompts"] == 3  # 4k-character prompts, 256 positions

    # PrivLeak against a retain model's report, and one criterion alone
    only = evaluate_muse(model, tok, source=muse_dir, criteria=["privleak"], max_examples=3, progress=False,
                         retain_reference=_report(privleak_auc=0.6, model_name="retain"))
    assert only.verbmem_forget is None and only.knowmem_retain is None and only.reference_source == "retain"
    assert only.privleak_auc == pytest.approx(report.privleak_auc)
    assert only.privleak == pytest.approx((auc - 0.6) / 0.6 * 100)


def test_evaluate_muse_refuses_bad_input_before_any_model_call(muse_dir, tmp_path):
    class NoModel:
        def __getattr__(self, name):
            raise AssertionError(f"the model was used ({name})")

    for kwargs, match in (({"max_examples": 0}, "max_examples"), ({"criteria": ["verbmem_retain"]}, "criteria"),
                          ({"batch_size": 0}, "batch_size"), ({"retain_reference": 1.5}, "reference AUC"),
                          ({"source": tmp_path}, "verbmem/forget.json")):
        with pytest.raises((ValueError, FileNotFoundError), match=match):
            evaluate_muse(NoModel(), NoModel(), **{"source": muse_dir, **kwargs})


def test_graddiff_on_muse_documents_lowers_verbatim_likelihood(tiny_target, muse_dir, tmp_path):
    """One unlearning run on MUSE-News documents: GradDiff on a few forget articles (chunked), retain texts from
    privleak/retain2; the forget articles' Min-40% score rises (they look less familiar), and the unlearned model goes
    through evaluate_muse."""
    from hf_unlearn.methods.base import UnlearningConfig
    from hf_unlearn.methods.baselines import GradDiffTrainer

    model, tok = tiny_target
    forget = json.loads((muse_dir / "raw" / "forget.json").read_text())[:2]
    forget = [doc[:1500] for doc in forget]
    retain = [text[:1500] for text in json.loads((muse_dir / "privleak" / "retain2.json").read_text())[:2]]
    before, _ = text_min_k_scores(model, tok, forget)
    args = UnlearningConfig(output_dir=str(tmp_path / "out"), report_to="none", save_strategy="no",
                            disable_tqdm=True, per_device_train_batch_size=4, max_steps=5, logging_steps=1, seed=0,
                            learning_rate=5e-4, max_length=128, gradient_checkpointing=False)
    trainer = GradDiffTrainer(model, args, train_dataset=forget, retain_dataset=retain, processing_class=tok)
    assert len(trainer.forget_dataset) > len(forget)  # chunks of 128 tokens
    trainer.train()
    after, _ = text_min_k_scores(trainer.model, tok, forget)
    assert np.mean(after) > np.mean(before) + 0.05, (before, after)
    report = evaluate_muse(trainer.model, tok, source=muse_dir, criteria=["verbmem_forget"], max_examples=2,
                           verbmem_max_new_tokens=16, progress=False)
    assert 0.0 <= report.verbmem_forget <= 100.0


def test_model_card_carries_the_muse_figures(tmp_path):
    from hf_unlearn.hub import build_model_card

    report = _report(model_name="org/base", privleak=-12.5)
    card = build_model_card("unlearned_model", "org/base", "npo", report=report)
    index = card.data.to_dict()["model-index"][0]["results"]
    got = {m["type"]: m["value"] for r in index for m in r["metrics"]}
    assert got == {"muse_verbmem_forget": 58.4, "muse_knowmem_forget": 63.9, "muse_privleak": -12.5,
                   "muse_knowmem_retain": 55.2}
    assert {r["dataset"]["name"] for r in index} == {"MUSE-News (forget)"}
    assert "muse" in card.data.tags and "tofu" not in card.data.tags
    assert "## Evaluation (MUSE-News, forget set `forget`)" in card.text and "Evaluation (TOFU" not in card.text
    assert "| MUSE PrivLeak (Min-40% AUC vs. retrained model, %) | -12.5 |" in card.text
    # from the report's JSON file too; a report of another model is refused
    path = report.save(tmp_path / "muse.json")
    assert build_model_card("unlearned_model", "org/base", "npo", report=path).data.to_dict() == card.data.to_dict()
    with pytest.raises(ValueError, match="computed for model"):
        build_model_card("unlearned_model", "org/other", "npo", report=report)


def test_cli_eval_benchmark_muse(tiny_pair, muse_dir, tmp_path, capsys):
    from hf_unlearn.cli import main

    out = tmp_path / "muse.json"
    args = ["eval", "--benchmark", "muse", "--model", str(tiny_pair.target), "--data", str(muse_dir),
            "--max-examples", "2", "--batch-size", "2", "--output", str(out)]
    assert main([*args, "--retain-reference", "0.5"]) == 0
    report = MUSEReport.load(out)
    assert report.num_examples["verbmem_forget"] == 2 and report.reference_auc == 0.5
    assert report.privleak == pytest.approx((report.privleak_auc - 0.5) / 0.5 * 100)
    assert "| PrivLeak (C3) |" in capsys.readouterr().out
    assert main([*args, "--attacks", "quant"]) == 2
    assert "not used by --benchmark muse" in capsys.readouterr().err
    assert main([*args, "--retain-reference", str(tmp_path / "missing.json")]) == 2


def test_hub_dataset_is_read_by_config_and_split(monkeypatch):
    calls = []

    def fake_load_dataset(path, name, split):
        calls.append((path, name, split))
        if name == "privleak":
            return datasets.Dataset.from_dict({"text": ["a text"]})
        if name == "verbmem":
            return datasets.Dataset.from_dict({"prompt": ["p"], "gt": ["g"]})
        return datasets.Dataset.from_dict({"question": ["q"], "answer": ["a"]})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert load_muse_part("muse-bench/MUSE-News", "privleak_holdout") == ["a text"]
    assert load_muse_part("muse-bench/MUSE-News", "verbmem_forget") == [{"prompt": "p", "gt": "g"}]
    assert load_muse_part("muse-bench/MUSE-News", "knowmem_retain_icl") == [{"question": "q", "answer": "a"}]
    assert calls == [("muse-bench/MUSE-News", "privleak", "holdout"), ("muse-bench/MUSE-News", "verbmem", "forget"),
                     ("muse-bench/MUSE-News", "knowmem", "retain_qa_icl")]


def test_batched_greedy_continuations_equal_one_prompt_at_a_time(tiny_target):
    from hf_unlearn.evaluation.muse import greedy_continuations

    model, tok = tiny_target
    prompts = ["Question: Who wrote the novel?\nAnswer:", "The", "Fans queued overnight for tickets to the"]
    batched, truncated = greedy_continuations(model, tok, prompts, 12, batch_size=3)
    assert truncated == 0
    for prompt, got in zip(prompts, batched):
        ids = torch.tensor([tok(prompt)["input_ids"]])
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
        assert got == tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def test_evaluate_muse_refuses_a_report_inside_the_model_folder(muse_dir, tmp_path):
    """The report path is checked like evaluate_tofu's, before any data is read or the model is used."""
    from types import SimpleNamespace

    from hf_unlearn.safe_output import OutputDirError

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "model.safetensors").write_bytes(b"weights")
    model = SimpleNamespace(config=SimpleNamespace(_name_or_path=str(model_dir)))
    tokenizer = SimpleNamespace(name_or_path=str(model_dir))
    with pytest.raises(OutputDirError, match="model"):
        evaluate_muse(model, tokenizer, source=muse_dir, output_path=model_dir / "model.safetensors")
    assert (model_dir / "model.safetensors").read_bytes() == b"weights"


def test_evaluate_muse_scores_and_generates_through_a_decoding_time_method(tiny_target, muse_dir):
    """A decoding-time method's ``scorer`` and ``generation_kwargs`` reach MUSE as they reach TOFU: PrivLeak's Min-K%
    scores are the scorer's (a scorer that halves every log-probability halves every score), and the continuations
    are generated with the given logits processor (one that allows only EOS ends every answer at once)."""
    from transformers import LogitsProcessor, LogitsProcessorList

    from hf_unlearn.logprobs import causal_lm_scorer

    model, tok = tiny_target
    plain_scorer = causal_lm_scorer(model)

    def halved(input_ids, attention_mask, position_ids, labels):
        return 0.5 * plain_scorer(input_ids, attention_mask, position_ids, labels)

    class OnlyEOS(LogitsProcessor):
        def __call__(self, input_ids, scores):
            out = torch.full_like(scores, float("-inf"))
            out[:, tok.eos_token_id] = 0.0
            return out

    common = dict(source=muse_dir, max_examples=3, batch_size=4, progress=False)
    plain = evaluate_muse(model, tok, criteria=["privleak", "verbmem_forget"], **common)
    tilted = evaluate_muse(model, tok, criteria=["privleak", "verbmem_forget"], scorer=halved,
                           generation_kwargs={"logits_processor": LogitsProcessorList([OnlyEOS()])}, **common)
    for side in ("forget_min_k", "holdout_min_k"):
        np.testing.assert_allclose(tilted.per_example["privleak"][side],
                                   0.5 * np.asarray(plain.per_example["privleak"][side]), rtol=1e-5, atol=1e-6)
    assert any(plain.per_example["verbmem_forget"]["generation"])
    assert tilted.per_example["verbmem_forget"]["generation"] == ["", "", ""] and tilted.verbmem_forget == 0.0
