"""One result row of the comparison: a method unlearns a fresh copy of the target with one setting, and the row
holds its evaluation (every figure of the TOFU report, the forget-quality interval), its cost (wall seconds, peak
memory, trainable share, steps), answer NLLs, the method's own metrics, generation speed for decoding-time methods,
and, for a chosen setting, the NF4 re-check and the attacks.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import traceback
from pathlib import Path
from typing import Any

from hf_unlearn.jsonutil import is_jsonable
from hf_unlearn.run import nf4_forget_rouge

SPEED_QUESTIONS = 16  # generation-speed batch: the first forget questions
SPEED_NEW_TOKENS = 32


def _row_from_report(report: Any) -> dict[str, Any]:
    """Every figure the evaluator defines (:data:`~hf_unlearn.evaluation.report.METRIC_DEFINITIONS`: forget quality,
    model utility, MU-ROUGE, ROUGE-L, truth ratios, extraction strength, exact memorization, MIA AUCs, privleak),
    ``None`` where the report lacks it. ``report`` is a :class:`~hf_unlearn.evaluation.TOFUReport` or its dict form
    (a report read from disk)."""
    from hf_unlearn.evaluation.report import METRIC_DEFINITIONS, as_report

    report = as_report(report)
    row = {k: getattr(report, k) for k in METRIC_DEFINITIONS}
    row["components"] = dict(report.components) if report.components else None
    return row


def run_one(
    method: str,
    settings: dict[str, Any],
    target_path: str | os.PathLike,
    tokenizer: Any,
    forget_rows: list[dict[str, Any]],
    retain_rows: list[dict[str, Any]],
    reference: Any,
    source: str,
    forget_split: str,
    eval_kwargs: dict[str, Any],
    quantization_check: bool = True,
    work_dir: str | os.PathLike | None = None,
    *,
    reporter: Any = None,
    log_path: str | os.PathLike | None = None,
    verbose: bool = False,
    label: str | None = None,
    criterion: Any = None,
    selection_steps: int = 50,
) -> dict[str, Any]:
    """Unlearn a fresh copy of the target with one method/setting, evaluate it; one result row.

    With a ``criterion`` (:class:`~hf_unlearn.selection.SelectionCriterion`) the method picks its own strength
    through :func:`~hf_unlearn.run.fit_or_train` (each method's own selection: an exact path, a calibration,
    a stopping rule with the criterion recorded beside it, or best-checkpoint selection every ``selection_steps``
    steps);
    the row's ``selected`` says which candidate was chosen and why, and ``seconds`` includes the selection.

    With a ``reporter`` (:class:`~hf_unlearn.console.PhaseReporter`) one console line per phase is
    printed; with ``log_path`` the Trainer's per-step logs and any failure's traceback go to that JSON Lines
    file (``verbose`` also prints the logs). A failure is recorded in the row (``error``, ``failed_phase``).
    """
    from hf_unlearn.console import PhaseReporter, log_event, log_exception
    from hf_unlearn.evaluation import evaluate_tofu
    from hf_unlearn.run import JsonlLogCallback

    row: dict[str, Any] = {"method": method, "settings": settings, "error": None}
    if eval_kwargs.get("device") is not None:
        row["device"] = eval_kwargs["device"]
    say = reporter or PhaseReporter(enabled=False)
    label = label or method
    callbacks = [JsonlLogCallback(log_path, echo=verbose)] if log_path is not None else []
    log_event(log_path, "start", method=method, label=label, settings=settings)
    work = Path(work_dir or tempfile.mkdtemp(prefix=f"hf_unlearn_{method}_"))
    phase = "training"
    try:
        say.start(label, phase)
        result, mem = _unlearn(row, method, settings, target_path, tokenizer, forget_rows, retain_rows, work,
                               callbacks=callbacks, criterion=criterion, selection_steps=selection_steps,
                               quiet=reporter is not None)
        say.done(f"{result.info['global_step']} steps" if result.info.get("global_step") else "")
        phase = "evaluation"
        say.start(label, phase)
        report = evaluate_tofu(
            result.model, tokenizer, source=source, forget_split=forget_split, retain_reference=reference,
            scorer=result.scorer, generation_kwargs=result.generation_kwargs, progress=False, **eval_kwargs,
        )
        _fill_row(row, result, report, mem, reference, tokenizer, forget_rows, retain_rows)
        say.done()
        if quantization_check:
            phase = "NF4 re-check"
            say.start(label, phase)
            nf4_check(row, result, report, tokenizer, source, forget_split, eval_kwargs)
            say.done()
        row["_result"] = result
        row["_report"] = report
    except Exception as err:  # one method's failure must not stop the others
        row["error"] = f"{type(err).__name__}: {err}"
        row["failed_phase"] = phase
        row["traceback"] = traceback.format_exc(limit=8)
        log_exception(log_path, phase, err)
        say.fail(err, log_path)
    finally:
        if work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return row


def on_harness_device(settings: dict[str, Any], model: Any, row: dict[str, Any]) -> dict[str, Any]:
    """Put one run on the harness's device (``row["device"]``, which :func:`run_one` copies from the comparison's
    ``eval_kwargs["device"]``): the fresh target is moved there, and a trainer on ``"cpu"`` is told so
    (``use_cpu``: the Trainer takes a GPU when one is present). Returns the settings to run with (a copy when
    changed); without a device, the model stays where it loaded and the settings are returned as they are."""
    device = row.get("device")
    if device is None:
        return settings
    model.to(device)
    if device == "cpu" and "use_cpu" not in settings:
        from hf_unlearn import registry

        if registry.get_method(row["method"]).is_trainer:
            return {**settings, "use_cpu": True}
    return settings


def _unlearn(row: dict[str, Any], method: str, settings: dict[str, Any], target_path: str | os.PathLike,
             tokenizer: Any, forget_rows: list[dict[str, Any]], retain_rows: list[dict[str, Any]], work: Path, *,
             callbacks: list[Any], criterion: Any, selection_steps: int, quiet: bool) -> tuple[Any, Any]:
    """Load a fresh copy of the target and unlearn it with ``method`` (its own strength selection with a
    ``criterion``, whose summary goes to ``row["selected"]``): the method's result and the
    :class:`~unlearn_bench.measure.PeakMemory` of the run."""
    from transformers import AutoModelForCausalLM

    from hf_unlearn.run import TrainOptions, fit_or_train, prepare_inputs

    from .measure import PeakMemory

    model = AutoModelForCausalLM.from_pretrained(target_path, trust_remote_code=False)
    settings = on_harness_device(settings, model, row)
    with PeakMemory() as mem:
        inputs = prepare_inputs(method, model, tokenizer, forget_rows, retain_rows, work, settings)
        result = fit_or_train(inputs, TrainOptions(callbacks=callbacks, quiet=quiet, criterion=criterion,
                                                   selection_steps=selection_steps))
        if criterion is not None:
            row["selected"] = selected_summary(result.info.get("selection"), applied=selection_applied(method))
    return result, mem


def _fill_row(row: dict[str, Any], result: Any, report: Any, mem: Any, reference: Any, tokenizer: Any,
              forget_rows: list[dict[str, Any]], retain_rows: list[dict[str, Any]]) -> None:
    """Add an unlearned model's columns to its row: the report's figures and forget-quality interval, the run's
    cost, the answer NLLs under the weights (weight edits), the method's own metrics and, for decoding-time
    methods, generation speed against plain ``generate``."""
    from hf_unlearn.logprobs import mean_answer_nll

    from .measure import generation_speed

    row.update(_row_from_report(report))
    row["forget_quality_interval"] = forget_quality_interval_of(report, reference)
    row.update(_interval_columns(row["forget_quality_interval"]))
    row.update(
        seconds=result.seconds, peak_rss_mb=mem.peak_mb, peak_added_mb=mem.added_mb, peak_gpu_mb=mem.peak_gpu_mb,
        trainable_share=result.trainable_params / max(1, result.total_params), steps=result.info.get("global_step"),
        info={k: v for k, v in result.info.items() if is_jsonable(v)},
    )
    if result.scorer is None:  # answer NLL under the weights (decoding-time methods leave them alone)
        row["forget_nll"] = mean_answer_nll(result.model, tokenizer, forget_rows)
        row["retain_nll"] = mean_answer_nll(result.model, tokenizer, retain_rows[: len(forget_rows)])
    copy_extra_metrics(row, getattr(result, "metrics", None) or {})
    row["forget_rouge_l_nf4"] = None
    processors = (result.generation_kwargs or {}).get("logits_processor")
    if processors is not None:  # decoding-time methods: tokens/s against plain generate
        speed = generation_speed(result.model, tokenizer, [r["question"] for r in forget_rows[:SPEED_QUESTIONS]],
                                 processors, max_new_tokens=SPEED_NEW_TOKENS)
        row["generate_speed_ratio"] = speed["speed_ratio"]
        row["generation_speed"] = speed


def forget_quality_interval_of(report: Any, reference: Any) -> dict[str, float] | None:
    """The bootstrap 95% interval of a report's forget quality against the retain reference's truth ratios
    (:func:`hf_unlearn.evaluation.metrics.forget_quality_interval`, resampling forget rows); ``None`` when either
    side lacks its per-question truth ratios or they are not paired (different lengths). Each report is a
    :class:`~hf_unlearn.evaluation.TOFUReport` or its dict form (``reference`` may be ``None``)."""
    from hf_unlearn.evaluation.metrics import forget_quality_interval
    from hf_unlearn.evaluation.report import as_report

    mine = as_report(report).forget_truth_ratios
    theirs = as_report(reference).forget_truth_ratios if reference else None
    if not mine or not theirs or len(mine) != len(theirs):
        return None
    return forget_quality_interval(mine, theirs)


def _interval_columns(interval: dict[str, float] | None) -> dict[str, float | None]:
    return {"forget_quality_low": (interval or {}).get("forget_quality_low"),
            "forget_quality_high": (interval or {}).get("forget_quality_high")}


def selection_applied(method: str) -> bool:
    """Whether ``method``'s row is the criterion's pick (False for a method that stops by its own rule, whose
    selection record is only kept beside it)."""
    from hf_unlearn import registry

    return not registry.get_method(method).stops_itself


def selected_summary(record: dict[str, Any] | None, applied: bool = True) -> dict[str, Any] | None:
    """What a row shows of a selection record: the chosen candidate, how many were measured, why it was chosen,
    the fallback warning (if any) and the criterion's figures at the chosen candidate.

    ``applied=False`` (a method that stops by its own rule: the criterion is recorded beside it, nothing restored):
    the row's model is the last candidate measured, so the summary shows that candidate and its figures, with
    ``applied`` False and the rule's own pick under ``criterion_choice`` (candidate, index, reason, warning)."""
    if not record:
        return None
    index = record.get("index")
    measured = record.get("measurements") or []
    shown = index if applied else len(measured) - 1
    figures = measured[shown] if isinstance(shown, int) and 0 <= shown < len(measured) else {}
    summary = {
        "candidate": record.get("chosen"), "index": index, "num_candidates": len(measured),
        "reason": record.get("reason"), "warning": record.get("warning"),
        "criterion": {k: figures.get(k) for k in ("shift_gap", "shift_gap_se", "shift_gap_df", "equivalence_pvalue",
                                                  "forget_holdout_pvalue", "forget_holdout_ks_pvalue",
                                                  "forget_holdout_ks", "mia_auc", "retain_change", "forget_nll",
                                                  "holdout_nll")},
    }
    if not applied:
        candidates = record.get("candidates") or []
        summary.update(
            candidate=candidates[shown] if 0 <= shown < len(candidates) else None, index=shown, applied=False,
            reason="the method's own stop: the model is the last candidate measured; the rule's pick was not applied",
            warning=None, criterion_choice={"candidate": record.get("chosen"), "index": index,
                                            "reason": record.get("reason"), "warning": record.get("warning")})
    return summary


def copy_extra_metrics(row: dict[str, Any], metrics: dict[str, Any]) -> None:
    """Copy a method's own metrics (``Unlearned.metrics``) into its row; their names go to ``row["extra_metrics"]``.

    A metric may not replace one of the runner's own columns.
    """
    clash = sorted(set(metrics) & set(row))
    if clash:
        raise ValueError(f"The method's metrics {clash} clash with the runner's row keys.")
    row.update(metrics)
    row["extra_metrics"] = list(metrics)


def nf4_check(row: dict[str, Any], result: Any, report: Any, tokenizer: Any, source: str,
              forget_split: str, eval_kwargs: dict[str, Any]) -> None:
    """Fill ``row["forget_rouge_l_nf4"]`` for a method that changed weights (merge, quantize, regenerate);
    ``report`` is the method's :class:`~hf_unlearn.evaluation.TOFUReport`."""
    if result.weights_changed:
        n = report.splits["forget"]["num_examples"]
        rows = _forget_eval_rows(source, forget_split, n)
        row["forget_rouge_l_nf4"] = nf4_forget_rouge(result.model, tokenizer, rows, eval_kwargs)


def attack_check(row: dict[str, Any], model: Any, tokenizer: Any, forget_rows: list[dict[str, Any]],
                 retain_rows: list[dict[str, Any]], original: Any, attacks: Any, eval_kwargs: dict[str, Any],
                 decoding: Any = None) -> None:
    """Run ``attacks`` (:func:`hf_unlearn.evaluation.attacks.run_attacks`) on ``model`` (through ``decoding``, a
    decoding factory, when given) against ``original`` (the target); fill the row's attack columns and
    ``row["attacks"]``."""
    from hf_unlearn.evaluation.attacks import attack_summary, run_attacks

    common = {"original": original, "decoding": decoding, "progress": False,
              "batch_size": eval_kwargs.get("batch_size", 16)}
    for key in ("template", "max_new_tokens"):
        if key in eval_kwargs:
            common[key] = eval_kwargs[key]
    section = run_attacks(model, tokenizer, forget_rows, retain_rows, attacks, **common)
    row.update(attack_summary(section))
    row["attacks"] = section


def _decoding_artifact(result: Any) -> Any:
    """The decoding factory of a result whose method changes decoding (its base is attacked with the artifact
    kept); ``None`` for weight edits. A custom scorer of no registered decoding cannot be rebuilt on an attacked
    copy and is refused."""
    if result.scorer is None:
        return None
    from hf_unlearn.evaluation import artifact_decoding

    try:
        return artifact_decoding(result.artifact)
    except ValueError:
        raise ValueError(f"The attacks cannot rescore method {result.method!r}: its scorer belongs to no registered "
                         "decoding-time method.") from None


def _forget_eval_rows(source: str, forget_split: str, n: int) -> list[dict[str, Any]]:
    from hf_unlearn.data import load_tofu_rows

    return load_tofu_rows(f"{forget_split}_perturbed", source)[:n]
