"""The demo's comparison: every method unlearns a fresh copy of the TOFU-tiny target with its demo setting and its
strength chosen as ``--select --holdout holdout10`` chooses it; one evaluator scores each against the retain
reference (with the NF4 copy's forget ROUGE-L for a method that changed the weights). A failure in one method is
recorded in its row and the others still run."""

from __future__ import annotations

import os
import tempfile
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..evaluation.generation import DEFAULT_MAX_NEW_TOKENS
from ..safe_output import atomic_write_json, atomic_write_text
from .references import reference_rows, sanity_gate
from .settings import demo_settings

#: The rows the selection criterion compares the forget rows with (never seen by the target), and how often a
#: trainer's checkpoint is measured (optimizer steps).
DEMO_HOLDOUT = "holdout10"
DEMO_SELECTION_STEPS = 5

#: ``(row key, column title, format)`` of the demo table, in order.
DEMO_COLUMNS = (
    ("forget_quality", "forget quality", ".3g"),
    ("model_utility", "model utility", ".3f"),
    ("forget_rouge_l", "forget ROUGE-L", ".3f"),
    ("forget_truth_ratio", "forget truth ratio", ".3f"),
    ("forget_rouge_l_nf4", "forget ROUGE-L (NF4)", ".3f"),
    ("seconds", "wall s", ".2f"),
    ("steps", "steps", "d"),
    ("chosen", "strength chosen", "s"),
)


def forget_rows_with_other_answers(forget_split: str, source: str) -> list[dict[str, Any]]:
    """The rows of TOFU config ``forget_split``, each with the ``paraphrased_answer`` and
    ``perturbed_answer`` of ``<forget_split>_perturbed`` when that config holds the same rows in the same order."""
    from ..data import load_tofu_rows

    rows = load_tofu_rows(forget_split, source)
    try:
        perturbed = load_tofu_rows(f"{forget_split}_perturbed", source)
    except (ValueError, FileNotFoundError, OSError):
        return rows
    if [(r["question"], r["answer"]) for r in perturbed] != [(r["question"], r["answer"]) for r in rows]:
        return rows
    keep = ("paraphrased_answer", "perturbed_answer")
    return [{**row, **{k: other[k] for k in keep if k in other}} for row, other in zip(rows, perturbed)]


def report_row(report: Any) -> dict[str, Any]:
    return {key: getattr(report, key) for key in ("forget_quality", "model_utility", "forget_rouge_l",
                                                  "forget_truth_ratio")}


def run_demo_method(method: str, pair: Any, tokenizer: Any, data: dict[str, Any], retain_report: Any,
                    eval_kwargs: dict[str, Any], *, quantization_check: bool, say: Any,
                    log_path: Path | None, verbose: bool) -> dict[str, Any]:
    """One method's row: unlearn a fresh copy of the target with its demo setting and strength selection,
    evaluate it, and re-check its NF4 copy; a failure fills ``error`` and ``failed_phase`` instead of raising."""
    from transformers import AutoModelForCausalLM

    from ..console import log_event, log_exception
    from ..evaluation import evaluate_tofu
    from ..run import (
        JsonlLogCallback,
        SelectionRequest,
        TrainOptions,
        fit_or_train,
        nf4_forget_rouge,
        prepare_inputs,
        report_forget_rows,
        selection_criterion,
    )

    settings = demo_settings(method)
    row: dict[str, Any] = {"method": method, "settings": settings, "error": None, "forget_rouge_l_nf4": None}
    callbacks = [JsonlLogCallback(log_path, echo=verbose)] if log_path is not None else []
    log_event(log_path, "start", method=method, settings=settings)
    phase = "training"
    try:
        with tempfile.TemporaryDirectory(prefix=f"hf_unlearn_demo_{method}_") as work:
            say.start(method, phase)
            model = AutoModelForCausalLM.from_pretrained(pair.target, trust_remote_code=False)
            criterion, retain = selection_criterion(SelectionRequest(DEMO_HOLDOUT), data["source"], data["forget"],
                                                    data["retain"], settings.get("prompt_template"))
            inputs = prepare_inputs(method, model, tokenizer, data["forget"], retain, work, settings)
            with warnings.catch_warnings():  # a selection's caveat is kept in its record (row["selection"]["warning"])
                warnings.simplefilter("ignore", UserWarning)
                result = fit_or_train(inputs, TrainOptions(callbacks=callbacks, criterion=criterion,
                                                           selection_steps=DEMO_SELECTION_STEPS))
            row["selection"] = result.info.get("selection")
            steps = result.info.get("global_step")
            say.done(f"{steps} steps" if steps else "")
            phase = "evaluation"
            say.start(method, phase)
            report = evaluate_tofu(result.model, tokenizer, source=data["source"], forget_split=data["forget_split"],
                                   retain_reference=retain_report, scorer=result.scorer,
                                   generation_kwargs=result.generation_kwargs, progress=False, **eval_kwargs)
            # the strength chosen, in a few words: "step 10 of 30", or the first three settings
            chosen = (row["selection"] or {}).get("chosen") or {}
            if "step" in chosen:
                label = f"step {chosen['step']} of {steps}" if steps else f"step {chosen['step']}"
            else:
                label = ", ".join([f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in chosen.items()][:3])
            row.update(report_row(report), seconds=result.seconds, steps=steps, chosen=label or None)
            say.done()
            if quantization_check and result.weights_changed:
                phase = "NF4 re-check"
                say.start(method, phase)
                rows = report_forget_rows(report, data["source"], data["forget_split"])
                row["forget_rouge_l_nf4"] = nf4_forget_rouge(result.model, tokenizer, rows, eval_kwargs)
                say.done()
    except Exception as err:  # one method's failure must not stop the others
        row.update(error=f"{type(err).__name__}: {err}", failed_phase=phase, traceback=traceback.format_exc(limit=8))
        log_exception(log_path, phase, err)
        say.fail(err, log_path)
    return row


def run_demo(pair: Any, methods: Sequence[str], *, source: str = "synthetic", forget_split: str = "forget10",
             eval_kwargs: dict[str, Any] | None = None, quantization_check: bool = True, progress: bool = True,
             log_dir: str | os.PathLike | None = None, verbose: bool = False) -> dict[str, Any]:
    """Run ``methods`` on ``pair.target`` and score them against ``pair.retain``. Returns ``{"target",
    "retain_reference", "rows": {method: row}, "sanity_gate", "max_new_tokens"}``, each row with
    :data:`DEMO_COLUMNS`' keys; the per-step logs go to ``<log_dir>/<method>.jsonl``."""
    from transformers import AutoTokenizer

    from ..console import PhaseReporter
    from ..data import RETAIN_FOR_FORGET, load_tofu_rows
    from ..run import nf4_forget_rouge, report_forget_rows
    from .tofu_tiny import load_tiny

    eval_kwargs = dict(eval_kwargs or {})
    say = PhaseReporter(enabled=progress, inline=not verbose)
    say.start("references", "evaluation")
    target_report, retain_report = reference_rows(pair, source, forget_split, eval_kwargs)
    say.done("target and retain reference")
    target_row = {"method": "target", **report_row(target_report), "error": None}
    retain_row = {"method": "retain reference", **report_row(retain_report), "error": None}
    if quantization_check:
        say.start("references", "NF4 re-check")
        target_model, tokenizer = load_tiny(pair.target)
        rows = report_forget_rows(target_report, source, forget_split)
        target_row["forget_rouge_l_nf4"] = nf4_forget_rouge(target_model, tokenizer, rows, eval_kwargs)
        del target_model
        say.done("target")
    tokenizer = AutoTokenizer.from_pretrained(pair.target, trust_remote_code=False)
    data = {"source": source, "forget_split": forget_split,
            "forget": forget_rows_with_other_answers(forget_split, source),
            "retain": load_tofu_rows(RETAIN_FOR_FORGET[forget_split], source)}
    rows = {}
    for method in methods:
        log_path = Path(log_dir) / f"{method}.jsonl" if log_dir is not None else None
        rows[method] = run_demo_method(method, pair, tokenizer, data, retain_report, eval_kwargs,
                                       quantization_check=quantization_check, say=say, log_path=log_path,
                                       verbose=verbose)
    return {"target": target_row, "retain_reference": retain_row, "rows": rows,
            "sanity_gate": sanity_gate(target_report, retain_report),
            "max_new_tokens": eval_kwargs.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)}


def write_demo_results(results: dict[str, Any], out_dir: str | os.PathLike, meta: dict[str, Any]) -> dict[str, Path]:
    """Write ``demo.json`` (``meta`` + results + the markdown table, the target and the retain reference first,
    with a note when answers were cut shorter than TOFU's 200 new tokens) and ``demo.md`` into ``out_dir``."""
    ordered = [("target", results["target"]), ("retain reference", results["retain_reference"]),
               *results["rows"].items()]
    lines = ["| method | " + " | ".join(title for _, title, _ in DEMO_COLUMNS) + " |",
             "|" + "---|" * (len(DEMO_COLUMNS) + 1)]
    for name, row in ordered:
        if row.get("error"):
            cells = [f"failed: {row['error'][:80]}"] + [""] * (len(DEMO_COLUMNS) - 1)
        else:
            cells = ["n/a" if row.get(key) is None or row[key] != row[key] else format(row[key], fmt)
                     for key, _, fmt in DEMO_COLUMNS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    tokens = results.get("max_new_tokens")
    if tokens is not None and tokens < DEFAULT_MAX_NEW_TOKENS:
        table += (f"\n\nForget ROUGE-L from greedy answers of at most {tokens} new tokens (TOFU generates up to "
                  f"{DEFAULT_MAX_NEW_TOKENS}; longer answers are cut, which caps ROUGE-L).")
    out = Path(out_dir)
    paths = {"json": out / "demo.json", "markdown": out / "demo.md"}
    atomic_write_json(paths["json"], {**meta, **results, "table_markdown": table})
    atomic_write_text(paths["markdown"], table + "\n")
    return paths
