"""Every method side by side on one target model, scored by one evaluator (`demo` and `bench`).

For each method and each setting of its grid, a fresh copy of the target is unlearned, timed
(wall seconds, peak memory: :class:`~unlearn_bench.measure.PeakMemory`), evaluated with
:func:`hf_unlearn.evaluation.evaluate_tofu` against the retain reference. The chosen setting of a
method is the one with the highest forget quality among those keeping model utility >= 90% of
the target's (the highest-utility setting when none does); for methods that change weights it is
re-checked after 4-bit NF4 quantization (forget ROUGE-L). GROM's wall time is also given against
one plain forward pass over forget + retain, and decoding-time methods (T3) report greedy
``generate`` tokens per second against plain ``generate``, both measured in the same process.
Every row also records the mean answer NLL on the forget rows and on as many retain rows, the
optimizer steps, and any extra metric the method reported in ``Unlearned.metrics`` (ATWU's token
AUROC). A failure in one method is recorded in its row and the others still run.

The settings come from the benchmark subject's TOML file (:func:`~unlearn_bench.registry.load_subject_presets`);
the tables, plot and result files are :mod:`unlearn_bench.report`'s. :func:`run_comparison` and
:func:`run_subject_bench` are here as their named steps; one method's row is :mod:`.rows`' (:func:`~.rows.run_one`),
the utility bar and the chosen setting :mod:`.bar`'s, the anchors and the sanity gate :mod:`hf_unlearn.demo`'s, resuming
from partial results :mod:`.resume`'s and the selection criterion's part :mod:`.criterion`'s.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hf_unlearn.demo import forget_rows_with_other_answers, reference_rows, sanity_gate
from hf_unlearn.evaluation.generation import DEFAULT_MAX_NEW_TOKENS
from hf_unlearn.jsonutil import is_jsonable
from hf_unlearn.run import nf4_forget_rouge

from .bar import choose_setting
from .criterion import criterion_correlation, selection_criterion_options
from .resume import _job_key, comparison_key, finished_rows, rows_digest
from .rows import (
    _decoding_artifact,
    _forget_eval_rows,
    _interval_columns,
    _row_from_report,
    attack_check,
    forget_quality_interval_of,
    nf4_check,
    run_one,
)
from .timing import FORWARD_TIMED, TIME_BASELINE


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
    ``resume``: with ``partial_path``, rows that a previous run of the same comparison (the same models by
    content, wherever their folders lie, and the same data, evaluation settings and references) finished without
    error are taken from that file instead of being run again; a partial file of another comparison is refused.
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
    from transformers import AutoTokenizer

    from hf_unlearn.console import PhaseReporter
    from hf_unlearn.data import RETAIN_FOR_FORGET, load_tofu_rows

    say = PhaseReporter(enabled=progress, inline=not verbose)
    eval_kwargs = dict(eval_kwargs or {})
    presets = _comparison_presets(methods, quantization_check, subject)
    tokenizer = AutoTokenizer.from_pretrained(pair.target, trust_remote_code=False)  # the weights are loaded per method
    c = _Comparison(pair, tokenizer, forget_rows_with_other_answers(forget_split, source),
                    load_tofu_rows(RETAIN_FOR_FORGET[forget_split], source), source, forget_split, eval_kwargs, say)
    target_report, retain_report = _references(c, references)
    target_row, retain_row, target_model = _anchor_rows(c, target_report, retain_report, quantization_check)
    attack_rows = None
    if attacks:
        attacks, attack_rows = _attack_anchors(c, target_report, target_row, retain_row, target_model, attacks)
    criteria: dict[str, Any] = {}
    selection_rule = None
    if selection_rows is not None:
        criteria, selection_rule = _selection_criteria(c, methods, presets, selection_rows, target_model,
                                                       target_row, retain_row)
    del target_model
    plain_forward, forward_mem = _forward_floor(c)
    jobs = [(m, s) for m in methods for s in (presets[m]["grid"] if grid else (presets[m]["demo"],))]
    run_key = comparison_key(pair, rows_digest(c.forget_rows, c.retain_rows), forget_split, eval_kwargs, target_row,
                             retain_row, attacks, selection_steps if selection_rows is not None else None,
                             selection_rule)
    finished = finished_rows(partial_path, run_key) if resume and partial_path is not None else {}
    anchors = {"target_report": target_report, "target": target_row, "retain_reference": retain_row}
    grids = _run_jobs(c, methods, jobs, retain_report, anchors, finished=finished, criteria=criteria,
                      selection_steps=selection_steps, quantization_check=quantization_check, attacks=attacks,
                      attack_rows=attack_rows, bar=bar, progress=progress, verbose=verbose, log_dir=log_dir,
                      partial_path=partial_path, run_key=run_key)
    rows = {}
    for method, grid_rows in grids.items():
        idx = choose_setting(grid_rows, target_report.model_utility, target_row, bar=bar)
        rows[method] = dict(grid_rows[idx if idx is not None else 0], chosen_index=idx)
    _relative_costs(grids, rows, plain_forward, forward_mem)
    correlation = criterion_correlation([target_row, retain_row, *rows.values()]) if selection_rows else None
    return {
        "criterion_vs_forget_quality": correlation, "selection_rule": selection_rule,
        "target": target_row, "retain_reference": retain_row, "rows": rows, "grid": grids,
        "sanity_gate": sanity_gate(target_report, retain_report),
        "plain_forward_seconds": plain_forward,
        "plain_forward_added_mb": forward_mem.added_mb,
        "max_new_tokens": eval_kwargs.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS),
    }


@dataclass(frozen=True)
class _Comparison:
    """What every step of :func:`run_comparison` shares: the pair, its tokenizer, the forget and retain rows, the
    data and evaluation settings, and the console reporter."""

    pair: Any
    tokenizer: Any
    forget_rows: list[dict[str, Any]]
    retain_rows: list[dict[str, Any]]
    source: str
    forget_split: str
    eval_kwargs: dict[str, Any]
    say: Any


def _comparison_presets(methods: Sequence[str], quantization_check: bool, subject: str | os.PathLike | None
                        ) -> dict[str, dict[str, Any]]:
    """Each method's ``{"demo", "grid"}`` settings, from its registered presets (a method without presets: its
    config's defaults) or the ``subject``'s file, with ``bf16 = "auto"`` resolved (:func:`resolve_auto_precision`);
    an unknown method, a method the subject has no settings for, and the NF4 re-check without bitsandbytes are
    refused."""
    from .registry import load_subject_presets, method_presets

    method_preset = {m: method_presets(m) for m in methods}  # a method without presets runs its config's defaults
    if quantization_check and importlib.util.find_spec("bitsandbytes") is None:
        raise ValueError("The 4-bit NF4 re-check needs bitsandbytes: pip install 'hf-unlearn[quantization]', or "
                         "skip the check (--no-quantization).")
    if subject is None:
        presets = {m: {"demo": p.demo, "grid": p.grid} for m, p in method_preset.items()}
    else:
        presets = load_subject_presets(subject)
        missing = [m for m in methods if m not in presets]
        if missing:
            raise ValueError(f"Benchmark subject {subject!r} has no settings for {missing}.")
    return {m: {"demo": resolve_auto_precision(p["demo"]), "grid": tuple(resolve_auto_precision(g) for g in p["grid"])}
            for m, p in presets.items()}


def _references(c: _Comparison, references: tuple[Any, Any] | None) -> tuple[Any, Any]:
    """The target's and the retain reference's TOFU reports: the given ones (read back from disk they come as
    dicts), else both evaluated here (:func:`~hf_unlearn.demo.reference_rows`)."""
    from hf_unlearn.evaluation.report import as_report

    if references is None:
        c.say.start("references", "evaluation")
        target_report, retain_report = reference_rows(c.pair, c.source, c.forget_split, c.eval_kwargs)
        c.say.done("target and retain reference")
    else:  # reports read back from disk come as dicts
        target_report, retain_report = as_report(references[0]), as_report(references[1])
    return target_report, retain_report


def _anchor_rows(c: _Comparison, target_report: Any, retain_report: Any, quantization_check: bool
                 ) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """The target's and the retain reference's rows (their figures, the target's forget-quality interval, answer
    NLLs and NF4 re-check), and the loaded target model."""
    from hf_unlearn.demo import load_tiny
    from hf_unlearn.logprobs import mean_answer_nll

    tokenizer, forget_rows, retain_rows = c.tokenizer, c.forget_rows, c.retain_rows
    target_row = {"method": "target", **_row_from_report(target_report), "error": None,
                  "forget_quality_interval": forget_quality_interval_of(target_report, retain_report)}
    target_row.update(_interval_columns(target_row["forget_quality_interval"]))
    retain_row = {"method": "retain reference", **_row_from_report(retain_report), "error": None}
    target_model, _ = load_tiny(c.pair.target, c.eval_kwargs.get("device"))
    target_row["forget_nll"] = mean_answer_nll(target_model, tokenizer, forget_rows)
    target_row["retain_nll"] = mean_answer_nll(target_model, tokenizer, retain_rows[: len(forget_rows)])
    if quantization_check:
        c.say.start("references", "NF4 re-check")
        n = target_report.splits["forget"]["num_examples"]
        target_row["forget_rouge_l_nf4"] = nf4_forget_rouge(target_model, tokenizer, _forget_eval_rows(c.source, c.forget_split, n), c.eval_kwargs)
        c.say.done("target")
    return target_row, retain_row, target_model


def _attack_anchors(c: _Comparison, target_report: Any, target_row: dict[str, Any], retain_row: dict[str, Any],
                    target_model: Any, attacks: Any) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Run the attacks on the anchors (the target and the retain reference, each against the target): the parsed
    attacks and the forget rows they attack."""
    from hf_unlearn.demo import load_tiny
    from hf_unlearn.evaluation.attacks import check_attack_options, parse_attacks

    attacks = parse_attacks(attacks)
    check_attack_options(attacks)
    n = target_report.splits["forget"]["num_examples"]
    attack_rows = _forget_eval_rows(c.source, c.forget_split, n)
    c.say.start("references", "attacks")
    retain_model, _ = load_tiny(c.pair.retain, c.eval_kwargs.get("device"))
    for anchor, anchor_model in ((target_row, target_model), (retain_row, retain_model)):
        attack_check(anchor, anchor_model, c.tokenizer, attack_rows, c.retain_rows, target_model, attacks, c.eval_kwargs)
    del retain_model
    c.say.done("target and retain reference")
    return attacks, attack_rows


def _selection_criteria(c: _Comparison, methods: Sequence[str], presets: dict[str, dict[str, Any]],
                        selection_rows: tuple[list[dict[str, Any]], list[dict[str, Any]]], target_model: Any,
                        target_row: dict[str, Any], retain_row: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The reference-free criterion measured on the anchors (into their rows' ``criterion``), and per method a
    factory of the criterion it selects its strength with (its own prompt template); also the criterion's rule."""
    from hf_unlearn.demo import load_tiny
    from hf_unlearn.selection import SelectionCriterion

    pair, forget_rows, tokenizer, say = c.pair, c.forget_rows, c.tokenizer, c.say
    criteria: dict[str, Any] = {}
    holdout_rows, validation_rows = selection_rows
    say.start("references", "selection criterion")
    target_model.eval()
    templates = {None, *((presets[m]["demo"] or {}).get("prompt_template") for m in methods)}
    options = selection_criterion_options(pair, forget_rows, holdout_rows, validation_rows, tokenizer, templates,
                                          device=c.eval_kwargs.get("device"))
    measure = SelectionCriterion(forget_rows, holdout_rows, validation_rows, **options[None])
    selection_rule = measure.rule()
    target_row["criterion"] = measure.measure(target_model, tokenizer)
    retain_model, _ = load_tiny(pair.retain, c.eval_kwargs.get("device"))
    retain_model.eval()
    retain_row["criterion"] = measure.measure(retain_model, tokenizer)
    del retain_model
    say.done(f"target equivalence p = {target_row['criterion']['equivalence_pvalue']:.3g}, retain reference "
             f"equivalence p = {retain_row['criterion']['equivalence_pvalue']:.3g}")
    for m in methods:
        template = (presets[m]["demo"] or {}).get("prompt_template")
        criteria[m] = lambda template=template: SelectionCriterion(
            forget_rows, holdout_rows, validation_rows, template=template, **options[template],
            original={k: v for k, v in target_row["criterion"].items() if k.endswith("_nll")})
    return criteria, selection_rule


def _forward_floor(c: _Comparison) -> tuple[float, Any]:
    """The floors: one plain forward pass over forget + retain, in this process (GROM's time; every method's
    memory added on top of the loaded model): its seconds and its :class:`~unlearn_bench.measure.PeakMemory`."""
    from hf_unlearn.demo import load_tiny

    from .measure import PeakMemory, plain_forward_seconds

    target_model, _ = load_tiny(c.pair.target, c.eval_kwargs.get("device"))
    target_model.eval()
    plain_forward_seconds(target_model, c.tokenizer, c.forget_rows[:32])  # warm-up
    with PeakMemory() as forward_mem:
        plain_forward = plain_forward_seconds(target_model, c.tokenizer, c.forget_rows + c.retain_rows)
    del target_model
    return plain_forward, forward_mem


def _run_jobs(c: _Comparison, methods: Sequence[str], jobs: list[tuple[str, Any]], reference: Any,
              anchors: dict[str, Any], *, finished: dict[str, dict[str, Any]], criteria: dict[str, Any],
              selection_steps: int, quantization_check: bool, attacks: Any, attack_rows: list[dict[str, Any]] | None,
              bar: str, progress: bool, verbose: bool, log_dir: str | os.PathLike | None,
              partial_path: str | os.PathLike | None, run_key: str) -> dict[str, list[dict[str, Any]]]:
    """Every method/setting job's row, by method (:func:`~unlearn_bench.rows.run_one`, or the row a previous
    run finished); a row that is its method's chosen setting so far also gets the NF4 re-check and the attacks,
    and after each row the rows so far are written to ``partial_path``."""
    say = c.say
    grids: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
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
        row = run_one(method, dict(settings), c.pair.target, c.tokenizer, c.forget_rows, c.retain_rows, reference,
                      c.source, c.forget_split, c.eval_kwargs, quantization_check=False,
                      reporter=say if progress else None, log_path=log_path, verbose=verbose, label=label,
                      criterion=criteria[method]() if method in criteria else None, selection_steps=selection_steps)
        grids[method].append(row)
        # The NF4 re-check is run for a row only when it is the method's chosen setting so far
        # (a later row may still replace it): the table needs it for the chosen row alone.
        result, report = row.pop("_result", None), row.pop("_report", None)
        now_chosen = choose_setting(grids[method], anchors["target_report"].model_utility, anchors["target"],
                                    bar=bar) == len(grids[method]) - 1
        if now_chosen and result is not None:
            _check_chosen(c, row, result, report, label, log_path, quantization_check, attacks, attack_rows)
        del result, report
        if partial_path is not None:
            from hf_unlearn.safe_output import atomic_write_json

            atomic_write_json(partial_path, {
                "run_key": run_key, "target": anchors["target"], "retain_reference": anchors["retain_reference"],
                "grid": {m: [{k: v for k, v in r.items() if is_jsonable(v)} for r in g] for m, g in grids.items()},
            })
    return grids


def _check_chosen(c: _Comparison, row: dict[str, Any], result: Any, report: Any, label: str,
                  log_path: Path | None, quantization_check: bool, attacks: Any,
                  attack_rows: list[dict[str, Any]] | None) -> None:
    """The checks of a method's chosen setting (so far): the NF4 re-check for a method that changed weights, and
    the attacks against the target. A failure of either is recorded in the row (``nf4_error``, ``attack_error``);
    the row's other numbers stand."""
    from hf_unlearn.console import log_exception
    from hf_unlearn.demo import load_tiny

    say = c.say
    if quantization_check and result.weights_changed:
        say.start(label, "NF4 re-check")
        try:
            nf4_check(row, result, report, c.tokenizer, c.source, c.forget_split, c.eval_kwargs)
            say.done()
        except Exception as err:  # the row's other numbers stand
            row["nf4_error"] = f"{type(err).__name__}: {err}"
            log_exception(log_path, "NF4 re-check", err)
            say.fail(err, log_path)
    if attacks:
        say.start(label, "attacks")
        try:
            original, _ = load_tiny(c.pair.target, c.eval_kwargs.get("device"))
            attack_check(row, result.model, c.tokenizer, attack_rows, c.retain_rows, original, attacks, c.eval_kwargs,
                         decoding=_decoding_artifact(result))
            del original
            say.done()
        except Exception as err:  # the row's other numbers stand
            row["attack_error"] = f"{type(err).__name__}: {err}"
            log_exception(log_path, "attacks", err)
            say.fail(err, log_path)


def _relative_costs(grids: dict[str, list[dict[str, Any]]], rows: dict[str, dict[str, Any]], plain_forward: float,
                    forward_mem: Any) -> None:
    """Every row's wall time against the timing baseline's and (for the forward-timed methods) against one plain
    forward pass, and its added memory against the forward pass's (:mod:`unlearn_bench.timing`)."""
    base = rows.get(TIME_BASELINE, {}).get("seconds")
    for row in [r for g in grids.values() for r in g] + list(rows.values()):
        row["time_vs_grad_diff"] = (row["seconds"] / base) if base and row.get("seconds") else None
        if row.get("method") in FORWARD_TIMED and plain_forward and row.get("seconds"):
            row["time_vs_forward"] = row["seconds"] / plain_forward
        if row.get("peak_added_mb") is not None and forward_mem.added_mb > 0:
            row["memory_vs_forward"] = row["peak_added_mb"] / forward_mem.added_mb


def resolve_auto_precision(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` with ``bf16 = "auto"`` resolved: bf16 autocast (float32 master weights) when a bf16-capable
    CUDA device is present or the CPU computes bf16 natively (:func:`~unlearn_bench.subjects.cpu_has_native_bf16`),
    float32 otherwise. Other values are left as they are."""
    if settings.get("bf16") != "auto":
        return dict(settings)
    from .subjects import bf16_is_native

    return {**settings, "bf16": bf16_is_native()}


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
    authors: str = "reported",
) -> tuple[dict[str, Any], dict[str, Path] | None]:
    """``unlearn-bench run --subject NAME``: TOFU-small on a pretrained subject (``"smollm2-135m"``).

    Builds (or reuses) the subject's TOFU-small pair (:func:`~unlearn_bench.subjects.build_small_pair`)
    and its sanity gate (:func:`~unlearn_bench.subjects.small_gate`); with ``build_only`` stops
    there. Otherwise runs ``methods`` with the subject's presets (``benchmarks/configs/<subject>.toml``,
    one setting per method unless ``grid``) and writes ``<output_dir>/<subject>_tofu.{json,md,png}``
    with the recipe, the gate's figures and the subject's provenance. Returns ``(results or gate, paths)``.
    ``resume`` takes the rows an interrupted run of the same comparison finished from
    ``<output_dir>/<subject>_tofu.partial.json``; ``bar`` is the utility bar settings are chosen by
    (see :func:`run_comparison`). ``attacks`` as in :func:`run_comparison`; the relearning attack's learning
    rate defaults to the one the target was fine-tuned with (the recipe's).
    ``layout``: ``"v2"`` (:meth:`~unlearn_bench.subjects.SmallRecipe.v2`; presets from
    ``benchmarks/configs/<subject>-v2.toml``, results ``<subject>_tofu_v2.*``) or ``"v1"``. ``select`` (v2 only):
    every method picks its strength with the reference-free criterion on the pair's forget, ``holdout10`` and
    ``retain_validation`` rows (see :func:`run_comparison`). ``eval_kwargs["device"]`` (``unlearn-bench run
    --device``) is where the pair is fine-tuned and every model is loaded, trained and evaluated. ``authors``:
    ``"reported"`` (forget10 authors 1-4, the published benchmark) or ``"tuning"`` (authors 5-8, the split that
    grids and defaults may be chosen on; results ``<name>_tuning.*``, the same retain reference).
    """
    from hf_unlearn.evaluation.attacks import parse_attacks

    from .report import write_results
    from .subjects import build_small_pair, gate_reports, small_gate

    attacks = parse_attacks(attacks)
    recipe, name, presets = _subject_layout(subject, layout, select, authors)
    eval_kwargs = dict(eval_kwargs or {})
    pair = build_small_pair(subject, source, recipe=recipe, cache_dir=cache_dir, progress=progress,
                            device=eval_kwargs.get("device"))
    gate = small_gate(pair, eval_kwargs, progress=progress)
    if build_only:
        return gate, None
    out = Path(output_dir)
    if "relearn" in attacks and pair.recipe.get("learning_rate"):
        attacks["relearn"].setdefault("learning_rate", float(pair.recipe["learning_rate"]))
    selection_rows = _subject_selection_rows(pair) if select else None
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
        "authors": FORGET_AUTHOR_SPLITS[authors],
    }
    return results, write_results(results, out, name, meta)


#: Which forget10 authors a TOFU-small run unlearns, by name. Authors 1-4 are reported; 5-8 may
#: choose grids and defaults; no other forget10 author is used, so that they stay free for independent checks.
FORGET_AUTHOR_SPLITS = {"reported": "forget10 authors 1-4", "tuning": "forget10 authors 5-8"}
_FORGET_OFFSETS = {"reported": 0, "tuning": 4}


def _subject_layout(subject: str, layout: str, select: bool, authors: str = "reported") -> tuple[Any, str, str]:
    """The subject's TOFU-small recipe, the results' name and the presets' subject for ``layout`` (``"v2"``:
    ``<subject>-v2.toml`` when it exists) and ``authors`` (:data:`FORGET_AUTHOR_SPLITS`; ``"tuning"`` adds
    ``_tuning`` to the name); a bad layout or author split and selection outside the v2 layout are refused."""
    from .subjects import SmallRecipe, small_recipe_for

    if layout not in ("v1", "v2"):
        raise ValueError(f"layout must be 'v1' or 'v2', got {layout!r}.")
    if authors not in FORGET_AUTHOR_SPLITS:
        raise ValueError(f"authors must be one of {sorted(FORGET_AUTHOR_SPLITS)}, got {authors!r}.")
    offset = _FORGET_OFFSETS[authors]
    recipe = (SmallRecipe.v2(subject, forget_offset=offset) if layout == "v2"
              else replace(small_recipe_for(subject), forget_offset=offset))
    name = (f"{subject}_tofu_v2" if layout == "v2" else f"{subject}_tofu") + ("_tuning" if offset else "")
    if select and layout != "v2":
        raise ValueError("Selection needs the holdout and retain-validation authors of the v2 layout (layout='v2').")
    from .registry import configs_dir

    presets = f"{subject}-v2" if layout == "v2" and (configs_dir() / f"{subject}-v2.toml").is_file() else subject
    return recipe, name, presets


def _subject_selection_rows(pair: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pair's selection rows: its forget split's ``holdoutNN`` rows and the retain-validation rows."""
    from hf_unlearn.data import HOLDOUT_FOR_FORGET, load_tofu_rows

    from .subjects import small_retain_validation_rows

    return (load_tofu_rows(HOLDOUT_FOR_FORGET[pair.forget_split], pair.source),
            small_retain_validation_rows(pair.source))
