"""The benchmark with selection: every method picks its own strength with the reference-free criterion, the
rows say what was chosen and why, the anchors are measured by the same criterion, and the criterion is
correlated with TOFU's forget quality."""

from __future__ import annotations

import math

import pytest
from unlearn_bench.criterion import criterion_correlation, criterion_p_value
from unlearn_bench.rows import selected_summary


def test_criterion_correlation_is_spearman_over_rows_with_both_figures():
    rows = [
        {"method": "a", "error": None, "forget_quality": 1e-6, "criterion": {"forget_holdout_pvalue": 0.01}},
        {"method": "b", "error": None, "forget_quality": 1e-3, "selected": {"criterion": {"forget_holdout_pvalue": 0.2}}},
        {"method": "c", "error": None, "forget_quality": 1e-1, "selected": {"criterion": {"forget_holdout_pvalue": 0.1}}},
        {"method": "d", "error": None, "forget_quality": 0.5, "selected": {"criterion": {"forget_holdout_pvalue": 0.9}}},
        {"method": "failed", "error": "boom", "forget_quality": 0.9, "criterion": {"forget_holdout_pvalue": 0.0}},
        {"method": "no criterion", "error": None, "forget_quality": 0.9},
    ]
    out = criterion_correlation(rows)
    assert out["n"] == 4 and [r["method"] for r in out["rows"]] == ["a", "b", "c", "d"]
    # ranks of p: 1, 3, 2, 4; ranks of FQ: 1, 2, 3, 4 -> rho = 1 - 6 * (0 + 1 + 1 + 0) / (4 * 15) = 0.8
    assert out["spearman"] == pytest.approx(0.8)
    assert criterion_correlation(rows[:2])["spearman"] is None  # fewer than 3 rows
    assert criterion_p_value(rows[1]) == 0.2 and criterion_p_value(rows[5]) is None


def test_selected_summary_names_the_chosen_candidate_and_its_criterion():
    record = {"index": 1, "chosen": {"step": 8}, "reason": "why", "warning": None,
              "measurements": [{"forget_holdout_pvalue": 0.0}, {"forget_holdout_pvalue": 0.3, "retain_change": 0.02}]}
    out = selected_summary(record)
    assert out["candidate"] == {"step": 8} and out["num_candidates"] == 2 and out["reason"] == "why"
    assert out["criterion"]["forget_holdout_pvalue"] == 0.3 and out["criterion"]["retain_change"] == 0.02
    assert selected_summary(None) is None


def test_selected_summary_of_an_own_stop_shows_the_stopped_model_and_keeps_the_rules_pick():
    from unlearn_bench.report import selection_table
    from unlearn_bench.rows import selection_applied

    record = {"index": 0, "chosen": {"step": 0}, "reason": "why", "warning": "far",
              "candidates": [{"step": 0}, {"step": 8}, {"step": 11}],
              "measurements": [{"forget_holdout_pvalue": 0.1, "retain_change": 0.0},
                               {"forget_holdout_pvalue": 0.2, "retain_change": 0.05},
                               {"forget_holdout_pvalue": 0.7, "retain_change": 0.3}]}
    out = selected_summary(record, applied=False)
    assert out["candidate"] == {"step": 11} and out["index"] == 2 and out["applied"] is False
    assert out["criterion"]["forget_holdout_pvalue"] == 0.7 and out["criterion"]["retain_change"] == 0.3
    assert out["warning"] is None
    assert out["criterion_choice"] == {"candidate": {"step": 0}, "index": 0, "reason": "why", "warning": "far"}
    assert criterion_p_value({"selected": out}) == 0.7  # the correlation takes the model that was evaluated
    table = selection_table({"rows": {"m": {"method": "m", "selected": out, "forget_quality": 0.5}}})
    assert "own stop, step=11 (the rule's pick step=0 not applied)" in table
    assert selected_summary(record)["candidate"] == {"step": 0}  # applied: the rule's pick
    assert selection_applied("npo") and not selection_applied("masc")


@pytest.mark.slow
def test_comparison_with_selection_records_each_methods_choice(tiny_pair, tmp_path):
    from unlearn_bench.runner import run_comparison

    from hf_unlearn.data import load_tofu_rows

    holdout = load_tofu_rows("holdout10", "synthetic")
    validation = load_tofu_rows("retain_perturbed", "synthetic")[:10]
    results = run_comparison(
        tiny_pair, ["grom", "grad_diff"], grid=False, source="synthetic", forget_split="forget10",
        eval_kwargs={"max_new_tokens": 8, "max_examples": 12}, quantization_check=False, progress=False,
        selection_rows=(holdout, validation), selection_steps=2, partial_path=tmp_path / "partial.json",
    )
    for anchor in ("target", "retain_reference"):
        assert 0.0 <= results[anchor]["criterion"]["forget_holdout_pvalue"] <= 1.0
    grom, grad_diff = results["rows"]["grom"], results["rows"]["grad_diff"]
    assert grom["error"] is None and grad_diff["error"] is None
    assert grom["selected"]["num_candidates"] == 9 and "scale" in grom["selected"]["candidate"]
    assert grad_diff["selected"]["num_candidates"] >= 2 and "step" in grad_diff["selected"]["candidate"]
    assert grom["selected"]["reason"] and grad_diff["selected"]["reason"]
    corr = results["criterion_vs_forget_quality"]
    assert corr["n"] == 4
    assert corr["spearman"] is None or math.isfinite(corr["spearman"])
    for row in (results["target"], grom, grad_diff):  # the bootstrap interval holds the point estimate
        ci = row["forget_quality_interval"]
        assert ci["forget_quality_low"] <= row["forget_quality"] * (1 + 1e-9) + 1e-300
        assert row["forget_quality_high"] == ci["forget_quality_high"] >= ci["forget_quality_low"]
    from unlearn_bench.report import write_results

    paths = write_results(results, tmp_path / "out", "sel", {"subject": "tofu_tiny"})
    details = paths["details_markdown"].read_text()
    assert "Selection (each method's own choice" in details and "Spearman rank correlation" in details
    assert "| grom | " in details and "| grad_diff | step=" in details
    # a comparison without selection is another comparison: its partial file is not mixed in
    with pytest.raises(ValueError, match="another comparison"):
        run_comparison(tiny_pair, ["grom"], grid=False, source="synthetic", forget_split="forget10",
                       eval_kwargs={"max_new_tokens": 8, "max_examples": 12}, quantization_check=False,
                       progress=False, partial_path=tmp_path / "partial.json", resume=True)


@pytest.mark.parametrize("native", ["0", "1"])
def test_v2_presets_build_every_methods_config_with_bf16_resolved(native, monkeypatch, tmp_path):
    """benchmarks/configs/smollm2-135m-v2.toml: one preset per method, bf16 = "auto" resolved by the CPU (overridden
    here both ways), and each preset builds its method's config (a misspelled field raises here, not mid-bench)."""
    from unlearn_bench.registry import PRESETS, load_subject_presets
    from unlearn_bench.runner import resolve_auto_precision

    import hf_unlearn

    monkeypatch.setenv("HF_UNLEARN_CPU_BF16", native)
    presets = load_subject_presets("smollm2-135m-v2")
    assert set(presets) == set(PRESETS)
    config_names = {"grad_ascent": "GradAscentConfig", "grad_diff": "GradDiffConfig", "npo": "NPOConfig",
                    "simnpo": "SimNPOConfig", "masc": "MASCConfig", "atwu": "ATWUConfig",
                    "wga": "WGAConfig", "satimp": "SatImpConfig", "ceu": "CEUConfig", "undial": "UNDIALConfig",
                    "dpo": "UnlearnDPOConfig", "idk_dpo": "IdkDPOConfig", "rmu": "RMUConfig", "pdu": "PDUConfig"}
    for method, preset in presets.items():
        settings = resolve_auto_precision(preset["demo"])
        if method in config_names:
            assert settings["bf16"] is (native == "1")
            config = getattr(hf_unlearn, config_names[method])(output_dir=str(tmp_path / method), report_to="none",
                                                             **{**settings, "bf16": False})
            assert config.max_steps == (600 if method == "masc" else 40)
        elif method == "grom":
            hf_unlearn.GROMConfig(**settings)
        else:
            hf_unlearn.T3ClassifierConfig(**settings)
    assert resolve_auto_precision({"bf16": True, "x": 1}) == {"bf16": True, "x": 1}


def test_resume_key_changes_with_the_selection_rule():
    """Rows selected under another rule (another name, tolerance or grouping) are not resumed into a comparison."""
    from types import SimpleNamespace

    from unlearn_bench.resume import comparison_key

    pair = SimpleNamespace(target="t", retain="r")
    args = (pair, "synthetic", "forget10", {"max_new_tokens": 8}, {"forget_quality": 1e-5}, {"model_utility": 0.8})
    rule = {"name": "NLL shift closest to holdout within retain tolerance", "retain_tolerance": 0.1, "groups": "rows"}
    key = comparison_key(*args, None, 8, rule)
    assert key == comparison_key(*args, None, 8, dict(rule))
    assert key != comparison_key(*args, None, 8, {**rule, "groups": "tofu_authors"})
    assert key != comparison_key(*args, None, 8, None)
    assert key != comparison_key(*args, None, 8, {**rule, "holdout_margin": 0.25})


def test_resume_key_names_models_and_rows_by_content(tmp_path):
    """A model folder's fingerprint follows its weights and config, not its path; the rows' digest follows every
    field of every row; a folder with nothing to name the model by is refused."""
    import shutil

    import torch
    from safetensors.torch import save_file
    from unlearn_bench.resume import model_fingerprint, rows_digest

    model = tmp_path / "a" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"hidden_size": 4}')
    save_file({"w": torch.arange(4.0)}, str(model / "model.safetensors"))
    (model / "README.md").write_text("a card")
    copy = shutil.copytree(model, tmp_path / "b" / "elsewhere")
    (copy / "README.md").write_text("another card")  # only the weights and config name the model
    assert model_fingerprint(model) == model_fingerprint(copy)
    save_file({"w": torch.arange(4.0) + 1e-3}, str(copy / "model.safetensors"))
    assert model_fingerprint(model) != model_fingerprint(copy)
    assert model_fingerprint("org/name") == "org/name"  # a Hub id is itself
    with pytest.raises(ValueError, match="no safetensors"):
        model_fingerprint(tmp_path / "a")
    rows = [{"question": "q", "answer": "a"}]
    assert rows_digest(rows, rows) == rows_digest([dict(rows[0])], rows)
    assert rows_digest(rows, rows) != rows_digest([{"question": "q", "answer": "b"}], rows)


def test_the_tuning_author_split_has_its_own_recipe_and_results_name():
    """``bench --subject NAME --authors tuning`` unlearns forget10 authors 5-8 (offset 4) under its own results
    name; the reported split stays authors 1-4; anything else is refused before any work."""
    from unlearn_bench.cli import build_parser
    from unlearn_bench.runner import FORGET_AUTHOR_SPLITS, _subject_layout

    reported, name, presets = _subject_layout("smollm2-135m", "v2", True)
    tuning, tuning_name, tuning_presets = _subject_layout("smollm2-135m", "v2", True, "tuning")
    assert (reported.forget_offset, tuning.forget_offset) == (0, 4) and reported.forget_authors == 4
    assert (name, tuning_name) == ("smollm2-135m_tofu_v2", "smollm2-135m_tofu_v2_tuning")
    assert presets == tuning_presets == "smollm2-135m-v2"
    assert tuning.retain_train_authors == reported.retain_train_authors  # the same retain side
    v1, v1_name, _ = _subject_layout("smollm2-135m", "v1", False, "tuning")
    assert v1.forget_offset == 4 and v1_name == "smollm2-135m_tofu_tuning"
    assert FORGET_AUTHOR_SPLITS["tuning"] == "forget10 authors 5-8"
    with pytest.raises(ValueError, match="authors must be one of"):
        _subject_layout("smollm2-135m", "v2", True, "all")
    args = build_parser().parse_args(["run", "--subject", "smollm2-135m", "--authors", "tuning"])
    assert args.authors == "tuning"
    from hf_unlearn.options import UserError

    with pytest.raises(UserError, match="invalid choice: '9-12'"):
        build_parser().parse_args(["run", "--authors", "9-12"])
