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

from hf_unlearn.demo import load_tiny
from hf_unlearn.evaluation import (
    COMPONENT_NAMES,
    evaluate_tofu,
    format_report_table,
    load_truth_ratios,
    normalized_answer_probability,
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
        assert report.has(key)
    assert report.num_examples == {"forget": 20, "retain": 20, "real_authors": 10, "world_facts": 10}
    assert list(report.components) == list(COMPONENT_NAMES) and len(COMPONENT_NAMES) == 9
    assert len(report.forget_truth_ratios) == 20
    assert (report.source, report.forget_split) == ("synthetic", "forget10")
    assert retain_report.model_name == "retain"
    assert retain_report.forget_quality is None and retain_report.ks_statistic is None


def test_target_is_distinguishable_from_retain_reference(target_report, retain_model, retain_report):
    report, _ = target_report
    own = evaluate_tofu(*retain_model, retain_reference=retain_report, **FAST)
    assert own.forget_quality == 1.0 and own.ks_statistic == 0.0
    assert report.forget_quality < 1e-3 < own.forget_quality
    assert report.forget_rouge_l > 0.8
    assert report.forget_rouge_l > retain_report.forget_rouge_l
    assert report.forget_prob > 0.8 > 0.5 > retain_report.forget_prob
    assert math.isfinite(report.model_utility) and 0.5 < report.model_utility <= 1.0


def test_aggregates_match_independent_computation(target_report, retain_report, target_model, synthetic):
    report, _ = target_report
    model, tokenizer = target_model
    # forget quality: scipy's KS test on the two lists of per-example truth ratios
    ks = ks_2samp(report.forget_truth_ratios, retain_report.forget_truth_ratios)
    assert report.forget_quality == pytest.approx(ks.pvalue) and report.ks_statistic == pytest.approx(
        ks.statistic
    )
    # model utility: harmonic mean of the nine components (0 if any is 0)
    comps = np.array(list(report.components.values()))
    assert report.model_utility == pytest.approx(0.0 if (comps == 0).any() else hmean(comps))
    # forget probability and truth ratios from the scorer directly, formulas by hand
    rows = synthetic["forget10_perturbed"]
    qs = [r["question"] for r in rows]
    gt = answer_nll(model, tokenizer, qs, [r["answer"] for r in rows], batch_size=1)
    para = answer_nll(model, tokenizer, qs, [r["paraphrased_answer"] for r in rows], batch_size=1)
    pert = [
        answer_nll(model, tokenizer, [q] * 5, r["perturbed_answer"], batch_size=1) for q, r in zip(qs, rows)
    ]
    assert report.forget_prob == pytest.approx(np.mean(np.exp(-gt)), rel=1e-4)
    tr = np.exp(para - np.array([p.mean() for p in pert]))
    np.testing.assert_allclose(report.forget_truth_ratios, tr, rtol=1e-4)
    assert report.forget_truth_ratio == pytest.approx(np.mean(np.minimum(tr, 1 / tr)), rel=1e-4)
    retain_tr = np.array(report.splits["retain"]["per_example"]["truth_ratio"])
    assert report.components["retain_truth_ratio"] == pytest.approx(np.mean(np.maximum(0, 1 - retain_tr)))
    # real authors: normalised probability p_true / (p_true + sum p_false)
    real = report.splits["real_authors"]["per_example"]
    p_true = np.exp(-np.array(real["answer_nll"]))
    p_false = np.exp(-np.array(real["perturbed_nll"])).sum(axis=1)
    assert report.components["real_authors_prob"] == pytest.approx(np.mean(p_true / (p_true + p_false)))
    # ROUGE-L recall of the stored generations, recomputed with rouge-score
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    forget = report.splits["forget"]["per_example"]
    recall = [scorer.score(r["answer"], g)["rougeL"].recall for r, g in zip(rows, forget["generation"])]
    assert report.forget_rouge_l == pytest.approx(np.mean(recall))


def test_report_json_and_truth_ratio_round_trip(target_report, retain_report, tmp_path):
    report, path = target_report
    on_disk = json.loads(path.read_text())
    assert on_disk["forget_truth_ratios"] == report.forget_truth_ratios
    assert on_disk["components"] == report.components
    assert not list(path.parent.glob(".*.tmp"))  # atomic write left no temporary file
    saved = save_truth_ratios(retain_report, tmp_path / "ref.json")
    loaded = load_truth_ratios(saved)
    assert loaded["forget_truth_ratios"] == retain_report.forget_truth_ratios
    assert loaded["forget_split"] == "forget10" and loaded["num_examples"] == 20
    assert (
        load_truth_ratios(path)["forget_truth_ratios"] == report.forget_truth_ratios
    )  # a full report works too
    table = format_report_table({"retain": retain_report, "target": report})
    lines = table.splitlines()
    assert lines[0].startswith("| model | forget quality | model utility")
    assert lines[2].startswith("| retain | n/a |") and lines[3].startswith("| target | ")
    assert f"{report.model_utility:.3f}" in lines[3]


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
    assert report.num_examples == {"forget": 2, "retain": 2, "real_authors": 2, "world_facts": 2}
    assert processor.calls > 0 and report.forget_rouge_l == 0.0
    assert all(g == "" for g in report.splits["forget"]["per_example"]["generation"])
    assert (
        sum(calls) == 2 * (1 + 1 + 5) * 2 + 2 * (1 + 3) * 2 + 2
    )  # forget/retain: answer, paraphrase, 5 perturbed; real authors/world facts: answer, 3 perturbed; holdout
    # answers (membership inference). The forget answers are scored once, for both TOFU and the MIA.
    assert report.extraction_strength is None and report.mia_min_k_plus_plus is None  # need full logits
    assert report.mia_loss is not None and report.privleak is not None
    assert report.settings["custom_scorer"] and report.settings["generation_kwargs"] == [
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
        evaluate_tofu(model, tokenizer, retain_reference=dict(retain_report.to_dict(), forget_split="forget05"), **FAST)
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




# --------------------------------------------------------------------------------------------------------------
# The rest of open-unlearning's TOFU table, retain references from every published format, provenance, lengths
# --------------------------------------------------------------------------------------------------------------


def _slow_auc(forget, holdout):
    return np.mean([[1.0 if h > f else 0.5 if h == f else 0.0 for h in holdout] for f in forget])


def test_mia_privleak_and_memorization_match_direct_computation(target_report, retain_report, target_model, synthetic):
    from hf_unlearn.evaluation import privleak

    report, _ = target_report
    model, tokenizer = target_model
    forget, holdout = synthetic["forget10_perturbed"], synthetic["holdout10"]
    f_nll = answer_nll(model, tokenizer, [r["question"] for r in forget], [r["answer"] for r in forget], batch_size=1)
    h_nll = answer_nll(model, tokenizer, [r["question"] for r in holdout], [r["answer"] for r in holdout], batch_size=1)
    mia = report.mia
    assert mia["holdout_split"] == "holdout10" and mia["num_holdout"] == len(holdout)
    np.testing.assert_allclose(mia["per_example"]["forget"]["loss"], f_nll, rtol=1e-4)
    np.testing.assert_allclose(mia["per_example"]["holdout"]["loss"], h_nll, rtol=1e-4)
    assert report.mia_loss == pytest.approx(_slow_auc(f_nll, h_nll))
    for attack in ("zlib", "min_k", "min_k_plus_plus"):
        scores = mia["per_example"]
        assert getattr(report, f"mia_{attack}") == pytest.approx(_slow_auc(scores["forget"][attack], scores["holdout"][attack]))
    # privleak against the retain model's own min-k AUC, carried by the saved reference file
    assert retain_report.mia_min_k is not None
    assert report.privleak == pytest.approx(privleak(report.mia_min_k, retain_report.mia_min_k))
    assert report.privleak == pytest.approx(
        ((1 - report.mia_min_k) - (1 - retain_report.mia_min_k)) / (1 - retain_report.mia_min_k) * 100)
    assert retain_report.privleak == pytest.approx(privleak(retain_report.mia_min_k, 0.5))
    # the target memorised the forget answers; the retain model never saw them
    assert report.exact_memorization > 0.9 > retain_report.exact_memorization
    assert report.extraction_strength > retain_report.extraction_strength
    per = report.splits["forget"]["per_example"]
    assert report.extraction_strength == pytest.approx(np.mean(per["extraction_strength"]))
    assert report.mu_rouge == pytest.approx(hmean([report.components[f"{s}_rouge_l"]
                                                      for s in ("retain", "real_authors", "world_facts")]))
    assert report.settings["max_new_tokens"] == 32 and report.settings["template"] == "plain"


def _tofu_log(rng, n, k=5, forget=False):
    log = {
        "avg_gt_loss": {str(i): float(v) for i, v in enumerate(rng.uniform(0.1, 3.0, n))},
        "avg_paraphrased_loss": {str(i): float(v) for i, v in enumerate(rng.uniform(0.1, 3.0, n))},
        "average_perturb_loss": {str(i): [float(v) for v in rng.uniform(0.1, 3.0, k)] for i in range(n)},
        "rougeL_recall": {str(i): float(v) for i, v in enumerate(rng.uniform(0.0, 1.0, n))},
    }
    return log


def _tofu_aggregate_reference(logs):
    """TOFU's aggregate_eval_stat.py, written out: forget ratios exp(perturbed - paraphrased) and the nine
    model-utility components."""
    def vals(d):
        return np.array(list(d.values()))

    fl = logs["eval_log_forget.json"]
    tofu_forget = np.exp(vals(fl["average_perturb_loss"]).mean(-1) - vals(fl["avg_paraphrased_loss"]))
    comps = []
    for name in ("eval_log.json", "eval_real_author_wo_options.json", "eval_real_world_wo_options.json"):
        log = logs[name]
        if name == "eval_log.json":
            prob = np.mean(np.exp(-vals(log["avg_gt_loss"])))
        else:
            true = np.exp(-vals(log["avg_gt_loss"]))
            false = np.exp(-vals(log["average_perturb_loss"]))
            prob = np.mean(true / np.concatenate([true[:, None], false], axis=1).sum(-1))
        curr = np.exp(vals(log["average_perturb_loss"]).mean(-1) - vals(log["avg_paraphrased_loss"]))
        comps += [prob, vals(log["rougeL_recall"]).mean(), np.mean(np.maximum(0, 1 - 1 / curr))]
    return tofu_forget, comps


def test_reference_formats_give_fq_and_mu_of_direct_computation(tmp_path):
    from hf_unlearn.evaluation import load_retain_reference
    from hf_unlearn.evaluation.metrics import forget_quality

    rng = np.random.default_rng(11)
    n = 12
    unlearned = rng.uniform(0.2, 2.0, n)
    # TOFU: a results folder with the four logs, the forget log alone, and the aggregated JSON
    logs = {name: _tofu_log(rng, n if "forget" in name else 9) for name in (
        "eval_log_forget.json", "eval_log.json", "eval_real_author_wo_options.json", "eval_real_world_wo_options.json")}
    folder = tmp_path / "tofu" / "eval_results" / "ds_size300"
    folder.mkdir(parents=True)
    for name, log in logs.items():
        (folder / name).write_text(json.dumps(log))
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "eval_log_forget.json").write_text(json.dumps(logs["eval_log_forget.json"]))
    (tmp_path / "aggregated.json").write_text(json.dumps(logs))
    tofu_forget, tofu_comps = _tofu_aggregate_reference(logs)
    for source, has_mu in ((tmp_path / "tofu", True), (folder / "eval_log_forget.json", True),
                           (tmp_path / "aggregated.json", True), (alone / "eval_log_forget.json", False)):
        ref = load_retain_reference(source)
        assert ref.provenance["format"] == "tofu" and ref.provenance["num_rows"] == n
        # our convention is TOFU's inverse; the KS test gives the same forget quality either way
        np.testing.assert_allclose(ref.forget_truth_ratios, 1 / tofu_forget, rtol=1e-12)
        fq = forget_quality(unlearned, ref.forget_truth_ratios)
        assert fq["forget_quality"] == pytest.approx(ks_2samp(unlearned, 1 / tofu_forget).pvalue)
        assert fq["forget_quality"] == pytest.approx(ks_2samp(1 / unlearned, tofu_forget).pvalue)
        if has_mu:
            assert list(ref.model_utility_components.values()) == pytest.approx(tofu_comps)
            assert ref.model_utility == pytest.approx(hmean(tofu_comps))
        else:
            assert ref.model_utility_components is None and ref.model_utility is None

    # open-unlearning: TOFU_EVAL.json, per-index truth ratios (keys out of order) and the nine components
    ratios = rng.uniform(0.2, 2.0, n)
    names = ["retain_Q_A_Prob", "retain_Q_A_ROUGE", "retain_Truth_Ratio", "ra_Q_A_Prob_normalised", "ra_Q_A_ROUGE",
             "ra_Truth_Ratio", "wf_Q_A_Prob_normalised", "wf_Q_A_ROUGE", "wf_Truth_Ratio"]
    comps = rng.uniform(0.1, 1.0, 9)
    oue = {"forget_truth_ratio": {"agg_value": 0.6, "value_by_index": {
        str(i): {"score": float(ratios[i])} for i in reversed(range(n))}},
        **{name: {"agg_value": float(v)} for name, v in zip(names, comps)},
        "mia_min_k": {"agg_value": 0.61, "auc": 0.61}, "forget_quality": {"agg_value": None}}
    (tmp_path / "ou").mkdir()
    (tmp_path / "ou" / "TOFU_EVAL.json").write_text(json.dumps(oue))
    for source in (tmp_path / "ou", tmp_path / "ou" / "TOFU_EVAL.json"):
        ref = load_retain_reference(source)
        assert ref.provenance["format"] == "open-unlearning"
        np.testing.assert_allclose(ref.forget_truth_ratios, ratios)
        assert forget_quality(unlearned, ref.forget_truth_ratios)["forget_quality"] == pytest.approx(
            ks_2samp(unlearned, ratios).pvalue)
        assert ref.model_utility == pytest.approx(hmean(comps)) and ref.mia_auc == {"min_k": 0.61}
    summary = {k: v["agg_value"] if isinstance(v, dict) else v for k, v in oue.items()}
    (tmp_path / "TOFU_SUMMARY.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match="TOFU_EVAL.json"):
        load_retain_reference(tmp_path / "TOFU_SUMMARY.json")

    # ours: a report-shaped file
    ours = {"forget_truth_ratios": list(ratios), "forget_split": "forget10",
            "components": dict(zip(COMPONENT_NAMES, comps)), "mia": {"auc": {"min_k": 0.7}}}
    (tmp_path / "ours.json").write_text(json.dumps(ours))
    ref = load_retain_reference(tmp_path / "ours.json")
    assert ref.provenance["format"] == "hf_unlearn" and ref.provenance["forget_split"] == "forget10"
    assert ref.model_utility == pytest.approx(hmean(comps)) and ref.mia_auc == {"min_k": 0.7}
    (tmp_path / "other.json").write_text('{"accuracy": 1}')
    with pytest.raises(ValueError, match="not a retain reference"):
        load_retain_reference(tmp_path / "other.json")
    with pytest.raises(ValueError, match="several evaluation results"):
        load_retain_reference(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no retain reference"):
        load_retain_reference(tmp_path / "empty")


def test_published_references_end_to_end(target_model, retain_report, synthetic, tmp_path):
    """The retain model's numbers written as TOFU's and open-unlearning's files give the same forget quality as
    our own reference, privleak uses the file's retain AUC, and the unknowable provenance is warned about."""
    from hf_unlearn.evaluation import privleak

    n = 5
    per = retain_report.splits["forget"]["per_example"]
    tofu_log = {
        "avg_paraphrased_loss": {str(i): per["true_nll"][i] for i in range(n)},
        "average_perturb_loss": {str(i): per["perturbed_nll"][i] for i in range(n)},
    }
    (tmp_path / "eval_log_forget.json").write_text(json.dumps(tofu_log))
    oue = {"forget_truth_ratio": {"value_by_index": {str(i): {"score": per["truth_ratio"][i]} for i in range(n)}},
           "mia_min_k": {"agg_value": 0.61}}
    (tmp_path / "TOFU_EVAL.json").write_text(json.dumps(oue))
    retain_ratios = retain_report.forget_truth_ratios[:n]
    with pytest.raises(ValueError, match=f"{len(retain_report.forget_truth_ratios)} forget truth ratios"):
        evaluate_tofu(*target_model, retain_reference=retain_report, **dict(FAST, max_examples=n))
    for path in (tmp_path / "eval_log_forget.json", tmp_path / "TOFU_EVAL.json"):
        with pytest.warns(UserWarning, match="could not be checked"):
            report = evaluate_tofu(*target_model, retain_reference=path, **dict(FAST, max_examples=n))
        assert report.forget_quality == pytest.approx(ks_2samp(report.forget_truth_ratios, retain_ratios).pvalue)
        assert report.retain_reference["provenance"]["path"] == str(path)
    assert report.privleak == pytest.approx(privleak(report.mia_min_k, 0.61))
    assert report.mia["reference_auc"]["min_k"] == 0.61


def test_reference_with_different_provenance_is_refused(target_model, retain_report):
    _, tokenizer = target_model
    model = _Untouchable()  # refused before the model is used
    for field, value, label in (("tokenizer_sha256", "0" * 64, "tokenizer vocabulary"),
                                ("data_sha256", "f" * 64, "forget data")):
        ref = copy.deepcopy(retain_report)
        ref.provenance[field] = value
        with pytest.raises(ValueError, match=f"made differently.*{label}"):
            evaluate_tofu(model, tokenizer, retain_reference=ref, **FAST)
    with pytest.raises(ValueError, match="prompt template 'plain' \\(this evaluation: 'tofu-llama2'\\)"):
        evaluate_tofu(model, tokenizer, retain_reference=retain_report, template="tofu-llama2", **FAST)
    # the dtype is known once the model is: a bf16 copy against a float32 reference
    bf16 = copy.deepcopy(target_model[0]).to(torch.bfloat16)
    with pytest.raises(ValueError, match="dtype 'float32' \\(this evaluation: 'bfloat16'\\)"):
        evaluate_tofu(bf16, tokenizer, retain_reference=retain_report, **FAST)


def test_template_reaches_scoring_and_generation(target_model, synthetic):
    model, tokenizer = target_model
    report = evaluate_tofu(model, tokenizer, template="tofu-llama2", **dict(FAST, max_examples=2, max_new_tokens=4))
    rows = synthetic["forget10_perturbed"][:2]
    qs, answers = [r["question"] for r in rows], [r["answer"] for r in rows]
    expected = answer_nll(model, tokenizer, qs, answers, template="tofu-llama2", batch_size=1)
    np.testing.assert_allclose(report.splits["forget"]["per_example"]["answer_nll"], expected, rtol=1e-4)
    assert not np.allclose(expected, answer_nll(model, tokenizer, qs, answers, batch_size=1))  # a different prompt
    assert report.settings["template"] == "tofu-llama2"
    assert report.provenance["template"]["fields"]["question_start_tag"] == "[INST] "


def _write_source(folder, question, answer, n=3):
    def row(i, q=question):
        return {"question": f"{q} ({i})", "answer": answer, "paraphrased_answer": answer,
                "perturbed_answer": [answer + " again", "A short false answer."]}

    for config, count in (("forget10_perturbed", n), ("retain_perturbed", n), ("real_authors_perturbed", 2),
                          ("world_facts_perturbed", 2), ("holdout10", 2)):
        (folder / f"{config}.jsonl").write_text("".join(json.dumps(row(i)) + "\n" for i in range(count)))


def test_evaluator_truncates_to_model_positions(tiny_target, tmp_path):
    """A GPT-2 with 64 positions and answers far longer than that: scoring keeps the first 64 tokens of prompt +
    answer, generation stops at the 64th position (GPT-2 would index past its position table otherwise), and a
    prompt that does not fit is refused."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from hf_unlearn.data import tokenize_qa

    _, tokenizer = tiny_target
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=32, n_layer=1, n_head=2,
                        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    model = GPT2LMHeadModel(config).eval()
    question, answer = "Who is the author", " ".join(["The author wrote many long books about the sea."] * 12)
    assert len(tokenize_qa(tokenizer, question, answer)["input_ids"]) > 64
    _write_source(tmp_path, question, answer)
    report = evaluate_tofu(model, tokenizer, source=str(tmp_path), max_new_tokens=200, batch_size=4, progress=False)
    assert report.settings["max_length"] == 64 and report.provenance["max_length"] == 64
    assert report.settings["num_truncated"]["forget"] == 3 * 3  # answer, paraphrase, the long perturbed one
    feats = tokenize_qa(tokenizer, f"{question} (0)", answer, max_length=64)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([feats["input_ids"]])).logits[0].double(), -1)
    steps = range(feats["prompt_length"], 64)
    direct = -np.mean([logp[t - 1, feats["input_ids"][t]].item() for t in steps])
    assert report.splits["forget"]["per_example"]["answer_nll"][0] == pytest.approx(direct, rel=1e-4)
    for gen in report.splits["forget"]["per_example"]["generation"]:
        assert len(tokenizer(gen, add_special_tokens=False)["input_ids"]) <= 64
    long_question = " ".join(["Where exactly was the author born and raised"] * 10)
    _write_source(tmp_path, long_question, answer)
    with pytest.raises(ValueError, match="prompt alone is .* tokens"):
        evaluate_tofu(model, tokenizer, source=str(tmp_path), batch_size=4, progress=False)


def test_render_report_defines_every_figure(target_report):
    from hf_unlearn.evaluation import METRIC_DEFINITIONS, metric_definitions_text, render_report

    report, _ = target_report
    text = render_report(report)
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(METRIC_DEFINITIONS)
    for key, (title, _definition) in METRIC_DEFINITIONS.items():
        assert any(line.startswith(f"| {title} | ") for line in table), key
        assert title in metric_definitions_text()
    assert f"| model utility | {report.model_utility:.3f} |" in text
    assert f"| privleak | {report.privleak:.2f} |" in text
    assert "template: plain" in text and "max_new_tokens: 32" in text
    assert all(line.count(" | ") == 2 for line in table[1:])  # pipes inside definitions are escaped


class _AutocastProbe(LogitsProcessor):
    """Records whether CPU autocast is on while ``generate`` runs."""

    def __init__(self):
        self.seen: list[bool] = []

    def __call__(self, input_ids, scores):
        self.seen.append(torch.is_autocast_enabled("cpu"))
        return scores


def test_autocast_reaches_scoring_and_generation(target_model, retain_report):
    model, tokenizer = target_model
    with pytest.raises(ValueError, match="autocast_dtype must be one of"):  # before any model call
        evaluate_tofu(_Untouchable(), tokenizer, autocast_dtype="bf16", **FAST)
    scored: list[tuple[bool, torch.dtype]] = []
    base = causal_lm_scorer(model)

    def scorer(input_ids, attention_mask, position_ids, labels):
        logp = base(input_ids, attention_mask, position_ids, labels)
        scored.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return logp

    probe = _AutocastProbe()
    kwargs = dict(FAST, max_examples=2, max_new_tokens=2, membership_inference=False)
    report = evaluate_tofu(model, tokenizer, scorer=scorer, autocast_dtype="bfloat16",
                           generation_kwargs={"logits_processor": LogitsProcessorList([probe])}, **kwargs)
    assert scored and all(on and dtype == torch.bfloat16 for on, dtype in scored)
    assert probe.seen and all(probe.seen)
    assert report.provenance["dtype"] == "float32+autocast:bfloat16"
    assert next(model.parameters()).dtype == torch.float32  # the weights are left alone
    assert not torch.is_autocast_enabled("cpu")  # and autocast is off again afterwards
    # bf16 autocast changes the figures a little: the answer NLLs are close to, but not the float32 ones
    plain = evaluate_tofu(model, tokenizer, **kwargs)
    ours, theirs = (np.array(r.splits["forget"]["per_example"]["answer_nll"]) for r in (report, plain))
    assert np.allclose(ours, theirs, atol=0.1) and not np.array_equal(ours, theirs)
    # a float32 retain reference does not match a bf16-autocast evaluation
    with pytest.raises(ValueError, match="dtype 'float32' \\(this evaluation: 'float32\\+autocast:bfloat16'\\)"):
        evaluate_tofu(model, tokenizer, retain_reference=retain_report, autocast_dtype="bfloat16", **FAST)
