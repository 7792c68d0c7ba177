"""Validation of the reference-free selection criterion against TOFU's forget quality on TOFU-tiny.

For each method with a cheap strength axis, the same candidates are scored twice:

* by :class:`hf_unlearn.selection.SelectionCriterion` (forget rows vs the never-seen ``holdout10`` rows,
  retain change on retain rows the method did not see), which needs no retain model;
* by :func:`hf_unlearn.evaluation.evaluate_tofu` against the retain reference's report (TOFU's forget quality
  and model utility), exactly as ``unlearn-bench run`` scores a row.

Candidates (ordered weak -> strong, as the rule expects):

* GROM: :func:`hf_unlearn.methods.grom.strength_path.fit_grom_path` from the TOFU-tiny demo setting (``scales`` x
  ``retain_weights``), measured with :meth:`~hf_unlearn.methods.grom.strength_path.GROMPath.select`;
* T3: one :func:`hf_unlearn.methods.t3.fit_t3` head (the demo setting) and :func:`hf_unlearn.methods.t3.calibration.calibrate_t3`
  over a ``(T, w)`` grid;
* trainers (NPO, GradDiff; ``NAME@LR`` at another learning rate): the demo setting's run with a :class:`hf_unlearn.selection.SelectionCallback`
  measuring every ``--selection-steps`` optimizer steps; the weights at each measured step are kept and
  evaluated with TOFU.

Per method the report gives the Spearman rank correlations (``scipy.stats.spearmanr``) with TOFU forget quality
over the candidates of the criterion's closeness ``-|shift_gap|``, of its p-value and of the row-level KS p-value
it replaced; the candidate the criterion's rule selects, and the one the replaced KS rule
(:func:`ks_rule_index`) would select from the same measurements, next to the best candidate by TOFU forget
quality among those keeping model utility >= 90% of the target's, with how far each choice is from it
(``log10(best FQ / chosen FQ)``); and the cost ratios ``fit_grom_path / fit_grom`` and ``calibrate_t3 / fit_t3`` measured in this process (median of three
calls each, after one warm-up fit). The retain validation rows are split off the retain rows as ``hf-unlearn unlearn --select`` does
(the last ``max(1, min(100, n // 10))``); the methods unlearn with the rest.

    python benchmarks/selection_validation.py --cache-dir .cache/tests \\
        --output benchmarks/results/tofu_tiny_selection.json
    python benchmarks/selection_validation.py --methods grom t3 --output runs/selection.json   # quicker
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

SOURCE = "synthetic"
FORGET_SPLIT = "forget10"
UTILITY_KEEP = 0.9
GROM_SCALES = (0.25, 0.5, 1.0, 2.0)
GROM_RETAIN_WEIGHTS = (1.0, 10.0, 100.0)
T3_TEMPERATURES = (1.0, 1.5, 2.0, 2.5)
T3_TILT_WEIGHTS = (0.3, 0.5, 1.0, 2.0)
CRITERION_KEYS = ("shift_gap", "shift_gap_se", "shift_gap_df", "equivalence_pvalue", "forget_holdout_pvalue",
                  "forget_holdout_ks_pvalue", "forget_holdout_ks", "mia_auc", "retain_change", "forget_nll", "holdout_nll", "seconds")
KS_LEVEL = 0.05
AUTHOR_ROWS = 10  # the synthetic set asks 10 questions per author


def ks_rule_index(measurements: list[dict[str, Any]], retain_tolerance: float = 0.1) -> int:
    """The rule the criterion replaced, for comparison on the same measurements: among candidates within the
    retain tolerance the largest row-level KS p-value (ties: weaker); below p = 0.05 the strongest of them; none
    within the tolerance: the smallest retain change."""
    def change(m: dict[str, Any]) -> float:
        value = m.get("retain_change")
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else math.inf

    eligible = [i for i, m in enumerate(measurements) if change(m) <= retain_tolerance]
    if not eligible:
        return min(range(len(measurements)), key=lambda i: (change(measurements[i]), i))
    p = [measurements[i].get("forget_holdout_ks_pvalue") or 0.0 for i in eligible]
    if max(p) < KS_LEVEL:
        return eligible[-1]
    return eligible[p.index(max(p))]


def _clean(obj: Any) -> Any:
    """A JSON-ready copy of ``obj``: tuples become lists, non-finite numbers ``None``."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _tofu_figures(report: Any) -> dict[str, Any]:
    """The figures the validation compares, from a :class:`~hf_unlearn.evaluation.report.TOFUReport`."""
    return {k: getattr(report, k) for k in ("forget_quality", "model_utility", "forget_rouge_l", "forget_truth_ratio")}


class Context:
    """The pair, the rows, the references and the evaluator settings every method is scored with."""

    def __init__(self, cache_dir: str | None, max_new_tokens: int, groups: str = "rows") -> None:
        from unlearn_bench.registry import load_subject_presets

        from hf_unlearn.data import HOLDOUT_FOR_FORGET, RETAIN_FOR_FORGET, load_tofu_rows
        from hf_unlearn.demo import load_tiny, reference_rows, tiny_models

        self.pair = tiny_models(source=SOURCE, forget_split=FORGET_SPLIT, cache_dir=cache_dir)
        self.groups = groups
        self.eval_kwargs = {"max_new_tokens": max_new_tokens}
        self.presets = load_subject_presets("tofu_tiny")
        self.forget = load_tofu_rows(FORGET_SPLIT, SOURCE)
        retain = load_tofu_rows(RETAIN_FOR_FORGET[FORGET_SPLIT], SOURCE)
        n = max(1, min(100, len(retain) // 10))  # as `hf-unlearn unlearn --select` splits them off
        self.retain, self.retain_validation = retain[:-n], retain[-n:]
        self.holdout = load_tofu_rows(HOLDOUT_FOR_FORGET[FORGET_SPLIT], SOURCE)
        self.target_report, self.retain_report = reference_rows(self.pair, SOURCE, FORGET_SPLIT, self.eval_kwargs)
        self.target_utility = float(self.target_report.model_utility)
        _, self.tokenizer = load_tiny(self.pair.target)

    def target(self) -> Any:
        from hf_unlearn.demo import load_tiny

        model, _ = load_tiny(self.pair.target)
        model.eval()
        return model

    def criterion(self) -> Any:
        from hf_unlearn.selection import SelectionCriterion

        groups = AUTHOR_ROWS if self.groups == "authors" else None
        criterion = SelectionCriterion(self.forget, self.holdout, self.retain_validation, groups=groups)
        criterion.measure_original(self.target(), self.tokenizer)
        return criterion

    def criterion_settings(self) -> str:
        groups = (f"groups of {AUTHOR_ROWS} rows (one synthetic author each)" if self.groups == "authors"
                  else "every row its own group")
        return (f"{groups}; no reference model (TOFU-tiny's models are trained from scratch, so there is no "
                "pretrained base to offset the rows' difficulty)")

    def tofu(self, model: Any, scorer: Any = None, generation_kwargs: Any = None) -> dict[str, Any]:
        from hf_unlearn.evaluation import evaluate_tofu

        report = evaluate_tofu(model, self.tokenizer, source=SOURCE, forget_split=FORGET_SPLIT,
                               retain_reference=self.retain_report, scorer=scorer,
                               generation_kwargs=generation_kwargs, progress=False, **self.eval_kwargs)
        return _tofu_figures(report)


TIMING_REPEATS = 3


def _timed(fn: Any, repeats: int = TIMING_REPEATS) -> tuple[float, Any]:
    """Median wall seconds of ``repeats`` calls of ``fn()`` and the last call's result."""
    seconds, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), out


def _spearman(x: list[Any], y: list[Any]) -> tuple[float | None, float | None]:
    from scipy.stats import spearmanr

    pairs = [(a, b) for a, b in zip(x, y) if a is not None and b is not None]
    if len(pairs) < 3:
        return None, None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a constant input gives nan, reported as None
        rho, p = spearmanr([a for a, _ in pairs], [b for _, b in pairs])
    return (None if math.isnan(rho) else float(rho)), (None if math.isnan(p) else float(p))


def summarize(name: str, candidates: list[dict[str, Any]], record: Any, target_utility: float) -> dict[str, Any]:
    """Spearman correlations, the rule's choice (and the replaced KS rule's) against the best candidate by TOFU
    forget quality among those at the utility bar, and how far each choice is from it (``log10`` of the forget
    quality ratio; 0 = as good)."""
    fq = [c["tofu"]["forget_quality"] for c in candidates]
    closeness = [None if c["criterion"]["shift_gap"] is None else -abs(c["criterion"]["shift_gap"])
                 for c in candidates]
    rho_gap, p_gap = _spearman(closeness, fq)
    rho_p, p_p = _spearman([c["criterion"]["forget_holdout_pvalue"] for c in candidates], fq)
    rho_ks, _ = _spearman([c["criterion"]["forget_holdout_ks_pvalue"] for c in candidates], fq)
    bar = UTILITY_KEEP * target_utility
    keep = [i for i, c in enumerate(candidates) if (c["tofu"]["model_utility"] or 0) >= bar]
    best = max(keep, key=lambda i: (candidates[i]["tofu"]["forget_quality"] or 0,
                                    candidates[i]["tofu"]["model_utility"])) if keep else None

    def brief(i: int | None) -> dict[str, Any] | None:
        if i is None:
            return None
        c = candidates[i]
        out = {"index": i, "settings": c["settings"], "forget_quality": c["tofu"]["forget_quality"],
               "model_utility": c["tofu"]["model_utility"], "forget_rouge_l": c["tofu"]["forget_rouge_l"],
               "at_bar": i in keep, "shift_gap": c["criterion"]["shift_gap"],
               "forget_holdout_pvalue": c["criterion"]["forget_holdout_pvalue"],
               "forget_holdout_ks_pvalue": c["criterion"]["forget_holdout_ks_pvalue"],
               "retain_change": c["criterion"]["retain_change"]}
        if best is not None and c["tofu"]["forget_quality"] and candidates[best]["tofu"]["forget_quality"]:
            out["log10_fq_below_best"] = math.log10(candidates[best]["tofu"]["forget_quality"]
                                                    / c["tofu"]["forget_quality"])
        return out

    ks_index = ks_rule_index([c["criterion"] for c in candidates])
    return {
        "method": name, "num_candidates": len(candidates),
        "spearman_closeness_vs_forget_quality": rho_gap, "spearman_closeness_p": p_gap,
        "spearman_pvalue_vs_forget_quality": rho_p, "spearman_p": p_p, "spearman_ks_pvalue_vs_forget_quality": rho_ks,
        "selected": {**brief(record.index), "reason": record.reason, "warning": record.warning},
        "selected_by_ks_rule": brief(ks_index),
        "best_by_forget_quality_at_bar": brief(best), "utility_bar": bar,
        "num_candidates_at_bar": len(keep), "candidates": candidates,
    }


def run_grom(ctx: Context) -> dict[str, Any]:
    from hf_unlearn.methods.grom import GROMConfig, fit_grom
    from hf_unlearn.methods.grom.strength_path import fit_grom_path

    settings = dict(ctx.presets["grom"]["demo"])
    config = GROMConfig(**{**settings, "progress": False})
    model = ctx.target()
    fit_grom(model, ctx.tokenizer, ctx.forget, ctx.retain, config)  # warm-up
    fit_seconds, _ = _timed(lambda: fit_grom(model, ctx.tokenizer, ctx.forget, ctx.retain, config))
    path_seconds, path = _timed(lambda: fit_grom_path(model, ctx.tokenizer, ctx.forget, ctx.retain, config,
                                                      scales=GROM_SCALES, retain_weights=GROM_RETAIN_WEIGHTS))
    criterion = ctx.criterion()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        select_seconds, _ = _timed(lambda: path.select(criterion, model, ctx.tokenizer))
    record = path.record
    candidates = []
    for i, edit in enumerate(path.edits):
        edited = copy.deepcopy(model)
        edit.apply_(edited)
        edited.eval()
        candidates.append({"settings": {**path.points[i], "edit_norm": path.norms[i]},
                           "criterion": {k: record.measurements[i].get(k) for k in CRITERION_KEYS},
                           "tofu": ctx.tofu(edited)})
    out = summarize("grom", candidates, record, ctx.target_utility)
    out["base_settings"] = settings
    out["timing"] = {"fit_grom_seconds": fit_seconds, "fit_grom_path_seconds": path_seconds,
                     "path_points": len(path), "path_vs_fit": path_seconds / fit_seconds,
                     "select_seconds": select_seconds,
                     "path_and_select_vs_fit": (path_seconds + select_seconds) / fit_seconds}
    return out


def run_t3(ctx: Context) -> dict[str, Any]:
    from transformers import LogitsProcessorList

    from hf_unlearn.methods.t3 import T3ClassifierConfig, T3LogitsProcessor, fit_t3, t3_scorer
    from hf_unlearn.methods.t3.calibration import DEFAULT_TEMPERATURES, DEFAULT_TILT_WEIGHTS, calibrate_t3

    settings = dict(ctx.presets["t3"]["demo"])
    model = ctx.target()

    def fit() -> Any:
        return fit_t3(model, ctx.tokenizer, ctx.forget, ctx.retain, T3ClassifierConfig(**settings), progress=False)

    fit()  # warm-up
    fit_seconds, clf = _timed(fit)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        criterion = ctx.criterion()
        default_seconds, _ = _timed(lambda: calibrate_t3(model, ctx.tokenizer, clf, criterion))
        grid_seconds, record = _timed(lambda: calibrate_t3(model, ctx.tokenizer, clf, criterion,
                                                           temperatures=T3_TEMPERATURES,
                                                           tilt_weights=T3_TILT_WEIGHTS))
    candidates = []
    for point, measurement in zip(record.candidates, record.measurements):
        t, w = point["temperature"], point["tilt_weight"]
        processor = T3LogitsProcessor(model, clf, temperature=t, tilt_weight=w)
        tofu = ctx.tofu(model, scorer=t3_scorer(model, clf, t, w),
                        generation_kwargs={"logits_processor": LogitsProcessorList([processor])})
        candidates.append({"settings": dict(point), "criterion": {k: measurement.get(k) for k in CRITERION_KEYS},
                           "tofu": tofu})
    out = summarize("t3", candidates, record, ctx.target_utility)
    out["base_settings"] = settings
    n_default = len(DEFAULT_TEMPERATURES) * len(DEFAULT_TILT_WEIGHTS)
    out["timing"] = {"fit_t3_seconds": fit_seconds, "calibrate_default_grid_seconds": default_seconds,
                     "default_grid_points": n_default, "calibrate_default_vs_fit": default_seconds / fit_seconds,
                     "calibrate_grid_seconds": grid_seconds, "grid_points": len(record.candidates),
                     "calibrate_grid_vs_fit": grid_seconds / fit_seconds}
    return out


def run_trainer(ctx: Context, method: str, selection_steps: int, learning_rate: float | None) -> dict[str, Any]:
    from transformers import TrainerCallback

    from hf_unlearn.run import TrainOptions, fit_or_train, prepare_inputs
    from hf_unlearn.selection import SelectionCallback

    settings = dict(ctx.presets[method]["demo"])
    if learning_rate is not None:
        settings["learning_rate"] = learning_rate
    snapshots: dict[int, dict[str, Any]] = {}

    class Snapshots(TrainerCallback):
        """The weights at every step the selection callback measures (the same candidates, for TOFU)."""

        def _keep(self, state: Any, model: Any) -> None:
            snapshots[int(state.global_step)] = {k: v.detach().clone() for k, v in model.state_dict().items()}

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self._keep(state, model)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % selection_steps == 0:
                self._keep(state, model)

        def on_train_end(self, args, state, control, model=None, **kwargs):
            if int(state.global_step) not in snapshots:  # before the selection callback restores the choice
                self._keep(state, model)

    criterion = ctx.criterion()
    selection = SelectionCallback(criterion, selection_steps=selection_steps, keep="memory")
    import tempfile

    with tempfile.TemporaryDirectory(prefix=f"selection_{method}_") as work, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        inputs = prepare_inputs(method, ctx.target(), ctx.tokenizer, ctx.forget, ctx.retain, work, settings)
        result = fit_or_train(inputs, TrainOptions(callbacks=[Snapshots(), selection]))
    record = selection.record
    candidates = []
    for step, measurement in zip(selection.steps, selection.measurements):
        model = ctx.target()
        model.load_state_dict(snapshots[step])
        model.eval()
        candidates.append({"settings": {"step": step}, "criterion": {k: measurement.get(k) for k in CRITERION_KEYS},
                           "tofu": ctx.tofu(model)})
    out = summarize(method, candidates, record, ctx.target_utility)
    out["base_settings"] = settings
    out["timing"] = {"run_seconds_with_selection": result.seconds, "selection_steps": selection_steps,
                     "criterion_seconds": sum(m.get("seconds") or 0 for m in selection.measurements)}
    return out


def markdown(results: dict[str, Any]) -> str:
    """The report as markdown: one summary table, then each method's candidates."""

    def f(value: Any, fmt: str = ".3g") -> str:
        return "n/a" if value is None else format(value, fmt)

    def choice(c: dict[str, Any] | None) -> str:
        if c is None:
            return "none | n/a | n/a"
        return (f"{c['index']}: {_settings(c['settings'])} | {f(c['forget_quality'])} / {f(c['model_utility'], '.3f')}"
                f"{'' if c['at_bar'] else ' (below bar)'} | {f(c.get('log10_fq_below_best'), '.2f')}")

    ref, tgt = results["retain_reference"]["criterion"], results["target"]["criterion"]
    lines = ["# TOFU-tiny: reference-free selection criterion vs TOFU forget quality", "",
             f"Target: forget quality {f(results['target']['tofu']['forget_quality'])}, model utility "
             f"{f(results['target']['tofu']['model_utility'], '.3f')} (bar: {f(results['utility_bar'], '.3f')}); "
             f"criterion: NLL shift gap {f(tgt['shift_gap'], '+.3f')}, equivalence p {f(tgt['equivalence_pvalue'])}, "
             f"difference p {f(tgt['forget_holdout_pvalue'])} "
             f"(row KS p {f(tgt['forget_holdout_ks_pvalue'])}). Retain reference: utility "
             f"{f(results['retain_reference']['tofu']['model_utility'], '.3f')}, gap {f(ref['shift_gap'], '+.3f')}, "
             f"equivalence p {f(ref['equivalence_pvalue'])}, difference p {f(ref['forget_holdout_pvalue'])} (row KS p "
             f"{f(ref['forget_holdout_ks_pvalue'])}).", "",
             f"Criterion: {results['criterion_settings']}.", "",
             "How far a choice is from the best candidate at the bar: `log10(best FQ / chosen FQ)` (0 = as good).", "",
             "| method | candidates | Spearman (closeness vs FQ) | Spearman (p vs FQ) | Spearman (KS p vs FQ) "
             "| selected | FQ / utility | log10 below best | KS rule's choice | FQ / utility | log10 below best "
             "| best at bar | FQ / utility | warning |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in results["methods"].values():
        sel, best = m["selected"], m["best_by_forget_quality_at_bar"]
        lines.append(
            f"| {m['method']} | {m['num_candidates']} | {f(m['spearman_closeness_vs_forget_quality'], '.2f')} | "
            f"{f(m['spearman_pvalue_vs_forget_quality'], '.2f')} | {f(m['spearman_ks_pvalue_vs_forget_quality'], '.2f')} | "
            f"{choice(sel)} | {choice(m['selected_by_ks_rule'])} | "
            + (f"{best['index']}: {_settings(best['settings'])} | {f(best['forget_quality'])} / "
               f"{f(best['model_utility'], '.3f')}" if best else "none | n/a")
            + f" | {'yes' if sel['warning'] else 'no'} |")
    timing = results["timing"]
    lines += ["", "Cost ratios (same process, each after one warm-up call, median of "
              f"{results['grids']['timing_repeats']} calls): "
              + "; ".join(f"{k} {v:.2f}" for k, v in timing.items()), ""]
    for m in results["methods"].values():
        lines += [f"## {m['method']}", "", f"Base settings: `{json.dumps(m['base_settings'], sort_keys=True)}`", "",
                  f"Rule: {m['selected']['reason']}", ""]
        if m["selected"]["warning"]:
            lines += [f"Warning: {m['selected']['warning']}", ""]
        lines += ["| # | settings | NLL shift gap | equivalence p | difference p | KS p (rows) | MIA AUC | retain change "
                  "| TOFU forget quality | model utility | forget ROUGE-L |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for i, c in enumerate(m["candidates"]):
            mark = []
            if i == m["selected"]["index"]:
                mark.append("selected")
            if i == m["selected_by_ks_rule"]["index"]:
                mark.append("KS rule")
            if m["best_by_forget_quality_at_bar"] and i == m["best_by_forget_quality_at_bar"]["index"]:
                mark.append("best at bar")
            cr, t = c["criterion"], c["tofu"]
            lines.append(f"| {i}{' (' + ', '.join(mark) + ')' if mark else ''} | {_settings(c['settings'])} | "
                         f"{f(cr['shift_gap'], '+.3f')} | {f(cr.get('equivalence_pvalue'))} | "
                         f"{f(cr['forget_holdout_pvalue'])} | "
                         f"{f(cr['forget_holdout_ks_pvalue'])} | {f(cr['mia_auc'], '.3f')} | "
                         f"{f(cr['retain_change'], '+.3f')} | {f(t['forget_quality'])} | "
                         f"{f(t['model_utility'], '.3f')} | {f(t['forget_rouge_l'], '.3f')} |")
        lines.append("")
    lines += ["## Reproduce", "", f"`{results['command']}`", "", "Environment: `"
              + json.dumps(results["environment"], sort_keys=True) + "`", ""]
    return "\n".join(lines)


def bench_aggregate_check(path: str | os.PathLike) -> dict[str, Any]:
    """The rule on the selection records of a TOFU-small bench run (its results JSON), from what the records hold:
    the mean forget and holdout NLLs of every candidate, not the per-row NLLs. With author groups of equal size
    the mean over rows is the mean over groups, so each candidate's gap without a reference model,
    ``forget_nll - holdout_nll``, is the criterion's ``shift_gap``; its p-value and the gap with the base
    model's offset need the per-row NLLs and are not computed. As an illustration of what an offset does,
    ``oracle_gap`` subtracts the retain reference's own gap (the offset a reference reproducing the ideal model's
    difficulty gap exactly would give)."""
    from hf_unlearn.selection import select_candidate

    data = json.loads(Path(path).read_text(encoding="utf-8"))

    def gap(m: dict[str, Any]) -> float:
        return float(m["forget_nll"]) - float(m["holdout_nll"])

    ideal = gap(data["retain_reference"]["criterion"])
    out: dict[str, Any] = {"source": str(path), "retain_reference_gap": ideal,
                           "target_gap": gap(data["target"]["criterion"]), "methods": {}}
    for name, row in data["rows"].items():
        record = (row.get("info") or {}).get("selection")
        if not record:
            continue
        ms = record["measurements"]
        plain = [{"shift_gap": gap(m), "retain_change": m["retain_change"]} for m in ms]
        oracle = [{"shift_gap": gap(m) - ideal, "retain_change": m["retain_change"]} for m in ms]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            plain_index, oracle_index = select_candidate(plain)[0], select_candidate(oracle)[0]
        out["methods"][name] = {
            "run_choice": record["index"], "run_forget_quality": row.get("forget_quality"),
            "gap_rule_choice": plain_index, "oracle_gap_rule_choice": oracle_index,
            "candidates": [{"settings": c, "gap": p["shift_gap"], "retain_change": p["retain_change"],
                            "ks_pvalue": m.get("forget_holdout_pvalue")}
                           for c, p, m in zip(record["candidates"], plain, ms)],
        }
    return out


def bench_aggregate_markdown(check: dict[str, Any]) -> list[str]:
    lines = ["## The rule on the SmolLM2-135M TOFU-small v2 run's records (aggregates only)", "",
             "The run's records hold each candidate's mean forget and holdout NLL, not the per-row NLLs: the gap "
             "without a reference model is computable, the group test's p-value and the base model's offset are "
             "not. Retain reference gap " f"{check['retain_reference_gap']:+.3f}, target gap {check['target_gap']:+.3f}. "
             "`oracle` subtracts the retain reference's gap (an illustration of a perfect difficulty offset, not "
             "something a user has).", "",
             "| method | run's choice (KS rule) | its forget quality | gap rule, no reference | gap rule, oracle offset "
             "| candidates: gap (retain change) |", "|---|---|---|---|---|---|"]
    for name, m in check["methods"].items():
        cands = "; ".join(f"{i}: {c['gap']:+.2f} ({c['retain_change']:+.3f})" for i, c in enumerate(m["candidates"]))
        fq = m["run_forget_quality"]
        lines.append(f"| {name} | {m['run_choice']} | {'n/a' if fq is None else format(fq, '.3g')} | "
                     f"{m['gap_rule_choice']} | {m['oracle_gap_rule_choice']} | {cands} |")
    return lines + [""]


def _settings(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in settings.items())


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import sys

    import torch
    from unlearn_bench.report import environment_info

    from hf_unlearn.safe_output import atomic_write_json, atomic_write_text

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-dir", default=None, help="TOFU-tiny model cache (default: the package's)")
    parser.add_argument("--output", default="benchmarks/results/tofu_tiny_selection.json",
                        help="JSON file; the markdown goes beside it (.md)")
    parser.add_argument("--methods", nargs="+", default=["grom", "t3", "npo", "npo@3e-4", "grad_diff"],
                        help="grom, t3, npo, grad_diff; a trainer as NAME@LR runs at that learning rate")
    parser.add_argument("--selection-steps", type=int, default=3, help="trainers: measure every N optimizer steps")
    parser.add_argument("--trainer-lr", type=float, default=None, help="trainers: learning rate (default: demo's)")
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bench-results", default=None,
                        help="also apply the rule to the selection records of a TOFU-small bench results JSON")
    parser.add_argument("--groups", choices=("rows", "authors"), default="rows",
                        help="the criterion's groups: every row its own (default) or one per synthetic author "
                             "(2 forget and 2 holdout authors: a weak test)")
    args = parser.parse_args(argv)
    def parse_method(spec: str) -> tuple[str, float | None]:
        name, _, lr = spec.partition("@")
        if name not in ("grom", "t3", "npo", "grad_diff") or (lr and name in ("grom", "t3")):
            parser.error(f"unknown method {spec!r}; choose from grom, t3, npo, grad_diff (trainers: NAME@LR)")
        try:
            return name, float(lr) if lr else None
        except ValueError:
            parser.error(f"bad learning rate in {spec!r}")
            raise

    specs = [(spec, *parse_method(spec)) for spec in args.methods]
    out = Path(args.output)
    if out.suffix != ".json":
        parser.error("--output must end in .json")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    ctx = Context(args.cache_dir, args.max_new_tokens, args.groups)
    anchors = {}
    for name, path in (("target", ctx.pair.target), ("retain_reference", ctx.pair.retain)):
        from hf_unlearn.demo import load_tiny

        model, _ = load_tiny(path)
        model.eval()
        report = ctx.target_report if name == "target" else ctx.retain_report
        anchors[name] = {"tofu": _tofu_figures(report),
                         "criterion": {k: ctx.criterion().measure(model, ctx.tokenizer).get(k) for k in CRITERION_KEYS}}
    methods: dict[str, Any] = {}
    for spec, method, lr in specs:
        print(f"[selection validation] {spec} ...", flush=True)
        if method == "grom":
            methods[spec] = run_grom(ctx)
        elif method == "t3":
            methods[spec] = run_t3(ctx)
        else:
            methods[spec] = run_trainer(ctx, method, args.selection_steps, lr if lr is not None else args.trainer_lr)
            methods[spec]["method"] = spec
    timing = {}
    if "grom" in methods:
        timing["fit_grom_path / fit_grom"] = methods["grom"]["timing"]["path_vs_fit"]
        timing["(fit_grom_path + select) / fit_grom"] = methods["grom"]["timing"]["path_and_select_vs_fit"]
    if "t3" in methods:
        timing["calibrate_t3 (default 9-point grid) / fit_t3"] = methods["t3"]["timing"]["calibrate_default_vs_fit"]
        timing[f"calibrate_t3 ({methods['t3']['timing']['grid_points']}-point grid) / fit_t3"] = (
            methods["t3"]["timing"]["calibrate_grid_vs_fit"])
    results = {
        "benchmark": "TOFU-tiny (synthetic, test size)", "source": SOURCE, "forget_split": FORGET_SPLIT,
        "target_model": str(ctx.pair.target), "retain_reference_model": str(ctx.pair.retain),
        "num_rows": {"forget": len(ctx.forget), "retain_used": len(ctx.retain),
                     "retain_validation": len(ctx.retain_validation), "holdout": len(ctx.holdout)},
        "eval_kwargs": ctx.eval_kwargs, "utility_bar": UTILITY_KEEP * ctx.target_utility,
        "rule": ctx.criterion().rule(), "criterion_settings": ctx.criterion_settings(), **anchors, "methods": methods, "timing": timing,
        "grids": {"grom_scales": GROM_SCALES, "grom_retain_weights": GROM_RETAIN_WEIGHTS,
                  "t3_temperatures": T3_TEMPERATURES, "t3_tilt_weights": T3_TILT_WEIGHTS,
                  "trainer_selection_steps": args.selection_steps, "timing_repeats": TIMING_REPEATS},
        "command": "python benchmarks/selection_validation.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "wall_seconds": time.perf_counter() - start, "environment": environment_info(),
    }
    if args.bench_results:
        results["bench_aggregates"] = bench_aggregate_check(args.bench_results)
    results = _clean(results)
    text = markdown(results)
    if results.get("bench_aggregates"):
        head, sep, tail = text.partition("## Reproduce")
        text = head + "\n".join(bench_aggregate_markdown(results["bench_aggregates"])) + "\n" + sep + tail
    atomic_write_json(out, results)
    atomic_write_text(out.with_suffix(".md"), text)
    print(text)
    return results


if __name__ == "__main__":
    main()
