"""The typed report of ``evaluate_tofu`` (TOFUReport): its dict form and JSON round trip on a real evaluation of the
tiny models, reports of older versions, the clear error on a report lacking a figure, attribute access (a report is
no Mapping), and model cards, tables and Hub uploads made from a report or from its dict form."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping

import pytest
import torch

from hf_unlearn.demo import load_tiny
from hf_unlearn.evaluation import (
    ATTACK_COLUMNS,
    COMPONENT_NAMES,
    METRIC_DEFINITIONS,
    MIA_ATTACKS,
    TOFUReport,
    evaluate_tofu,
    format_report_table,
    load_retain_reference,
    render_report,
    save_truth_ratios,
)
from hf_unlearn.evaluation.report import ATTACK_FIELDS
from hf_unlearn.hub import build_model_card, push_unlearned, report_dict

FAST = {"source": "synthetic", "max_new_tokens": 8, "batch_size": 32, "progress": False, "max_examples": 6}

# The keys of evaluate_tofu's report, in the order it writes them (without attacks).
KEYS = [
    "model_name", "source", "forget_split", "retain_reference", "forget_quality", "ks_statistic", "model_utility",
    "forget_rouge_l", "forget_truth_ratio", "forget_prob", "retain_rouge_l", "retain_prob", "retain_truth_ratio",
    "mu_rouge", "extraction_strength", "exact_memorization", "mia_loss", "mia_zlib", "mia_min_k",
    "mia_min_k_plus_plus", "privleak", "components", "forget_truth_ratios", "mia", "num_examples", "splits",
    "provenance", "settings", "hf_unlearn_version",
]

# The keys of the first released reports (no MU-ROUGE, memorization, MIA, provenance); the retain reference was
# recorded by name.
FIRST_KEYS = [
    "model_name", "source", "forget_split", "retain_reference", "forget_quality", "ks_statistic", "model_utility",
    "forget_rouge_l", "forget_truth_ratio", "forget_prob", "retain_rouge_l", "retain_prob", "retain_truth_ratio",
    "components", "forget_truth_ratios", "num_examples", "splits", "settings", "hf_unlearn_version",
]


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
    """The target against the retain report itself (a TOFUReport), with the quantization attack, written to JSON."""
    out = tmp_path_factory.mktemp("report") / "target.json"
    report = evaluate_tofu(*target_model, retain_reference=retain_report, attacks="quant", output_path=out, **FAST)
    return report, out


def test_evaluate_tofu_returns_a_typed_report_whose_dict_is_the_report(retain_report, target_report):
    report, path = target_report
    assert isinstance(report, TOFUReport) and isinstance(retain_report, TOFUReport)
    plain = retain_report.to_dict()
    assert type(plain) is dict and list(plain) == KEYS
    attack_keys = ["attacks", *(key for key, _ in ATTACK_COLUMNS)]
    assert list(report.to_dict()) == [*KEYS, *attack_keys]
    assert tuple(key for key, _ in ATTACK_COLUMNS) == ATTACK_FIELDS
    assert set(METRIC_DEFINITIONS) <= set(TOFUReport.field_names())
    # the headline figures are the evaluation's parts, as the dict always held them
    for rep in (report, retain_report):
        d = rep.to_dict()
        assert list(d["components"]) == list(COMPONENT_NAMES)
        assert d["forget_rouge_l"] == d["splits"]["forget"]["rouge_l"] and d["forget_prob"] == d["splits"]["forget"]["prob"]
        assert d["forget_truth_ratio"] == d["splits"]["forget"]["truth_ratio"]
        assert d["forget_truth_ratios"] == d["splits"]["forget"]["per_example"]["truth_ratio"]
        assert all(d[k] == d["components"][k] for k in ("retain_rouge_l", "retain_prob", "retain_truth_ratio"))
        assert all(d[f"mia_{a}"] == d["mia"]["auc"][a] for a in MIA_ATTACKS)
        assert d["privleak"] == d["mia"]["privleak"]["min_k"]
        assert d["num_examples"] == {"forget": 6, "retain": 6, "real_authors": 6, "world_facts": 6}
        assert d["settings"]["attacks"] == (["quant"] if rep is report else [])
        for key, value in d.items():
            assert getattr(rep, key) is value
    assert retain_report.forget_quality is None and retain_report.attacks is None
    assert report.forget_quality is not None and report.attacks["quantization"]["bits"]
    assert report.attack_nf4_forget_rouge_l == report.attacks["quantization"]["bits"]["4"]["forget_rouge_l"]
    assert report.attack_relearn_recovered is None  # relearning did not run; the key is there all the same
    # what output_path holds is to_dict(); reading it back gives the same report
    on_disk = json.loads(path.read_text())
    assert on_disk == json.loads(json.dumps(report.to_dict(), allow_nan=False))
    back = TOFUReport.from_dict(on_disk)
    assert back == report and back.to_dict() == on_disk and list(back.to_dict()) == list(on_disk)
    assert TOFUReport.load(path) == report
    for rep in (report, retain_report):
        assert TOFUReport.from_dict(rep.to_dict()).to_dict() == rep.to_dict()
        again = TOFUReport.from_dict(json.loads(json.dumps(rep.to_dict())))
        assert again.model_utility == rep.model_utility and again.components == rep.components


def test_report_of_an_older_version_round_trips_and_renders(retain_report, tmp_path):
    old = {k: copy.deepcopy(getattr(retain_report, k)) for k in FIRST_KEYS}
    old["retain_reference"] = "retain_truth_ratios.json"
    report = TOFUReport.from_dict(old)
    assert report.to_dict() == old and list(report.to_dict()) == FIRST_KEYS
    assert report.mu_rouge is None and report.mia is None and report.provenance is None
    assert not report.has("mu_rouge") and not report.has("attacks") and len(report.to_dict()) == len(FIRST_KEYS)
    assert report.figure("real_authors_prob") == old["components"]["real_authors_prob"]
    text = render_report(report)
    assert "retain reference: retain_truth_ratios.json" in text
    assert "| MU-ROUGE | n/a |" in text and "| MIA AUC min-k | n/a |" in text
    assert f"| model utility | {old['model_utility']:.3f} |" in text
    # keys written by other code are kept in extra and written back
    newer = dict(retain_report.to_dict(), future_figure=0.25)
    loaded = TOFUReport.from_dict(newer)
    assert loaded.extra == {"future_figure": 0.25} and loaded.to_dict() == newer and loaded.extra["future_figure"] == 0.25
    # a retain reference read from the report and from its dict form is the same
    a, b = load_retain_reference(retain_report), load_retain_reference(retain_report.to_dict())
    torch.testing.assert_close(torch.as_tensor(a.forget_truth_ratios), torch.as_tensor(b.forget_truth_ratios))
    assert (a.model_utility_components, a.provenance, a.mia_auc) == (b.model_utility_components, b.provenance, b.mia_auc)
    saved = json.loads(save_truth_ratios(retain_report, tmp_path / "a.json").read_text())
    assert saved == json.loads(save_truth_ratios(retain_report.to_dict(), tmp_path / "b.json").read_text())


def test_report_lacking_a_required_figure_is_refused_clearly(retain_report):
    data = retain_report.to_dict()
    for key in ("model_utility", "forget_truth_ratios", "forget_split"):
        with pytest.raises(ValueError, match=f"lacks the required field.*'{key}'"):
            TOFUReport.from_dict({k: v for k, v in data.items() if k != key})
    with pytest.raises(ValueError, match="lacks the required field"):
        render_report({"model_name": "m", "forget_quality": 0.5})
    with pytest.raises(ValueError, match="lacks the required field"):
        save_truth_ratios({"forget_truth_ratios": [1.0]}, "unused.json")
    with pytest.raises(ValueError, match="model_utility must be a number"):
        TOFUReport.from_dict(dict(data, model_utility="high"))
    with pytest.raises(ValueError, match="forget_rouge_l must be a number, got None"):
        TOFUReport.from_dict(dict(data, forget_rouge_l=None))
    with pytest.raises(ValueError, match="must be a dict"):
        TOFUReport.from_dict([("model_name", "m")])
    with pytest.raises(TypeError):
        TOFUReport(model_name="m", source="synthetic", forget_split="forget10")


def test_a_report_is_read_by_attribute_not_as_a_mapping(retain_report, target_report):
    report, _ = target_report
    assert not isinstance(report, Mapping)
    with pytest.raises(TypeError):
        report["forget_quality"]  # noqa: B018
    with pytest.raises(TypeError):
        json.dumps(report)  # a report is no dict: json.dumps needs to_dict()
    assert report.has("attacks") and not retain_report.has("attacks") and not report.has("no_such_key")
    # reports are equal when their dict forms are; a report never equals a dict
    assert report == TOFUReport.from_dict(report.to_dict()) and report != retain_report
    assert report != report.to_dict()
    # setting a field (the benchmark's self forget quality of the retain reference)
    own = copy.deepcopy(retain_report)
    own.forget_quality, own.ks_statistic = 1.0, 0.0
    assert own.to_dict()["forget_quality"] == 1.0 and own.to_dict()["ks_statistic"] == 0.0
    own.extra["forget_rouge_l_nf4"] = 0.5  # a figure that is no field goes to extra
    assert own.to_dict()["forget_rouge_l_nf4"] == 0.5
    own.settings["custom_note"] = "x"  # nested values are shared with the dict form
    assert own.to_dict()["settings"]["custom_note"] == "x" and "custom_note" not in retain_report.settings
    old = TOFUReport.from_dict({k: getattr(retain_report, k) for k in FIRST_KEYS})
    old.mu_rouge = 0.5  # setting an optional figure an older report lacked adds it
    assert old.to_dict()["mu_rouge"] == 0.5 and old.has("mu_rouge")
    assert "TOFUReport(model_name='retain'" in repr(retain_report) and len(repr(retain_report)) < 300


def test_cards_and_tables_from_report_and_dict_are_identical(target_report, retain_report, tmp_path):
    report, path = target_report
    base = report.model_name
    cards = [build_model_card("unlearned_model", base, "npo", {"beta": 0.1}, source, repo_id="me/tiny-npo").content
             for source in (report, report.to_dict(), path)]
    assert cards[0] == cards[1] == cards[2]
    card = build_model_card("unlearned_model", base, "npo", report=report, repo_id="me/tiny-npo")
    metrics = {r.metric_type: r.metric_value for r in card.data.eval_results}
    assert metrics["forget_quality"] == report.forget_quality and metrics["model_utility"] == report.model_utility
    assert metrics["rouge_l_recall"] == report.forget_rouge_l and metrics["truth_ratio"] == report.forget_truth_ratio
    assert metrics["mia_auc_min_k"] == report.mia_min_k and metrics["privleak"] == report.privleak
    assert metrics["rouge_l_recall_nf4_attack"] == report.attack_nf4_forget_rouge_l
    assert "recovered_fraction_relearn_attack" not in metrics  # not run: left out
    assert "TOFU (forget10)" in card.content and "synthetic" in card.content
    # a report's quantization entry (extra) is the card's quantization check, from either form
    with_q = TOFUReport.from_dict(dict(report.to_dict(), quantization={"method": "nf4", "forget_rouge_l": 0.25}))
    q_cards = [build_model_card("unlearned_model", base, "npo", report=r).content for r in (with_q, with_q.to_dict())]
    assert q_cards[0] == q_cards[1] and "### Quantization check" in q_cards[0] and "| method | nf4 |" in q_cards[0]
    assert "### Quantization check" not in cards[0]
    with pytest.raises(ValueError, match="computed for model"):
        build_model_card("unlearned_model", "org/other", "npo", report=report)
    assert render_report(report) == render_report(report.to_dict())
    table = format_report_table({"retain": retain_report, "target": report})
    assert table == format_report_table({"retain": retain_report.to_dict(), "target": report.to_dict()})
    assert f"| target | {report.forget_quality:.3g} | {report.model_utility:.3f} |" in table
    assert report_dict(report) == report.to_dict() and report_dict({"a": 1}) == {"a": 1}


def test_push_unlearned_uploads_the_reports_dict(hub, target_model, target_report):
    report, _ = target_report
    model, tokenizer = target_model
    push_unlearned(model, "tester/tiny-report", report, token=hub.token, method="npo", base_model=report.model_name)
    uploaded = json.loads(hub.files("tester/tiny-report")["unlearning_report.json"])
    assert uploaded == json.loads(json.dumps(report.to_dict()))
    assert TOFUReport.from_dict(uploaded) == report


def test_a_split_scored_without_generation_gives_the_reports_truth_ratios(target_model, target_report):
    """``evaluate_split(generate=False)`` (the inputs of forget quality, no greedy answers) scores the forget rows
    as the full evaluation does: the same truth ratios and probabilities, and no ROUGE or generations."""
    from hf_unlearn.data import load_tofu_rows
    from hf_unlearn.evaluation.tofu_stats import evaluate_split, evaluation_splits

    spec = evaluation_splits("forget10")[0]
    rows = load_tofu_rows(spec.config, "synthetic")[:FAST["max_examples"]]
    split = evaluate_split(*target_model, rows, spec, batch_size=FAST["batch_size"], progress=False, generate=False)
    report = target_report[0]
    assert split["rouge_l"] is None and split["per_example"]["generation"] is None
    assert split["per_example"]["truth_ratio"] == pytest.approx(report.forget_truth_ratios, rel=1e-4)
    assert split["prob"] == pytest.approx(report.forget_prob, rel=1e-4)
