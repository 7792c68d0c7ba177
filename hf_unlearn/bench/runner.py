"""Every method side by side on one target model, scored by one evaluator (`demo` and `bench`).

For each method and each setting of its grid, a fresh copy of the target is unlearned, timed
(wall seconds, peak memory: :class:`~hf_unlearn.bench.measure.PeakMemory`), evaluated with
:func:`hf_unlearn.evaluation.evaluate_tofu` against the retain reference. The chosen setting of a
method is the one with the highest forget quality among those keeping model utility >= 90% of
the target's (the highest-utility setting when none does); for methods that change weights it is
re-checked after 4-bit NF4 quantization (forget ROUGE-L). GROM's wall time is also given against
one plain forward pass over forget + retain, and decoding-time methods (T3) report greedy
``generate`` tokens per second against plain ``generate``, both measured in the same process.
Every row also records the mean answer NLL on the forget rows and on as many retain rows, the
optimizer steps, and any extra metric the method reported in ``Unlearned.metrics`` (ATWU's token
AUROC). A failure in one method is recorded in its row and the others still run.

The settings come from the benchmark subject's TOML file (:func:`~hf_unlearn.bench.registry.load_subject_presets`);
the tables, plot and result files are :mod:`hf_unlearn.bench.report`'s.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..evaluation.generation import DEFAULT_MAX_NEW_TOKENS
from ..run import nf4_forget_rouge

UTILITY_KEEP = 0.9  # the chosen setting keeps model utility >= 90% of the target's
SPEED_QUESTIONS = 16  # generation-speed batch: the first forget questions
SPEED_NEW_TOKENS = 32


RETAIN_BAR_COMPONENTS = ("retain_rouge_l", "retain_prob")
GENERAL_BAR_COMPONENTS = tuple(f"{split}_{stat}" for split in ("real_authors", "world_facts")
                               for stat in ("prob", "rouge_l", "truth_ratio"))


def _harmonic_mean(values: Sequence[Any]) -> float | None:
    """``n / sum_i 1/v_i`` of the values (0 when one is 0, as TOFU's model utility); ``None`` when one is missing
    or negative."""
    if any(v is None or not isinstance(v, (int, float)) or v != v or v < 0 for v in values):
        return None
    return 0.0 if any(v == 0 for v in values) else len(values) / sum(1.0 / v for v in values)


def side_utilities(row: dict[str, Any]) -> dict[str, float | None]:
    """The harmonic mean of a row's retain-side components (:data:`RETAIN_BAR_COMPONENTS`) and of its
    general-side components (:data:`GENERAL_BAR_COMPONENTS`): ``{"retain", "general"}``."""
    parts = row.get("components") or {}
    return {"retain": _harmonic_mean([parts.get(k) for k in RETAIN_BAR_COMPONENTS]),
            "general": _harmonic_mean([parts.get(k) for k in GENERAL_BAR_COMPONENTS])}


def utility_bar(row: dict[str, Any], target: dict[str, Any], keep: float = UTILITY_KEEP) -> dict[str, bool]:
    """Whether ``row`` keeps the target's utility, as one number and on each side separately.

    ``single``: ``model_utility >= keep * target's``. ``retain``: the harmonic mean of retain ROUGE-L and retain
    probability ``>= keep *`` the target's (the rows the forget set must not take with it). ``general``: the
    harmonic mean of the six real-author and world-fact components (probability, ROUGE-L, truth ratio)
    ``>= keep *`` the target's (general knowledge). ``split``: ``retain and general``. A figure missing on
    either side counts as not kept.

    Why a side's harmonic mean and not each component: a component near 0.1 (real-author ROUGE-L of a small model:
    0.107 for a model fine-tuned without the forget set against the target's 0.122, over 100 questions) moves by
    more than 10% by noise, so a per-component bar fails the very model unlearning aims at. In the side's
    harmonic mean ``n / sum_i 1/v_i`` (TOFU's model utility is the same mean over all nine) that component's 12%
    drop moves the general side by about 5%, while a side that collapses (one component near 0, or every one
    down by more than 10%) still fails.
    """
    def kept(value: Any, reference: Any) -> bool:
        return value is not None and reference is not None and value >= keep * reference

    sides, target_sides = side_utilities(row), side_utilities(target)
    retain = kept(sides["retain"], target_sides["retain"])
    general = kept(sides["general"], target_sides["general"])
    return {"single": kept(row.get("model_utility"), target.get("model_utility")), "retain": retain,
            "general": general, "split": retain and general}


def choose_setting(grid_rows: Sequence[dict[str, Any]], target_utility: float,
                   target_row: dict[str, Any] | None = None, bar: str = "single") -> int | None:
    """Index of the chosen grid row: highest forget quality among the rows that pass the utility bar.

    ``bar="single"``: model utility >= 90% of the target's (``target_utility``); ``bar="split"``: the retain side
    and the general side each (see :func:`utility_bar`, which needs ``target_row``). Rows that failed are skipped;
    when no row passes, the highest-utility row.
    """
    if bar not in ("single", "split"):
        raise ValueError(f"bar must be 'single' or 'split', got {bar!r}.")
    if bar == "split" and target_row is None:
        raise ValueError("The split utility bar compares components with the target's: pass target_row.")
    ok = [i for i, r in enumerate(grid_rows) if r.get("error") is None]
    if not ok:
        return None
    if bar == "split":
        keep = [i for i in ok if utility_bar(grid_rows[i], target_row)["split"]]
    else:
        keep = [i for i in ok if (grid_rows[i]["model_utility"] or 0) >= UTILITY_KEEP * target_utility]
    if keep:
        return max(keep, key=lambda i: (grid_rows[i]["forget_quality"] or 0, grid_rows[i]["model_utility"]))
    return max(ok, key=lambda i: grid_rows[i]["model_utility"] or 0)


def _row_from_report(report: dict[str, Any]) -> dict[str, Any]:
    """Every figure the evaluator defines (:data:`~hf_unlearn.evaluation.report.METRIC_DEFINITIONS`: forget quality,
    model utility, MU-ROUGE, ROUGE-L, truth ratios, extraction strength, exact memorization, MIA AUCs, privleak),
    ``None`` where the report lacks it."""
    from ..evaluation.report import METRIC_DEFINITIONS

    row = {k: report.get(k) for k in METRIC_DEFINITIONS}
    row["components"] = dict(report["components"]) if report.get("components") else None
    return row


def run_one(
    method: str,
    settings: dict[str, Any],
    target_path: str | os.PathLike,
    tokenizer: Any,
    forget_rows: list[dict[str, Any]],
    retain_rows: list[dict[str, Any]],
    reference: dict[str, Any],
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
    through :func:`~hf_unlearn.selection.run_with_selection` (GROM's path, T3's calibration, MASC's rule with the
    criterion recorded beside it, best-checkpoint selection every ``selection_steps`` steps for the other trainers);
    the row's ``selected`` says which candidate was chosen and why, and ``seconds`` includes the selection.

    With a ``reporter`` (:class:`~hf_unlearn.bench.console.PhaseReporter`) one console line per phase is
    printed; with ``log_path`` the Trainer's per-step logs and any failure's traceback go to that JSON Lines
    file (``verbose`` also prints the logs). A failure is recorded in the row (``error``, ``failed_phase``).
    """
    from transformers import AutoModelForCausalLM

    from ..evaluation import evaluate_tofu
    from ..logprobs import mean_answer_nll
    from .console import PhaseReporter, log_event, log_exception
    from .measure import PeakMemory, generation_speed
    from .registry import JsonlLogCallback, run_method

    row: dict[str, Any] = {"method": method, "settings": settings, "error": None}
    say = reporter or PhaseReporter(enabled=False)
    label = label or method
    callbacks = [JsonlLogCallback(log_path, echo=verbose)] if log_path is not None else []
    log_event(log_path, "start", method=method, label=label, settings=settings)
    work = Path(work_dir or tempfile.mkdtemp(prefix=f"hf_unlearn_{method}_"))
    phase = "training"
    try:
        say.start(label, phase)
        model = AutoModelForCausalLM.from_pretrained(target_path)
        with PeakMemory() as mem:
            if criterion is None:
                result = run_method(method, model, tokenizer, forget_rows, retain_rows, work, settings,
                                    callbacks=callbacks, quiet=reporter is not None)
            else:
                from ..selection import run_with_selection
                from .registry import Unlearned

                result = run_with_selection(run_method, Unlearned, method, model, tokenizer, forget_rows, retain_rows,
                                            work, settings, criterion, selection_steps=selection_steps,
                                            callbacks=callbacks, quiet=reporter is not None)
                row["selected"] = selected_summary(result.info.get("selection"))
        say.done(f"{result.info['global_step']} steps" if result.info.get("global_step") else "")
        phase = "evaluation"
        say.start(label, phase)
        report = evaluate_tofu(
            result.model, tokenizer, source=source, forget_split=forget_split, retain_reference=reference,
            scorer=result.scorer, generation_kwargs=result.generation_kwargs, progress=False, **eval_kwargs,
        )
        row.update(_row_from_report(report))
        row["forget_quality_interval"] = forget_quality_interval_of(report, reference)
        row.update(_interval_columns(row["forget_quality_interval"]))
        row.update(
            seconds=result.seconds, peak_rss_mb=mem.peak_mb, peak_added_mb=mem.added_mb, peak_gpu_mb=mem.peak_gpu_mb,
            trainable_share=result.trainable_share, steps=result.info.get("global_step"),
            info={k: v for k, v in result.info.items() if _jsonable(v)},
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


def forget_quality_interval_of(report: dict[str, Any], reference: dict[str, Any]) -> dict[str, float] | None:
    """The bootstrap 95% interval of a report's forget quality against the retain reference's truth ratios
    (:func:`hf_unlearn.evaluation.metrics.forget_quality_interval`, resampling forget rows); ``None`` when either
    side lacks its per-question truth ratios or they are not paired (different lengths)."""
    from ..evaluation.metrics import forget_quality_interval

    mine, theirs = report.get("forget_truth_ratios"), (reference or {}).get("forget_truth_ratios")
    if not mine or not theirs or len(mine) != len(theirs):
        return None
    return forget_quality_interval(mine, theirs)


def _interval_columns(interval: dict[str, float] | None) -> dict[str, float | None]:
    return {"forget_quality_low": (interval or {}).get("forget_quality_low"),
            "forget_quality_high": (interval or {}).get("forget_quality_high")}


def selected_summary(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a row shows of a selection record: the chosen candidate, how many were measured, why it was chosen,
    the fallback warning (if any) and the criterion's figures at the chosen candidate."""
    if not record:
        return None
    index = record.get("index")
    measured = record.get("measurements") or []
    chosen = measured[index] if isinstance(index, int) and 0 <= index < len(measured) else {}
    return {
        "candidate": record.get("chosen"), "index": index, "num_candidates": len(measured),
        "reason": record.get("reason"), "warning": record.get("warning"),
        "criterion": {k: chosen.get(k) for k in ("shift_gap", "forget_holdout_pvalue", "forget_holdout_ks_pvalue",
                                                 "forget_holdout_ks", "mia_auc", "retain_change", "forget_nll",
                                                 "holdout_nll")},
    }


def copy_extra_metrics(row: dict[str, Any], metrics: dict[str, Any]) -> None:
    """Copy a method's own metrics (``Unlearned.metrics``) into its row; their names go to ``row["extra_metrics"]``.

    A metric may not replace one of the runner's own columns.
    """
    clash = sorted(set(metrics) & set(row))
    if clash:
        raise ValueError(f"The method's metrics {clash} clash with the runner's row keys.")
    row.update(metrics)
    row["extra_metrics"] = list(metrics)


def nf4_check(row: dict[str, Any], result: Any, report: dict[str, Any], tokenizer: Any, source: str,
              forget_split: str, eval_kwargs: dict[str, Any]) -> None:
    """Fill ``row["forget_rouge_l_nf4"]`` for a method that changed weights (merge, quantize, regenerate)."""
    if result.weights_changed:
        n = report["splits"]["forget"]["num_examples"]
        rows = _forget_eval_rows(source, forget_split, n)
        row["forget_rouge_l_nf4"] = nf4_forget_rouge(result.model, tokenizer, rows, eval_kwargs)


def attack_check(row: dict[str, Any], model: Any, tokenizer: Any, forget_rows: list[dict[str, Any]],
                 retain_rows: list[dict[str, Any]], original: Any, attacks: Any, eval_kwargs: dict[str, Any],
                 head: Any = None) -> None:
    """Run ``attacks`` (:func:`hf_unlearn.evaluation.attacks.run_attacks`) on ``model`` (a T3 base with its
    ``head`` kept) against ``original`` (the target); fill the row's attack columns and ``row["attacks"]``."""
    from ..evaluation.attacks import attack_summary, run_attacks

    common = {"original": original, "head": head, "progress": False,
              "batch_size": eval_kwargs.get("batch_size", 16)}
    for key in ("template", "max_new_tokens"):
        if key in eval_kwargs:
            common[key] = eval_kwargs[key]
    section = run_attacks(model, tokenizer, forget_rows, retain_rows, attacks, **common)
    row.update(attack_summary(section))
    row["attacks"] = section


def _t3_head(result: Any) -> Any:
    """The T3 head of a decoding-time result (its base is attacked with the head kept); ``None`` for weight edits.
    Another custom scorer cannot be rebuilt on an attacked copy and is refused."""
    if result.scorer is None:
        return None
    from ..methods.t3 import T3Classifier

    if not isinstance(result.artifact, T3Classifier):
        raise ValueError(f"The attacks cannot rescore method {result.method!r}: its scorer is not a T3 head's.")
    return result.artifact


def _forget_eval_rows(source: str, forget_split: str, n: int) -> list[dict[str, Any]]:
    from ..data import load_tofu_rows

    return load_tofu_rows(f"{forget_split}_perturbed", source)[:n]


def forget_rows_with_other_answers(forget_split: str, source: str) -> list[dict[str, Any]]:
    """The rows of TOFU config ``forget_split`` from ``source``, each with the other answers TOFU keeps for it in
    ``<forget_split>_perturbed`` (``paraphrased_answer``, ``perturbed_answer``) when that config holds the same
    question/answer rows in the same order; else the plain rows. A method whose config names such a column as an
    answer to train towards reads it; every other method reads only ``question`` and ``answer``."""
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


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


def reference_rows(pair: Any, source: str, forget_split: str, eval_kwargs: dict[str, Any]) -> tuple[dict, dict]:
    """Evaluate the target and the retain reference; returns (target report, retain report)."""
    from ..evaluation import evaluate_tofu
    from ..evaluation.metrics import forget_quality
    from .subjects import load_tiny

    retain_model, tokenizer = load_tiny(pair.retain)
    retain_report = evaluate_tofu(retain_model, tokenizer, source=source, forget_split=forget_split, progress=False, **eval_kwargs)
    # The retain reference against itself (the protocol's sanity check: forget quality 1.0).
    self_fq = forget_quality(retain_report["forget_truth_ratios"], retain_report["forget_truth_ratios"])
    retain_report["forget_quality"] = float(self_fq["forget_quality"])
    retain_report["ks_statistic"] = float(self_fq["ks_statistic"])
    target_model, _ = load_tiny(pair.target)
    target_report = evaluate_tofu(
        target_model, tokenizer, source=source, forget_split=forget_split, retain_reference=retain_report,
        progress=False, **eval_kwargs,
    )
    return target_report, retain_report


GATE_ROUGE_MIN = 0.8
GATE_FQ_MAX = 1e-3


def sanity_gate(target_report: dict[str, Any], retain_report: dict[str, Any]) -> dict[str, Any]:
    """TOFU-tiny's sanity gate: the protocol is meaningful only if all checks pass.

    target forget ROUGE-L recall >= 0.8 (it memorized the forget set); forget quality of the
    target against the retain reference < 1e-3 (they are clearly distinguishable); the retain
    reference against itself = 1.0; model utility of both reported.
    """
    checks = {
        "target_forget_rouge_l": (target_report["forget_rouge_l"], target_report["forget_rouge_l"] >= GATE_ROUGE_MIN),
        "target_forget_quality": (target_report["forget_quality"], (target_report["forget_quality"] or 1.0) < GATE_FQ_MAX),
        "retain_self_forget_quality": (retain_report["forget_quality"], retain_report["forget_quality"] == 1.0),
    }
    return {
        "passed": all(ok for _, ok in checks.values()),
        "checks": {k: {"value": v, "passed": ok} for k, (v, ok) in checks.items()},
        "thresholds": {"forget_rouge_l_min": GATE_ROUGE_MIN, "forget_quality_max": GATE_FQ_MAX},
        "target_model_utility": target_report["model_utility"],
        "retain_model_utility": retain_report["model_utility"],
    }


def format_gate(gate: dict[str, Any]) -> str:
    """The sanity gate as printable lines."""
    lines = [f"{gate.get('title', 'TOFU-tiny sanity gate')}: {'PASSED' if gate['passed'] else 'FAILED'}"]
    for name, check in gate["checks"].items():
        lines.append(f"  {name:28s} {check['value']!s:>24}  {'ok' if check['passed'] else 'FAIL'}")
    base = f", base {gate['base_model_utility']:.3f}" if gate.get("base_model_utility") is not None else ""
    lines.append(f"  model utility: target {gate['target_model_utility']:.3f}, retain reference {gate['retain_model_utility']:.3f}{base}")
    return "\n".join(lines)


def run_comparison(
    pair: Any,
    methods: Sequence[str],
    *,
    grid: bool,
    source: str,
    forget_split: str,
    eval_kwargs: dict[str, Any] | None = None,
    quantization_check: bool = True,
    progress: bool = True,
    subject: str | os.PathLike | None = None,
    log_dir: str | os.PathLike | None = None,
    verbose: bool = False,
    references: tuple[dict[str, Any], dict[str, Any]] | None = None,
    partial_path: str | os.PathLike | None = None,
    bar: str = "single",
    resume: bool = False,
    attacks: Any = None,
    selection_rows: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = None,
    selection_steps: int = 8,
) -> dict[str, Any]:
    """Run ``methods`` (their demo setting, or their whole grid when ``grid``) on ``pair.target``.

    The settings are those of the benchmark ``subject`` (a name in ``benchmarks/configs`` or a path to
    a TOML file; default: the registered methods' settings, TOFU-tiny's).

    With ``progress``, one console line per method and phase (training, evaluation, NF4 re-check); the
    Trainer's per-step logs go to ``<log_dir>/<method>.jsonl`` (also printed with ``verbose``).

    ``references``: the (target, retain reference) TOFU reports when they were already evaluated with
    the same ``eval_kwargs`` (the TOFU-small gate's); otherwise both models are evaluated here.
    ``resume``: with ``partial_path``, rows that a previous run of the same comparison (same pair, data, evaluation
    settings and references) finished without error are taken from that file instead of being run again; a
    partial file of another comparison is refused.
    ``bar``: how a method's setting is chosen, ``"single"`` (model utility >= 90% of the target's) or
    ``"split"`` (the retain side and the general side each; see :func:`utility_bar`).
    ``partial_path``: after each method's row, the rows so far are written there (atomically), so that a long
    run stopped midway keeps what it measured.
    ``attacks``: the quantization and relearning attacks to run (``"quant,relearn"``, a list, or names to options;
    :mod:`hf_unlearn.evaluation.attacks`) on the target and the retain reference (the anchors) and on each method's
    chosen setting, each against the target as the model before unlearning; their figures fill the attack columns.
    ``selection_rows``: ``(holdout, retain_validation)`` rows; each method then picks its own strength with the
    reference-free criterion built from them and the forget rows (see :func:`run_one`; trainers are measured every
    ``selection_steps`` steps; the criterion's author groups and the pair's pretrained base as its reference model
    come from :func:`selection_criterion_options`), the target and the retain reference are measured by the same
    criterion, and the
    results hold ``criterion_vs_forget_quality``, the Spearman rank correlation of the criterion's p-value with
    TOFU's forget quality over every measured row.

    Returns ``{"rows": {name: row}, "grid": {name: [rows]}, "target": row, "retain_reference": row}``
    where each row holds the benchmark columns.
    """
    from .console import PhaseReporter

    say = PhaseReporter(enabled=progress, inline=not verbose)
    from transformers import AutoTokenizer

    from ..data import RETAIN_FOR_FORGET, load_tofu_rows
    from ..logprobs import mean_answer_nll
    from .registry import METHODS, load_subject_presets
    from .subjects import load_tiny

    eval_kwargs = dict(eval_kwargs or {})
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"Unknown method(s) {unknown}; registered: {sorted(METHODS)}.")
    if quantization_check and importlib.util.find_spec("bitsandbytes") is None:
        raise ValueError("The 4-bit NF4 re-check needs bitsandbytes: pip install 'hf-unlearn[quantization]', or "
                         "skip the check (--no-quantization).")
    if subject is None:
        presets = {m: {"demo": METHODS[m].demo, "grid": METHODS[m].grid} for m in methods}
    else:
        presets = load_subject_presets(subject)
        missing = [m for m in methods if m not in presets]
        if missing:
            raise ValueError(f"Benchmark subject {subject!r} has no settings for {missing}.")
    presets = {m: {"demo": resolve_auto_precision(p["demo"]), "grid": tuple(resolve_auto_precision(g) for g in p["grid"])}
               for m, p in presets.items()}
    tokenizer = AutoTokenizer.from_pretrained(pair.target)  # the weights are loaded per method
    forget_rows = forget_rows_with_other_answers(forget_split, source)
    retain_rows = load_tofu_rows(RETAIN_FOR_FORGET[forget_split], source)
    if references is None:
        say.start("references", "evaluation")
        target_report, retain_report = reference_rows(pair, source, forget_split, eval_kwargs)
        say.done("target and retain reference")
    else:
        target_report, retain_report = references
    reference = retain_report
    target_row = {"method": "target", **_row_from_report(target_report), "error": None,
                  "forget_quality_interval": forget_quality_interval_of(target_report, retain_report)}
    target_row.update(_interval_columns(target_row["forget_quality_interval"]))
    retain_row = {"method": "retain reference", **_row_from_report(retain_report), "error": None}
    target_model, _ = load_tiny(pair.target)
    target_row["forget_nll"] = mean_answer_nll(target_model, tokenizer, forget_rows)
    target_row["retain_nll"] = mean_answer_nll(target_model, tokenizer, retain_rows[: len(forget_rows)])
    if quantization_check:
        say.start("references", "NF4 re-check")
        n = target_report["splits"]["forget"]["num_examples"]
        target_row["forget_rouge_l_nf4"] = nf4_forget_rouge(target_model, tokenizer, _forget_eval_rows(source, forget_split, n), eval_kwargs)
        say.done("target")
    if attacks:
        from ..evaluation.attacks import check_attack_options, parse_attacks

        attacks = parse_attacks(attacks)
        check_attack_options(attacks)
        n = target_report["splits"]["forget"]["num_examples"]
        attack_rows = _forget_eval_rows(source, forget_split, n)
        say.start("references", "attacks")
        retain_model, _ = load_tiny(pair.retain)
        for anchor, anchor_model in ((target_row, target_model), (retain_row, retain_model)):
            attack_check(anchor, anchor_model, tokenizer, attack_rows, retain_rows, target_model, attacks, eval_kwargs)
        del retain_model
        say.done("target and retain reference")
    criteria: dict[str, Any] = {}
    selection_rule = None
    if selection_rows is not None:
        from ..selection import SelectionCriterion

        holdout_rows, validation_rows = selection_rows
        say.start("references", "selection criterion")
        target_model.eval()
        templates = {None, *((presets[m]["demo"] or {}).get("prompt_template") for m in methods)}
        options = selection_criterion_options(pair, forget_rows, holdout_rows, validation_rows, tokenizer, templates)
        measure = SelectionCriterion(forget_rows, holdout_rows, validation_rows, **options[None])
        selection_rule = measure.rule()
        target_row["criterion"] = measure.measure(target_model, tokenizer)
        retain_model, _ = load_tiny(pair.retain)
        retain_model.eval()
        retain_row["criterion"] = measure.measure(retain_model, tokenizer)
        del retain_model
        say.done(f"target p = {target_row['criterion']['forget_holdout_pvalue']:.3g}, retain reference p = "
                 f"{retain_row['criterion']['forget_holdout_pvalue']:.3g}")
        for m in methods:
            template = (presets[m]["demo"] or {}).get("prompt_template")
            criteria[m] = lambda template=template: SelectionCriterion(
                forget_rows, holdout_rows, validation_rows, template=template, **options[template],
                original={k: v for k, v in target_row["criterion"].items() if k.endswith("_nll")})
    del target_model
    # The floors: one plain forward pass over forget + retain, in this process (GROM's time; every method's
    # memory added on top of the loaded model)
    from .measure import PeakMemory, plain_forward_seconds

    target_model, _ = load_tiny(pair.target)
    target_model.eval()
    plain_forward_seconds(target_model, tokenizer, forget_rows[:32])  # warm-up
    with PeakMemory() as forward_mem:
        plain_forward = plain_forward_seconds(target_model, tokenizer, forget_rows + retain_rows)
    del target_model
    jobs = [(m, s) for m in methods for s in (presets[m]["grid"] if grid else (presets[m]["demo"],))]
    grids: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    run_key = comparison_key(pair, source, forget_split, eval_kwargs, target_row, retain_row, attacks,
                             selection_steps if selection_rows is not None else None, selection_rule)
    finished = finished_rows(partial_path, run_key) if resume and partial_path is not None else {}
    counts = {m: sum(1 for j, _ in jobs if j == m) for m in methods}
    for method, settings in jobs:
        label = method if counts[method] == 1 else f"{method} [{len(grids[method]) + 1}/{counts[method]}]"
        log_path = Path(log_dir) / f"{method}.jsonl" if log_dir is not None else None
        done = finished.get(_job_key(method, settings))
        if done is not None:
            grids[method].append(done)
            say.start(label, "training")
            say.done("finished earlier (from the partial results)")
            continue
        row = run_one(method, dict(settings), pair.target, tokenizer, forget_rows, retain_rows, reference,
                      source, forget_split, eval_kwargs, quantization_check=False,
                      reporter=say if progress else None, log_path=log_path, verbose=verbose, label=label,
                      criterion=criteria[method]() if method in criteria else None, selection_steps=selection_steps)
        grids[method].append(row)
        # The NF4 re-check is run for a row only when it is the method's chosen setting so far
        # (a later row may still replace it): the table needs it for the chosen row alone.
        result, report = row.pop("_result", None), row.pop("_report", None)
        now_chosen = choose_setting(grids[method], target_report["model_utility"], target_row,
                                    bar=bar) == len(grids[method]) - 1
        if quantization_check and result is not None and now_chosen and result.weights_changed:
            say.start(label, "NF4 re-check")
            try:
                nf4_check(row, result, report, tokenizer, source, forget_split, eval_kwargs)
                say.done()
            except Exception as err:  # the row's other numbers stand
                from .console import log_exception

                row["nf4_error"] = f"{type(err).__name__}: {err}"
                log_exception(log_path, "NF4 re-check", err)
                say.fail(err, log_path)
        if attacks and result is not None and now_chosen:
            say.start(label, "attacks")
            try:
                original, _ = load_tiny(pair.target)
                head = _t3_head(result)
                attack_check(row, result.model, tokenizer, attack_rows, retain_rows, original, attacks, eval_kwargs,
                             head=head)
                del original
                say.done()
            except Exception as err:  # the row's other numbers stand
                from .console import log_exception

                row["attack_error"] = f"{type(err).__name__}: {err}"
                log_exception(log_path, "attacks", err)
                say.fail(err, log_path)
        del result, report
        if partial_path is not None:
            from ..safe_output import atomic_write_json

            atomic_write_json(partial_path, {
                "run_key": run_key, "target": target_row, "retain_reference": retain_row,
                "grid": {m: [{k: v for k, v in r.items() if _jsonable(v)} for r in g] for m, g in grids.items()},
            })
    rows = {}
    for method, grid_rows in grids.items():
        idx = choose_setting(grid_rows, target_report["model_utility"], target_row, bar=bar)
        rows[method] = dict(grid_rows[idx if idx is not None else 0], chosen_index=idx)
    base = rows.get("grad_diff", {}).get("seconds")
    for row in [r for g in grids.values() for r in g] + list(rows.values()):
        row["time_vs_grad_diff"] = (row["seconds"] / base) if base and row.get("seconds") else None
        if row.get("method") == "grom" and plain_forward and row.get("seconds"):
            row["time_vs_forward"] = row["seconds"] / plain_forward
        if row.get("peak_added_mb") is not None and forward_mem.added_mb > 0:
            row["memory_vs_forward"] = row["peak_added_mb"] / forward_mem.added_mb
    correlation = criterion_correlation([target_row, retain_row, *rows.values()]) if selection_rows else None
    return {
        "criterion_vs_forget_quality": correlation,
        "target": target_row, "retain_reference": retain_row, "rows": rows, "grid": grids,
        "sanity_gate": sanity_gate(target_report, retain_report),
        "plain_forward_seconds": plain_forward,
        "plain_forward_added_mb": forward_mem.added_mb,
        "max_new_tokens": eval_kwargs.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS),
    }


def resolve_auto_precision(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` with ``bf16 = "auto"`` resolved: bf16 autocast (float32 master weights) when a bf16-capable
    CUDA device is present or the CPU computes bf16 natively (:func:`~hf_unlearn.bench.subjects.cpu_has_native_bf16`),
    float32 otherwise. Other values are left as they are."""
    if settings.get("bf16") != "auto":
        return dict(settings)
    from .subjects import bf16_is_native

    return {**settings, "bf16": bf16_is_native()}


def selection_criterion_options(
    pair: Any, forget_rows: list[dict[str, Any]], holdout_rows: list[dict[str, Any]],
    validation_rows: list[dict[str, Any]], tokenizer: Any, templates: set[str | None],
) -> dict[str | None, dict[str, Any]]:
    """The selection criterion's ``groups`` and ``reference_nll`` per prompt template, for a pair with a
    pretrained ``base`` (TOFU-small: real TOFU authors): ``groups="tofu_authors"`` when the forget and the holdout
    rows are whole authors (20 rows each, at least two a side), and the base's per-row NLLs on the forget and
    holdout rows, measured once per template, as the criterion's reference. A pair without a base (TOFU-tiny,
    trained from scratch on synthetic authors) gets neither."""
    from ..selection import TOFU_AUTHOR_ROWS, SelectionCriterion

    base = getattr(pair, "base", None)
    if base is None:
        return {t: {} for t in templates}
    whole = all(len(r) % TOFU_AUTHOR_ROWS == 0 and len(r) >= 2 * TOFU_AUTHOR_ROWS for r in (forget_rows, holdout_rows))
    groups = "tofu_authors" if whole else None
    options: dict[str | None, dict[str, Any]] = {t: {"groups": groups} for t in templates}
    from .subjects import load_tiny

    model, _ = load_tiny(base)
    for template in templates:
        options[template]["reference_nll"] = SelectionCriterion(
            forget_rows, holdout_rows, validation_rows, template=template, groups=groups,
            reference_model=model, reference_tokenizer=tokenizer).reference_nll
    del model
    return options


def criterion_p_value(row: dict[str, Any]) -> float | None:
    """The reference-free criterion's forget-vs-holdout KS p-value of a row: the selected candidate's, or the
    anchor's own measurement."""
    figures = (row.get("selected") or {}).get("criterion") or row.get("criterion") or {}
    value = figures.get("forget_holdout_pvalue")
    return float(value) if isinstance(value, (int, float)) else None


def criterion_correlation(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Spearman's rank correlation between the criterion's p-value (:func:`criterion_p_value`) and TOFU's forget
    quality over the rows that have both (and no error): ``{"spearman", "n", "rows"}``, ``spearman`` None with
    fewer than 3 rows or a constant column."""
    pairs = [(r["method"], criterion_p_value(r), r.get("forget_quality")) for r in rows
             if r.get("error") is None and criterion_p_value(r) is not None
             and isinstance(r.get("forget_quality"), (int, float))]
    rho = None
    if len(pairs) >= 3 and len({p for _, p, _ in pairs}) > 1 and len({q for _, _, q in pairs}) > 1:
        from scipy.stats import spearmanr

        rho = float(spearmanr([p for _, p, _ in pairs], [q for _, _, q in pairs]).statistic)
    return {"spearman": rho, "n": len(pairs),
            "rows": [{"method": m, "criterion_pvalue": p, "forget_quality": q} for m, p, q in pairs]}


def _job_key(method: str, settings: dict[str, Any]) -> str:
    return json.dumps([method, settings], sort_keys=True, default=str)


def comparison_key(pair: Any, source: str, forget_split: str, eval_kwargs: dict[str, Any],
                   target_row: dict[str, Any], retain_row: dict[str, Any], attacks: Any = None,
                   selection_steps: int | None = None, selection_rule: dict[str, Any] | None = None) -> str:
    """What a comparison's rows depend on besides the method and its settings: the pair, the data, the evaluation
    settings, the attacks run on each chosen row, the references' figures and, with selection, the criterion's rule
    (so rows selected under another rule are not resumed into this comparison) (SHA-256, 16 hex digits)."""
    import hashlib

    payload = json.dumps({"target": str(pair.target), "retain": str(pair.retain), "source": str(source),
                          "forget_split": forget_split, "eval_kwargs": eval_kwargs, "attacks": attacks or None,
                          "selection_steps": selection_steps, "selection_rule": selection_rule,
                          "references": [target_row.get("forget_quality"), target_row.get("model_utility"),
                                         retain_row.get("model_utility")]}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def finished_rows(partial_path: str | os.PathLike, run_key: str) -> dict[str, dict[str, Any]]:
    """The rows of ``partial_path`` finished without error, by method and settings; ``{}`` when the file does not
    exist. A file written by a different comparison (another ``run_key``) is refused rather than mixed in."""
    path = Path(partial_path)
    if not path.is_file():
        return {}
    saved = json.loads(path.read_text(encoding="utf-8"))
    if saved.get("run_key") != run_key:
        raise ValueError(
            f"{path} holds the rows of another comparison (other pair, data, evaluation settings or references); "
            "remove it or resume the comparison that wrote it."
        )
    return {_job_key(r["method"], r.get("settings", {})): r for rows in saved.get("grid", {}).values()
            for r in rows if r.get("error") is None}


def run_subject_bench(
    subject: str,
    methods: Sequence[str],
    *,
    source: str,
    output_dir: str | os.PathLike = "benchmarks/results",
    cache_dir: str | os.PathLike | None = None,
    build_only: bool = False,
    grid: bool = False,
    eval_kwargs: dict[str, Any] | None = None,
    quantization_check: bool = True,
    progress: bool = True,
    verbose: bool = False,
    resume: bool = False,
    bar: str = "single",
    attacks: Any = None,
    layout: str = "v2",
    select: bool = False,
    selection_steps: int = 8,
) -> tuple[dict[str, Any], dict[str, Path] | None]:
    """``hf-unlearn bench --subject NAME``: TOFU-small on a pretrained subject (``"smollm2-135m"``).

    Builds (or reuses) the subject's TOFU-small pair (:func:`~hf_unlearn.bench.subjects.build_small_pair`)
    and its sanity gate (:func:`~hf_unlearn.bench.subjects.small_gate`); with ``build_only`` stops
    there. Otherwise runs ``methods`` with the subject's presets (``benchmarks/configs/<subject>.toml``,
    one setting per method unless ``grid``) and writes ``<output_dir>/<subject>_tofu.{json,md,png}``
    with the recipe, the gate's figures and the subject's provenance. Returns ``(results or gate, paths)``.
    ``resume`` takes the rows an interrupted run of the same comparison finished from
    ``<output_dir>/<subject>_tofu.partial.json``; ``bar`` is the utility bar settings are chosen by
    (see :func:`run_comparison`). ``attacks`` as in :func:`run_comparison`; the relearning attack's learning
    rate defaults to the one the target was fine-tuned with (the recipe's).
    ``layout``: ``"v2"`` (:meth:`~hf_unlearn.bench.subjects.SmallRecipe.v2`; presets from
    ``benchmarks/configs/<subject>-v2.toml``, results ``<subject>_tofu_v2.*``) or ``"v1"``. ``select`` (v2 only):
    every method picks its strength with the reference-free criterion on the pair's forget, ``holdout10`` and
    ``retain_validation`` rows (see :func:`run_comparison`).
    """
    from ..evaluation.attacks import parse_attacks
    from .report import write_results
    from .subjects import SmallRecipe, build_small_pair, gate_reports, small_gate, small_recipe_for

    attacks = parse_attacks(attacks)
    if layout not in ("v1", "v2"):
        raise ValueError(f"layout must be 'v1' or 'v2', got {layout!r}.")
    recipe = SmallRecipe.v2(subject) if layout == "v2" else small_recipe_for(subject)
    name = f"{subject}_tofu_v2" if layout == "v2" else f"{subject}_tofu"
    if select and layout != "v2":
        raise ValueError("Selection needs the holdout and retain-validation authors of the v2 layout (layout='v2').")
    from .registry import configs_dir

    presets = f"{subject}-v2" if layout == "v2" and (configs_dir() / f"{subject}-v2.toml").is_file() else subject

    eval_kwargs = dict(eval_kwargs or {})
    pair = build_small_pair(subject, source, recipe=recipe, cache_dir=cache_dir, progress=progress)
    gate = small_gate(pair, eval_kwargs, progress=progress)
    if build_only:
        return gate, None
    out = Path(output_dir)
    if "relearn" in attacks and pair.recipe.get("learning_rate"):
        attacks["relearn"].setdefault("learning_rate", float(pair.recipe["learning_rate"]))
    selection_rows = None
    if select:
        from ..data import HOLDOUT_FOR_FORGET, load_tofu_rows
        from .subjects import small_retain_validation_rows

        selection_rows = (load_tofu_rows(HOLDOUT_FOR_FORGET[pair.forget_split], pair.source),
                          small_retain_validation_rows(pair.source))
    results = run_comparison(
        pair, methods, grid=grid, source=pair.source, forget_split=pair.forget_split, eval_kwargs=eval_kwargs,
        quantization_check=quantization_check, progress=progress, subject=presets,
        selection_rows=selection_rows, selection_steps=selection_steps,
        log_dir=out / "logs" / subject, verbose=verbose, references=gate_reports(pair, eval_kwargs),
        partial_path=out / f"{name}.partial.json", resume=resume, bar=bar, attacks=attacks,
    )
    results["sanity_gate"] = gate
    meta = {
        "subject": pair.subject, "benchmark": "TOFU-small", "source": source, "tofu_small_source": pair.source,
        "forget_split": pair.forget_split, "recipe": pair.recipe, "mode": "bench", "presets": presets,
        "target": str(pair.target), "retain_reference_model": str(pair.retain), "base_model": str(pair.base),
        "seed": pair.recipe.get("seed", 0), "eval_kwargs": eval_kwargs, "attacks": attacks, "layout": layout,
        "bar": bar, "select": select, "selection_steps": selection_steps if select else None,
    }
    return results, write_results(results, out, name, meta)
