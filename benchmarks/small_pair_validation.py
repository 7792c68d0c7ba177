"""TOFU forget quality of every candidate a method's strength selection measured on a TOFU-small pair, beside the
selection criterion's record of the same candidates from a bench run.

``unlearn-bench run --layout v2 --select`` records, for each method, the criterion's measurement of every candidate
(the NLL shift gap against the holdout authors, the retain change) and the candidate its rule chose; TOFU's forget
quality is measured for the chosen candidate only. This script measures it for all of them, scoring TOFU's forget
split without generation (:func:`~hf_unlearn.evaluation.tofu_stats.evaluate_split` with ``generate=False``): the
per-question truth ratios ``tr_i = exp(NLL(paraphrased_i) - mean_j NLL(perturbed_ij))`` and forget quality
``KS_pvalue({tr_i}, {tr_i^ref})`` against the retain reference's and the KS statistic ``D``, each with its
cluster-bootstrap interval over the forget authors (20 rows each).

* ``--method grom``: the exact path is refitted (each point's edit norm checked against the bench's record before
  anything is scored) and each point's edit applied to the target in turn, with GROM's own helpers.
* ``--method t3``: the head is refitted with the bench's seed (its fit report checked against the bench's), and all
  16 ``(T, w)`` points are scored from one pass of the base over the forget split
  (:func:`~hf_unlearn.methods.t3.scoring.t3_candidate_log_probs`, replayed per point by :class:`SharedPassScorers`).
* any trainer (``--method npo``, ``grad_diff``, ...): the bench's run is repeated with the bench's criterion, and a
  :class:`~unlearn_bench.probe.CheckpointProbe` scores every checkpoint the criterion measures (steps 0, every ``selection_steps``,
  the last). The re-run's own record is the one reported; its gaps are compared with the bench's.

It reports the Spearman rank correlation of the criterion's closeness ``-|gap|`` with forget quality, and how far
the chosen candidate is from the best one by forget quality among those within the criterion's retain tolerance
(the rule's own constraint): ``log10(best FQ / chosen FQ)``. Model utility needs generation and is measured for the
chosen candidate only (by the bench), so the constraint here is the retain tolerance, not the utility bar.

    HF_UNLEARN_TOFU_DIR=TOFU_DIR python benchmarks/small_pair_validation.py --method t3 --cache-dir runs/cache \\
        --bench-partial benchmarks/results/smollm2-135m_tofu_v2_equivalence/smollm2-135m_tofu_v2.partial.json \\
        --output benchmarks/results/smollm2-135m_tofu_v2_equivalence/t3_grid_validation.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from unlearn_bench.probe import CheckpointProbe  # noqa: E402

EVAL_KWARGS = {"max_new_tokens": 64, "autocast_dtype": "bfloat16"}  # the v2 bench's (its gate reports are kept)
NORM_RTOL = 1e-3
T3_FIT_CHECKS = ("steps_run", "best_epoch", "heldout_accuracy", "train_accuracy", "fit_forget_examples")
MEASURED = ("shift_gap", "equivalence_pvalue", "retain_change")
TOFU_ROWS_PER_AUTHOR = 20
FQ_KEYS = ("forget_quality", "forget_quality_low", "forget_quality_high", "ks_statistic", "ks_statistic_low",
           "ks_statistic_high")


def bench_record(saved: dict[str, Any], method: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``method``'s row of a bench partial (or results) file's contents and its selection record."""
    row = saved["grid"][method][0]
    return row, row["info"]["selection"]


def check_path(points: list[dict[str, Any]], norms: list[float], record: dict[str, Any]) -> None:
    """Refuse to score a GROM path other than the bench's: the same grid, in the same order, the same edit norms."""
    saved = record["candidates"]
    if len(saved) != len(points):
        raise ValueError(f"The refitted path has {len(points)} points; the bench's had {len(saved)}.")
    for i, (point, norm, cand) in enumerate(zip(points, norms, saved)):
        same = all(math.isclose(point[k], cand[k]) for k in ("scale", "retain_weight", "ridge"))
        if not same or not math.isclose(norm, cand["edit_norm"], rel_tol=NORM_RTOL):
            raise ValueError(f"Point {i} differs from the bench's: {point} norm {norm} against {cand}.")


def check_t3_fit(report: dict[str, Any], bench_info: dict[str, Any]) -> None:
    """Refuse to score a T3 head other than the bench's: its fit report (steps, best epoch, accuracies) must match."""
    differ = {k: (report.get(k), bench_info.get(k)) for k in T3_FIT_CHECKS
              if not math.isclose(float(report.get(k, math.nan)), float(bench_info.get(k, math.nan)), rel_tol=1e-6)}
    if differ:
        raise ValueError(f"The refitted head differs from the bench's (refit, bench): {differ}.")


def gap_agreement(record: dict[str, Any], bench: dict[str, Any]) -> dict[str, Any]:
    """How closely a re-run's criterion record repeats the bench's: the same candidates, the largest gap change,
    the same choice."""
    same = record["candidates"] == bench["candidates"]
    gaps = [abs(a["shift_gap"] - b["shift_gap"]) for a, b in zip(record["measurements"], bench["measurements"])]
    return {"same_candidates": same, "max_abs_gap_difference": max(gaps) if same and gaps else None,
            "same_choice": same and record["index"] == bench["index"]}


def summarize(record: dict[str, Any], fq: list[dict[str, Any]], tolerance: float) -> dict[str, Any]:
    """The chosen candidate against the best within the retain tolerance, and the criterion's rank agreement."""
    from scipy.stats import spearmanr

    changes = [m["retain_change"] for m in record["measurements"]]
    eligible = [i for i, c in enumerate(changes) if c <= tolerance]
    best = max(eligible, key=lambda i: (fq[i]["forget_quality"], -i)) if eligible else None
    chosen = record["index"]
    closeness = [-abs(m["shift_gap"]) for m in record["measurements"]]
    rho, p = spearmanr(closeness, [f["forget_quality"] for f in fq])
    regret = (math.log10(fq[best]["forget_quality"] / fq[chosen]["forget_quality"])
              if best is not None and fq[chosen]["forget_quality"] > 0 else None)
    return {"chosen": chosen, "best_within_tolerance": best, "log10_regret": regret,
            "spearman_closeness_vs_fq": float(rho), "spearman_p": float(p), "retain_tolerance": tolerance}


def _label(candidate: dict[str, Any]) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v:g}" for k, v in candidate.items() if k != "edit_norm")


def markdown(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = [f"# Candidates of {result.get('title', result['method'])} on {result['pair']}: the criterion against TOFU's "
             "forget quality", "",
             f"Chosen candidate {s['chosen']}; best forget quality within the retain tolerance {s['retain_tolerance']}:"
             f" candidate {s['best_within_tolerance']}; log10(best / chosen) = {_fmt(s['log10_regret'])}. Spearman "
             f"rank correlation of the criterion's closeness -|gap| with forget quality over the "
             f"{len(result['points'])} candidates: {s['spearman_closeness_vs_fq']:.2f} (p = {s['spearman_p']:.2g}).",
             "", "| # | candidate | NLL shift gap | equivalence p | retain change | forget quality (95% interval by "
             "author) | KS D (95% interval by author) | forget truth ratio | forget prob | |", "|" + "---|" * 10]
    for i, p in enumerate(result["points"]):
        mark = " ".join(m for m, on in (("chosen", i == s["chosen"]), ("best", i == s["best_within_tolerance"]),
                                        ("outside tolerance", p["retain_change"] > s["retain_tolerance"])) if on)
        lines.append(f"| {i} | {_label(p['candidate'])} | {p['shift_gap']:+.3f} | {p['equivalence_pvalue']:.3g} | "
                     f"{p['retain_change']:+.3f} | {p['forget_quality']:.3g} ({p['forget_quality_low']:.2g} - "
                     f"{p['forget_quality_high']:.2g}) | {_fmt(p.get('ks_statistic'), '.3f')} "
                     f"({_fmt(p.get('ks_statistic_low'), '.3f')} - {_fmt(p.get('ks_statistic_high'), '.3f')}) | "
                     f"{p['forget_truth_ratio']:.3f} | {p['forget_prob']:.3f} | {mark} |")
    lines += ["", f"The chosen candidate's forget quality as the bench measured it (full evaluation): "
              f"{result['bench_chosen_forget_quality']:.3g}; here {result['points'][s['chosen']]['forget_quality']:.3g}."]
    if result.get("bench_agreement"):
        a = result["bench_agreement"]
        lines.append(f"The re-run against the bench's record: same candidates {a['same_candidates']}, largest gap "
                     f"difference {_fmt(a['max_abs_gap_difference'], '.2g')}, same choice {a['same_choice']}.")
        if "target_agreement" in a:
            lines.append(f"The target's criterion NLLs on this pair against the bench's: largest difference "
                         f"{a['target_agreement']:.2g} nats/token (0 on the bench's own pair).")
    lines.append(f"Wall time: fit {result['fit_seconds']:.0f} s, scoring {result['scoring_seconds']:.0f} s.")
    return "\n".join(lines) + "\n"


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "n/a" if value is None else format(value, spec)


def score_forget(model: Any, tokenizer: Any, rows: list[dict[str, Any]], reference_tr: list[float],
                 scorer: Any = None, rows_per_author: int = TOFU_ROWS_PER_AUTHOR) -> dict[str, Any]:
    """One candidate's forget truth ratios, truth ratio, probability, forget quality and KS statistic ``D`` (each
    with its interval by author: ``rows`` are whole authors of ``rows_per_author`` rows)."""
    from hf_unlearn.evaluation.cluster_bootstrap import author_clusters, forget_quality_by_author
    from hf_unlearn.evaluation.tofu import model_autocast
    from hf_unlearn.evaluation.tofu_stats import evaluate_split, evaluation_splits

    spec = evaluation_splits("forget10")[0]
    with model_autocast(model, EVAL_KWARGS["autocast_dtype"]):
        split = evaluate_split(model, tokenizer, rows, spec, scorer=scorer, progress=False, generate=False)
    tr = split["per_example"]["truth_ratio"]
    fq = forget_quality_by_author(tr, reference_tr, author_clusters(len(tr), rows_per_author))
    return {**{k: fq[k] for k in FQ_KEYS}, "forget_truth_ratio": split["truth_ratio"], "forget_prob": split["prob"],
            "truth_ratios": tr}


class SharedPassScorers:
    """Token scorers for ``K`` candidates from one pass: ``per_batch(input_ids, attention_mask, position_ids,
    labels)`` gives every candidate's log-probabilities (``[B, L, K]``); :meth:`scorer` ``k`` returns slice ``k``.
    The first scoring loop computes and keeps each batch; every later loop must present the same batches in the
    same order (a deterministic loop such as ``evaluate_split``'s), which is checked, and replays them."""

    def __init__(self, per_batch: Any) -> None:
        self.per_batch = per_batch
        self.kept: list[tuple[Any, Any, Any]] = []

    def scorer(self, k: int) -> Any:
        import torch

        calls = itertools.count()

        def score(input_ids, attention_mask, position_ids, labels):
            i = next(calls)
            if i == len(self.kept):
                self.kept.append((input_ids.clone(), labels.clone(),
                                  self.per_batch(input_ids, attention_mask, position_ids, labels)))
            ids, kept_labels, out = self.kept[i]
            if not (torch.equal(ids, input_ids) and torch.equal(kept_labels, labels)):
                raise RuntimeError(f"Batch {i} differs from the first scoring loop's; it cannot be replayed.")
            return out[..., k]

        return score



def _say_forget_quality(step: int, score: dict[str, Any]) -> None:
    print(f"step {step}: forget quality {score.get('forget_quality', math.nan):.3g}", flush=True)


class Pair:
    """The bench's TOFU-small pair from its cache, its rows, and the retain reference's forget truth ratios."""

    def __init__(self, subject: str, data: str, cache_dir: str, max_rows: int | None) -> None:
        from unlearn_bench.subjects import SmallRecipe, build_small_pair, gate_reports

        from hf_unlearn.data import RETAIN_FOR_FORGET, load_tofu_rows
        from hf_unlearn.demo import forget_rows_with_other_answers, load_tiny

        self.pair = build_small_pair(subject, data, recipe=SmallRecipe.v2(subject), cache_dir=cache_dir,
                                     progress=False)
        reports = gate_reports(self.pair, EVAL_KWARGS)
        if reports is None:
            raise SystemExit(f"{self.pair.target} holds no gate reports evaluated with {EVAL_KWARGS}; run the bench "
                             "first.")
        _, self.tokenizer = load_tiny(self.pair.target)
        self.forget = forget_rows_with_other_answers(self.pair.forget_split, self.pair.source)
        self.retain = load_tofu_rows(RETAIN_FOR_FORGET[self.pair.forget_split], self.pair.source)
        self.eval_rows = load_tofu_rows(f"{self.pair.forget_split}_perturbed", self.pair.source)[:max_rows]
        self.reference_tr = reports[1]["forget_truth_ratios"][:len(self.eval_rows)]

    def target(self) -> Any:
        from hf_unlearn.demo import load_tiny

        model, _ = load_tiny(self.pair.target)
        model.eval()
        return model

    def score(self, model: Any, scorer: Any = None) -> dict[str, Any]:
        return score_forget(model, self.tokenizer, self.eval_rows, self.reference_tr, scorer=scorer)


def validate_grom(ctx: Pair, row: dict[str, Any], record: dict[str, Any], indices: list[int]) -> dict[str, Any]:
    """Refit GROM's path, check it is the bench's, and score each point with its edit applied (the model is put
    back exactly after each, with :meth:`~hf_unlearn.methods.grom.GROMPath.select`'s own helpers)."""
    from hf_unlearn.methods.grom import GROMConfig, fit_grom_path
    from hf_unlearn.methods.grom.strength_path import _add_deltas, _restore

    model = ctx.target()
    start = time.perf_counter()
    path = fit_grom_path(model, ctx.tokenizer, ctx.forget, ctx.retain, GROMConfig(progress=False, **row["settings"]))
    fit_seconds = time.perf_counter() - start
    check_path(path.points, path.norms, record)
    modules = dict(model.named_modules())
    saved = {n: modules[n].weight.detach().clone() for n in sorted({n for unit in path.unit_deltas for n in unit})}
    start, scored = time.perf_counter(), {}
    for i in indices:
        _add_deltas(modules, path.point_deltas(i))
        try:
            scored[i] = ctx.score(model)
        finally:
            _restore(modules, saved)
        print(f"point {i}: forget quality {scored[i]['forget_quality']:.3g}", flush=True)
    return {"record": record, "scored": scored, "fit_seconds": fit_seconds,
            "scoring_seconds": time.perf_counter() - start}


def validate_t3(ctx: Pair, row: dict[str, Any], record: dict[str, Any], indices: list[int]) -> dict[str, Any]:
    """Refit T3's head as the bench did (same seed and settings; its fit report checked against the bench's), then
    score every ``(T, w)`` of the record from one pass of the base over the forget split."""
    import torch

    from hf_unlearn.methods.t3 import T3ClassifierConfig, fit_t3
    from hf_unlearn.methods.t3.scoring import t3_candidate_log_probs
    from hf_unlearn.run import DEFAULT_SEED

    model = ctx.target()
    torch.manual_seed(row["settings"].get("seed", DEFAULT_SEED))  # as fit_or_train seeds a fit
    start = time.perf_counter()
    head = fit_t3(model, ctx.tokenizer, ctx.forget, ctx.retain, T3ClassifierConfig(**row["settings"]), progress=False)
    fit_seconds = time.perf_counter() - start
    check_t3_fit(head.fit_report, row["info"])
    head.check_base(model)
    settings = [(c["temperature"], c["tilt_weight"]) for c in record["candidates"]]
    shared = SharedPassScorers(lambda ids, mask, pos, labels: t3_candidate_log_probs(
        model, head, ids, labels, mask, pos, settings))
    start, scored = time.perf_counter(), {}
    for i in indices:
        scored[i] = ctx.score(model, scorer=shared.scorer(i))
        print(f"(T, w) = {settings[i]}: forget quality {scored[i]['forget_quality']:.3g}", flush=True)
    return {"record": record, "scored": scored, "fit_seconds": fit_seconds,
            "scoring_seconds": time.perf_counter() - start}


def validate_trainer(ctx: Pair, row: dict[str, Any], record: dict[str, Any], method: str,
                     target_criterion: dict[str, Any]) -> dict[str, Any]:
    """Repeat the bench's run of a trainer with the bench's criterion and a :class:`~unlearn_bench.probe.CheckpointProbe` at every
    checkpoint the criterion measures; the re-run's own record is the one scored.

    The criterion's original figures (the retain change's zero) are the target's, measured here on the pair in hand
    as the bench measures them; on the bench's own pair they equal its record (``target_agreement`` gives the largest
    difference), and a pair rebuilt where other kernels round its training differently is measured against its own
    target."""
    from unlearn_bench.criterion import selection_criterion_options
    from unlearn_bench.runner import _subject_selection_rows

    from hf_unlearn.run import TrainOptions, fit_or_train, prepare_inputs
    from hf_unlearn.selection import SelectionCriterion

    steps = [c["step"] for c in record["candidates"]]
    selection_steps = steps[1] - steps[0]
    holdout, validation = _subject_selection_rows(ctx.pair)  # the bench's own selection rows
    template = row["settings"].get("prompt_template")
    # the method's template, and none: the bench measures the target without one
    options = selection_criterion_options(ctx.pair, ctx.forget, holdout, validation, ctx.tokenizer, {template, None})
    model = ctx.target()
    own = SelectionCriterion(ctx.forget, holdout, validation, **options[None]).measure(model, ctx.tokenizer)
    original = {k: v for k, v in own.items() if k.endswith("_nll")}
    agreement = max(abs(v - target_criterion[k]) for k, v in original.items() if v is not None)
    criterion = SelectionCriterion(ctx.forget, holdout, validation, template=template, **options[template],
                                   original=original)
    probe = CheckpointProbe(ctx.score, selection_steps, report=_say_forget_quality)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"validate-{method}-") as work:
        inputs = prepare_inputs(method, model, ctx.tokenizer, ctx.forget, ctx.retain, work, dict(row["settings"]))
        result = fit_or_train(inputs, TrainOptions(callbacks=[probe], criterion=criterion,
                                                   selection_steps=selection_steps))
    rerun = result.info["selection"]
    scored = {i: probe.scores[c["step"]] for i, c in enumerate(rerun["candidates"])}
    scoring_seconds = sum(probe.seconds.values())
    return {"record": rerun, "scored": scored, "bench_agreement": {**gap_agreement(rerun, record),
                                                                   "target_agreement": agreement},
            "fit_seconds": time.perf_counter() - start - scoring_seconds, "scoring_seconds": scoring_seconds}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", required=True, help="grom, t3, or a trainer the bench selected (npo, ...)")
    parser.add_argument("--subject", default="smollm2-135m")
    parser.add_argument("--data", default=os.environ.get("HF_UNLEARN_TOFU_DIR", "locuslab/TOFU"))
    parser.add_argument("--cache-dir", required=True, help="the bench's cache (its pair is reused)")
    parser.add_argument("--bench-partial", required=True, help="the bench's partial (or results) JSON")
    parser.add_argument("--output", required=True, help="JSON; the table goes beside it as .md")
    parser.add_argument("--points", type=int, nargs="+", default=None,
                        help="score only these candidates of GROM or T3 (a check)")
    parser.add_argument("--max-rows", type=int, default=None,
                        help="score only the first N forget rows, whole authors (a multiple of 20; a check)")
    args = parser.parse_args(argv)
    if args.max_rows is not None and (args.max_rows < 1 or args.max_rows % TOFU_ROWS_PER_AUTHOR):
        parser.error(f"--max-rows must be whole authors (a multiple of {TOFU_ROWS_PER_AUTHOR}): the intervals "
                     "resample authors.")

    from unlearn_bench.resume import model_fingerprint

    from hf_unlearn import registry

    saved = json.loads(Path(args.bench_partial).read_text(encoding="utf-8"))
    row, record = bench_record(saved, args.method)
    trainer = registry.get_method(args.method).is_trainer
    if trainer and args.points is not None:
        parser.error("--points applies to GROM's path and T3's grid; a trainer's checkpoints come from one run.")
    ctx = Pair(args.subject, args.data, args.cache_dir, args.max_rows)
    indices = args.points if args.points is not None else list(range(len(record["candidates"])))
    if args.method == "grom":
        run = validate_grom(ctx, row, record, indices)
    elif args.method == "t3":
        run = validate_t3(ctx, row, record, indices)
    elif trainer:
        run = validate_trainer(ctx, row, record, args.method, saved["target"]["criterion"])
        indices = list(run["scored"])
    else:
        parser.error(f"{args.method!r} has no candidates this script knows how to score.")
    record = run["record"]
    points = [{"candidate": record["candidates"][i], **{k: record["measurements"][i][k] for k in MEASURED},
               **run["scored"][i]} for i in indices]
    result = {"method": args.method, "title": registry.get_method(args.method).title, "pair": f"{args.subject} TOFU-small v2",
              "target_fingerprint": model_fingerprint(ctx.pair.target), "forget_rows": len(ctx.eval_rows),
              "points": points, "bench_chosen_forget_quality": row["forget_quality"],
              "bench_agreement": run.get("bench_agreement"), "fit_seconds": run["fit_seconds"],
              "scoring_seconds": run["scoring_seconds"]}
    if args.points is None:
        result["summary"] = summarize(record, [run["scored"][i] for i in indices], record["rule"]["retain_tolerance"])
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    if "summary" in result:
        out.with_suffix(".md").write_text(markdown(result))
        print(markdown(result))
    return result


if __name__ == "__main__":
    main()
