"""MUSE-News-small: the subset's matching on the real MUSE-News files, the tiny pair and its sanity gate, and the
benchmark runner (selection, error rows, the json/md/png outputs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import CACHE_DIR


@pytest.fixture(scope="module")
def muse_pair(muse_dir):
    from unlearn_bench.subjects.muse_news import build_muse_tiny_pair

    return build_muse_tiny_pair(cache_dir=CACHE_DIR, source=muse_dir, progress=False)


def _read(folder: Path, name: str):
    return json.loads((folder / name).read_text(encoding="utf-8"))


def test_matching_on_the_real_files(muse_dir):
    from unlearn_bench.subjects.muse_news import (
        match_knowmem,
        match_muse_subset,
        match_verbmem,
        muse_recipe_for,
    )

    articles = _read(muse_dir, "raw/forget.json")
    verbmem_rows = _read(muse_dir, "verbmem/forget.json")
    knowmem_rows = _read(muse_dir, "knowmem/forget_qa.json")
    verbmem = match_verbmem(verbmem_rows, articles)
    knowmem = match_knowmem(knowmem_rows, articles)
    assert len(verbmem) > 0 and len(knowmem) > 0
    for m in verbmem:  # the kept end of the prompt and the whole gt lie in the matched article
        row = verbmem_rows[m["item"]]
        assert row["prompt"][-m["prompt_chars"]:] + row["gt"] in articles[m["text"]]
        assert m["whole_prompt"] == (m["prompt_chars"] == len(row["prompt"]))
    for m in knowmem:
        assert knowmem_rows[m["item"]]["answer"] in articles[m["text"]] and m["overlap"] >= 0.5
    subset = match_muse_subset(muse_dir, muse_recipe_for("tiny"))
    retain_texts, retain_rows = _read(muse_dir, "privleak/retain2.json"), _read(muse_dir, "knowmem/retain2_qa.json")
    assert subset["verbmem"] and subset["knowmem_forget"] and subset["knowmem_retain"]
    assert {m["text"] for m in subset["verbmem"] + subset["knowmem_forget"]} == set(subset["forget_articles"])
    for m in subset["knowmem_retain"]:
        assert m["text"] in subset["retain_texts"]
        assert retain_rows[m["item"]]["answer"] in retain_texts[m["text"]][:2000]


def test_gate_on_hand_made_reports():
    from unlearn_bench.subjects.muse_news import format_muse_gate, muse_sanity_gate

    from hf_unlearn.evaluation.muse_report import MUSEReport

    def report(verbmem, knowmem):
        return MUSEReport(model_name="m", source="s", verbmem_forget=verbmem, knowmem_forget=knowmem,
                          knowmem_retain=30.0)

    passed = muse_sanity_gate(report(80.0, 40.0), report(10.0, 5.0))
    assert passed["passed"] and passed["checks"]["verbmem_gap"]["value"] == pytest.approx(70.0)
    failed = muse_sanity_gate(report(80.0, 10.0).to_dict(), report(10.0, 5.0).to_dict())
    assert not failed["passed"] and not failed["checks"]["knowmem_forget_gap"]["passed"]
    assert not muse_sanity_gate(report(None, 40.0), report(10.0, 5.0))["passed"]
    assert "FAILED" in format_muse_gate(failed) and "PASSED" in format_muse_gate(passed)


def test_tiny_pair_passes_the_gate(muse_pair):
    from unlearn_bench.subjects.muse_news import muse_sanity_gate

    from hf_unlearn.demo import load_tiny
    from hf_unlearn.evaluation import evaluate_muse

    model, tok = load_tiny(muse_pair.retain)
    retain = evaluate_muse(model, tok, source=muse_pair.data, progress=False)
    model, tok = load_tiny(muse_pair.target)
    target = evaluate_muse(model, tok, source=muse_pair.data, retain_reference=retain, progress=False)
    gate = muse_sanity_gate(target, retain)
    assert gate["passed"], gate
    assert target.privleak < 0  # the target's forget texts read as training data, against the retain reference
    # the data folder holds the subset's MUSE parts and the documents
    parts = _read(muse_pair.data, "verbmem/forget.json")
    assert len(parts) == len(muse_pair.subset["verbmem"]) and muse_pair.documents("forget")
    assert not set(muse_pair.documents("holdout")) & set(_read(muse_pair.data, "privleak/holdout.json"))


def test_runner_two_methods_and_an_error_row(muse_pair, tmp_path):
    from unlearn_bench.muse_runner import run_muse_bench, write_muse_results

    results = run_muse_bench(muse_pair, ["grad_diff", "grom", "masc", "dpo"], subject="tiny", progress=False)
    rows = results["rows"]
    for method in ("grad_diff", "grom", "masc"):
        row = rows[method]
        assert row["error"] is None, row.get("traceback")
        assert row["selected"] is not None and row["candidates"]
        assert all(isinstance(row[k], float) for k in ("verbmem_forget", "knowmem_forget", "privleak",
                                                        "knowmem_retain"))
    assert rows["grad_diff"]["steps"] == results["settings"]["grad_diff"]["max_steps"]
    assert rows["grad_diff"]["selected"].get("applied", True) is True
    # MASC stops by its own rule: its row is the last candidate measured, with that candidate's criterion figures;
    # the criterion's own pick is kept beside it, not applied
    masc = rows["masc"]["selected"]
    assert masc["applied"] is False and masc["index"] == masc["num_candidates"] - 1
    assert masc["candidate"] == rows["masc"]["candidates"][-1]["candidate"]
    assert masc["criterion"]["retain_change"] == rows["masc"]["candidates"][-1]["retain_change"]
    assert masc["criterion_choice"]["index"] in range(masc["num_candidates"])
    # DPO needs question/answer rows: its refusal is a row, not a crash
    assert rows["dpo"]["error"].startswith("ValueError") and rows["dpo"]["failed_phase"] == "training"
    paths = write_muse_results(results, tmp_path / "muse", command="pytest")
    saved = json.loads(paths["json"].read_text())
    assert saved["gate"]["passed"] == results["gate"]["passed"] and set(saved["rows"]) == {"grad_diff", "grom", "masc", "dpo"}
    table = paths["markdown"].read_text()
    assert "sanity gate" in table.splitlines()[2] and "| grom |" in table and "failed (training)" in table
    pick = masc["criterion_choice"]["candidate"]["step"]
    assert f"| own stop, step {masc['candidate']['step']} (" in table
    assert f"the criterion's pick step {pick} not applied" in table
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temporary file


def test_the_cli_runs_the_muse_benchmark_and_refuses_what_it_cannot(muse_pair, muse_dir, tmp_path, capsys):
    """``unlearn-bench run --benchmark muse`` runs the same benchmark (:func:`run_muse_news`) on the cached tiny pair
    and writes its results under ``--output-dir``; a TOFU-only option is refused in one line before any work."""
    from unlearn_bench.cli import main

    common = ["run", "--benchmark", "muse", "--data", str(muse_dir), "--cache-dir", str(CACHE_DIR),
              "--output-dir", str(tmp_path)]
    assert main([*common, "--methods", "grad_diff"]) == 0, capsys.readouterr().err
    saved = _read(tmp_path, "muse_news_tiny.json")
    assert set(saved["rows"]) == {"grad_diff"} and saved["rows"]["grad_diff"]["error"] is None
    assert saved["command"] == "unlearn-bench run --benchmark muse" and "sanity gate" in capsys.readouterr().out
    assert main([*common, "--model", "m", "--retain-model", "r"]) == 2
    assert "--benchmark muse builds its own MUSE-News pair" in capsys.readouterr().err


def test_the_default_methods_are_those_that_take_documents():
    """Every registered method but the preference trainers (a preferred answer needs a question), in order."""
    from unlearn_bench.muse_runner import document_methods

    from hf_unlearn.registry import method_names

    assert document_methods() == [m for m in method_names() if m not in ("dpo", "idk_dpo")]

