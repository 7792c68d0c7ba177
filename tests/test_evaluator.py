"""The TOFU evaluator end to end on the tiny target and its retain reference, report I/O, bad
input, and the NF4 quantization re-check."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
from rouge_score import rouge_scorer
from scipy.stats import hmean, ks_2samp
from transformers import LogitsProcessor, LogitsProcessorList

from hf_unlearn.bench.subjects import load_tiny
from hf_unlearn.evaluation import (
    COMPONENT_NAMES,
    evaluate_tofu,
    format_report_table,
    load_truth_ratios,
    normalized_answer_probability,
    quantize_nf4,
    save_truth_ratios,
)
from hf_unlearn.logprobs import answer_nll, causal_lm_scorer

FAST = {"source": "synthetic", "max_new_tokens": 32, "batch_size": 32, "progress": False}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Tiny models are overhead-bound; one thread avoids OpenMP oversubscription on shared CPUs.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def retain_model(tiny_pair):
    return load_tiny(tiny_pair.retain)


@pytest.fixture(scope="module")
def target_model(tiny_pair):
    return load_tiny(tiny_pair.target)


@pytest.fixture(scope="module")
def retain_report(retain_model):
    return evaluate_tofu(*retain_model, model_name="retain", **FAST)


@pytest.fixture(scope="module")
def target_report(target_model, retain_report, tmp_path_factory):
    reference = save_truth_ratios(retain_report, tmp_path_factory.mktemp("ref") / "retain_truth_ratios.json")
    out = tmp_path_factory.mktemp("out") / "target.json"
    report = evaluate_tofu(*target_model, retain_reference=reference, output_path=out, **FAST)
    return report, out


def test_report_keys_and_counts(target_report, retain_report):
    report, _ = target_report
    for key in (
        "forget_quality",
        "ks_statistic",
        "model_utility",
        "forget_rouge_l",
        "forget_truth_ratio",
        "forget_prob",
        "components",
        "forget_truth_ratios",
        "num_examples",
        "source",
        "forget_split",
        "model_name",
        "splits",
        "retain_reference",
    ):
        assert key in report
    assert report["num_examples"] == {"forget": 20, "retain": 20, "real_authors": 10, "world_facts": 10}
    assert list(report["components"]) == list(COMPONENT_NAMES) and len(COMPONENT_NAMES) == 9
    assert len(report["forget_truth_ratios"]) == 20
    assert (report["source"], report["forget_split"]) == ("synthetic", "forget10")
    assert retain_report["model_name"] == "retain"
    assert retain_report["forget_quality"] is None and retain_report["ks_statistic"] is None


def test_target_is_distinguishable_from_retain_reference(target_report, retain_model, retain_report):
    report, _ = target_report
    own = evaluate_tofu(*retain_model, retain_reference=retain_report, **FAST)
    assert own["forget_quality"] == 1.0 and own["ks_statistic"] == 0.0
    assert report["forget_quality"] < 1e-3 < own["forget_quality"]
    assert report["forget_rouge_l"] > 0.8
    assert report["forget_rouge_l"] > retain_report["forget_rouge_l"]
    assert report["forget_prob"] > 0.8 > 0.5 > retain_report["forget_prob"]
    assert math.isfinite(report["model_utility"]) and 0.5 < report["model_utility"] <= 1.0


def test_aggregates_match_independent_computation(target_report, retain_report, target_model, synthetic):
    report, _ = target_report
    model, tokenizer = target_model
    # forget quality: scipy's KS test on the two lists of per-example truth ratios
    ks = ks_2samp(report["forget_truth_ratios"], retain_report["forget_truth_ratios"])
    assert report["forget_quality"] == pytest.approx(ks.pvalue) and report["ks_statistic"] == pytest.approx(
        ks.statistic
    )
    # model utility: harmonic mean of the nine components (0 if any is 0)
    comps = np.array(list(report["components"].values()))
    assert report["model_utility"] == pytest.approx(0.0 if (comps == 0).any() else hmean(comps))
    # forget probability and truth ratios from the scorer directly, formulas by hand
    rows = synthetic["forget10_perturbed"]
    qs = [r["question"] for r in rows]
    gt = answer_nll(model, tokenizer, qs, [r["answer"] for r in rows], batch_size=1)
    para = answer_nll(model, tokenizer, qs, [r["paraphrased_answer"] for r in rows], batch_size=1)
    pert = [
        answer_nll(model, tokenizer, [q] * 5, r["perturbed_answer"], batch_size=1) for q, r in zip(qs, rows)
    ]
    assert report["forget_prob"] == pytest.approx(np.mean(np.exp(-gt)), rel=1e-4)
    tr = np.exp(para - np.array([p.mean() for p in pert]))
    np.testing.assert_allclose(report["forget_truth_ratios"], tr, rtol=1e-4)
    assert report["forget_truth_ratio"] == pytest.approx(np.mean(np.minimum(tr, 1 / tr)), rel=1e-4)
    retain_tr = np.array(report["splits"]["retain"]["per_example"]["truth_ratio"])
    assert report["components"]["retain_truth_ratio"] == pytest.approx(np.mean(np.maximum(0, 1 - retain_tr)))
    # real authors: normalised probability p_true / (p_true + sum p_false)
    real = report["splits"]["real_authors"]["per_example"]
    p_true = np.exp(-np.array(real["answer_nll"]))
    p_false = np.exp(-np.array(real["perturbed_nll"])).sum(axis=1)
    assert report["components"]["real_authors_prob"] == pytest.approx(np.mean(p_true / (p_true + p_false)))
    # ROUGE-L recall of the stored generations, recomputed with rouge-score
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    forget = report["splits"]["forget"]["per_example"]
    recall = [scorer.score(r["answer"], g)["rougeL"].recall for r, g in zip(rows, forget["generation"])]
    assert report["forget_rouge_l"] == pytest.approx(np.mean(recall))


def test_report_json_and_truth_ratio_round_trip(target_report, retain_report, tmp_path):
    report, path = target_report
    on_disk = json.loads(path.read_text())
    assert on_disk["forget_truth_ratios"] == report["forget_truth_ratios"]
    assert on_disk["components"] == report["components"]
    assert not list(path.parent.glob(".*.tmp"))  # atomic write left no temporary file
    saved = save_truth_ratios(retain_report, tmp_path / "ref.json")
    loaded = load_truth_ratios(saved)
    assert loaded["forget_truth_ratios"] == retain_report["forget_truth_ratios"]
    assert loaded["forget_split"] == "forget10" and loaded["num_examples"] == 20
    assert (
        load_truth_ratios(path)["forget_truth_ratios"] == report["forget_truth_ratios"]
    )  # a full report works too
    table = format_report_table({"retain": retain_report, "target": report})
    lines = table.splitlines()
    assert lines[0].startswith("| model | forget quality | model utility")
    assert lines[2].startswith("| retain | n/a |") and lines[3].startswith("| target | ")
    assert f"{report['model_utility']:.3f}" in lines[3]


def test_normalized_probability_is_stable():
    # huge losses would underflow exp(-loss); the log-space form still gives the right ratio
    out = normalized_answer_probability(np.array([800.0, 1.0]), [np.array([801.0, 802.0]), np.array([1.0])])
    expected = 1 / (1 + math.exp(-1) + math.exp(-2))
    np.testing.assert_allclose(out, [expected, 0.5])


class _EosNow(LogitsProcessor):
    def __init__(self, eos_id: int):
        self.eos_id, self.calls = eos_id, 0

    def __call__(self, input_ids, scores):
        self.calls += 1
        forced = torch.full_like(scores, -float("inf"))
        forced[:, self.eos_id] = 0.0
        return forced


def test_generation_kwargs_and_scorer_pass_through(target_model):
    model, tokenizer = target_model
    processor = _EosNow(tokenizer.eos_token_id)
    calls = []
    plain = causal_lm_scorer(model)

    def scorer(*args):
        calls.append(args[0].shape[0])
        return plain(*args)

    report = evaluate_tofu(
        model,
        tokenizer,
        max_examples=2,
        scorer=scorer,
        generation_kwargs={"logits_processor": LogitsProcessorList([processor])},
        **FAST,
    )
    assert report["num_examples"] == {"forget": 2, "retain": 2, "real_authors": 2, "world_facts": 2}
    assert processor.calls > 0 and report["forget_rouge_l"] == 0.0
    assert all(g == "" for g in report["splits"]["forget"]["per_example"]["generation"])
    assert (
        sum(calls) == 2 * (1 + 1 + 5) * 2 + 2 * (1 + 3) * 2
    )  # forget/retain: answer, paraphrase, 5 perturbed
    assert report["settings"]["custom_scorer"] and report["settings"]["generation_kwargs"] == [
        "logits_processor"
    ]


class _Untouchable:
    """A 'model' that fails on use: the checks below must fire before any work starts."""

    def __getattr__(self, name):
        raise AssertionError(f"model.{name} was used before input validation")


def test_bad_input_fails_before_work(target_model, retain_report, tmp_path):
    _, tokenizer = target_model
    model = _Untouchable()
    with pytest.raises(ValueError, match="5 forget truth ratios but this evaluation has 20"):
        evaluate_tofu(model, tokenizer, retain_reference={"forget_truth_ratios": [1.0] * 5}, **FAST)
    with pytest.raises(ValueError, match="forget split 'forget05'"):
        evaluate_tofu(model, tokenizer, retain_reference=dict(retain_report, forget_split="forget05"), **FAST)
    with pytest.raises(FileNotFoundError):
        evaluate_tofu(model, tokenizer, retain_reference=tmp_path / "missing.json", **FAST)
    (tmp_path / "bad.json").write_text('{"forget_truth_ratios": []}')
    with pytest.raises(ValueError, match="forget_truth_ratios"):
        evaluate_tofu(model, tokenizer, retain_reference=tmp_path / "bad.json", **FAST)
    with pytest.raises(ValueError, match="retain_reference must be"):
        evaluate_tofu(model, tokenizer, retain_reference=[1.0, 2.0], **FAST)
    with pytest.raises(ValueError, match="Unknown forget split"):
        evaluate_tofu(model, tokenizer, forget_split="forget42", **FAST)
    with pytest.raises(ValueError, match="batch_size"):
        evaluate_tofu(model, tokenizer, **dict(FAST, batch_size=0))
    with pytest.raises(ValueError, match="max_examples"):
        evaluate_tofu(model, tokenizer, max_examples=0, **FAST)
    with pytest.raises(FileNotFoundError, match="forget10_perturbed"):
        evaluate_tofu(model, tokenizer, **dict(FAST, source=str(tmp_path)))
    with pytest.raises(ValueError, match="has no rows"):
        (tmp_path / "forget10_perturbed.jsonl").write_text("")
        evaluate_tofu(model, tokenizer, **dict(FAST, source=str(tmp_path)))
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.pad_token = None
    tokenizer.eos_token = None
    with pytest.raises(ValueError, match="pad token"):
        evaluate_tofu(model, tokenizer, **FAST)


def test_nf4_quantization_changes_weights_but_keeps_outputs(tiny_target, synthetic):
    model, tokenizer = tiny_target
    rows = synthetic["forget10"][:8]
    qs, ans = [r["question"] for r in rows], [r["answer"] for r in rows]
    before = answer_nll(model, tokenizer, qs, ans, batch_size=8)
    original = model.model.layers[0].mlp.down_proj.weight.detach().clone()
    quantized = quantize_nf4(model)
    import bitsandbytes as bnb

    layer = quantized.model.layers[0].mlp.down_proj
    assert isinstance(layer, bnb.nn.Linear4bit) and layer.weight.dtype == torch.uint8
    assert layer.weight.quant_state.quant_type == "nf4"
    dequantized = bnb.functional.dequantize_4bit(layer.weight.data, layer.weight.quant_state).float()
    assert not torch.equal(dequantized, original)
    assert (dequantized - original).norm() / original.norm() < 0.15  # 4-bit blockwise error, not garbage
    torch.testing.assert_close(model.model.layers[0].mlp.down_proj.weight, original)  # input untouched
    after = answer_nll(quantized, tokenizer, qs, ans, batch_size=8)
    assert np.abs(after - before).mean() < 0.1  # measured: ~0.005 nats/token
    assert after.mean() < 1.0  # still recalls what it memorised (unseen answers cost ~3 nats/token)
    with pytest.raises(ValueError, match="already quantized"):
        quantize_nf4(quantized)


def test_nf4_quantization_merges_peft_adapters(tiny_target, synthetic):
    from peft import LoraConfig, get_peft_model

    model, tokenizer = tiny_target
    rows = synthetic["retain90"][:6]
    qs, ans = [r["question"] for r in rows], [r["answer"] for r in rows]
    base_nll = answer_nll(model, tokenizer, qs, ans, batch_size=6)
    torch.manual_seed(0)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["down_proj"], init_lora_weights=False))
    merged_nll = answer_nll(peft_model, tokenizer, qs, ans, batch_size=6)
    assert np.abs(merged_nll - base_nll).mean() > 0.2  # the random adapter really changes the model
    quantized = quantize_nf4(peft_model)
    assert not hasattr(quantized, "peft_config") or not quantized.peft_config
    assert np.abs(answer_nll(quantized, tokenizer, qs, ans, batch_size=6) - merged_nll).mean() < 0.1
    # the adapter is still active on the (unmerged) input model
    np.testing.assert_allclose(
        answer_nll(peft_model, tokenizer, qs, ans, batch_size=6), merged_nll, rtol=1e-5
    )
