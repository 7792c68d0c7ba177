"""TOFU forget quality of every point of GROM's strength path on a TOFU-small pair, beside the selection
criterion's record of the same points from a bench run.

``hf-unlearn bench --layout v2 --select`` records, for GROM, the criterion's measurement of every point of its
exact path (the NLL shift gap against the holdout authors, the retain change) and the point its rule chose; TOFU's
forget quality is measured for the chosen point only. This script refits the same path (the same pair, rows and
settings; each point's edit norm is checked against the bench's record before anything is scored), applies each
point's edit to the target in turn and scores TOFU's forget split without generation
(:func:`~hf_unlearn.evaluation.tofu_stats.evaluate_split` with ``generate=False``): the per-question truth ratios
``tr_i = exp(NLL(paraphrased_i) - mean_j NLL(perturbed_ij))`` and forget quality
``KS_pvalue({tr_i}, {tr_i^ref})`` against the retain reference's, with its bootstrap interval.

It reports, over the path, the Spearman rank correlation of the criterion's closeness ``-|gap|`` with forget
quality, and how far the chosen point is from the best point by forget quality among those within the criterion's
retain tolerance (the rule's own constraint): ``log10(best FQ / chosen FQ)``. Model utility needs generation and is
measured for the chosen point only (by the bench), so the constraint here is the retain tolerance, not the
utility bar.

    HF_UNLEARN_TOFU_DIR=TOFU_DIR python benchmarks/grom_path_validation.py --cache-dir runs/cache \\
        --bench-partial benchmarks/results/smollm2-135m_tofu_v2_equivalence/smollm2-135m_tofu_v2.partial.json \\
        --output benchmarks/results/smollm2-135m_tofu_v2_equivalence/grom_path_validation.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

EVAL_KWARGS = {"max_new_tokens": 64, "autocast_dtype": "bfloat16"}  # the v2 bench's (its gate reports are kept)
NORM_RTOL = 1e-3


def bench_record(partial: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Any]]:
    """GROM's row of a bench partial (or results) file and its selection record (candidates, measurements, rule)."""
    saved = json.loads(Path(partial).read_text(encoding="utf-8"))
    row = saved["grid"]["grom"][0]
    return row, row["info"]["selection"]


def check_path(points: list[dict[str, Any]], norms: list[float], record: dict[str, Any]) -> None:
    """Refuse to score a path other than the bench's: the same grid, in the same order, with the same edit norms."""
    saved = record["candidates"]
    if len(saved) != len(points):
        raise ValueError(f"The refitted path has {len(points)} points; the bench's had {len(saved)}.")
    for i, (point, norm, cand) in enumerate(zip(points, norms, saved)):
        same = all(math.isclose(point[k], cand[k]) for k in ("scale", "retain_weight", "ridge"))
        if not same or not math.isclose(norm, cand["edit_norm"], rel_tol=NORM_RTOL):
            raise ValueError(f"Point {i} differs from the bench's: {point} norm {norm} against {cand}.")


def summarize(record: dict[str, Any], fq: list[dict[str, Any]], tolerance: float) -> dict[str, Any]:
    """The chosen point against the best within the retain tolerance, and the criterion's rank agreement."""
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


def markdown(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = [f"# GROM's strength path on {result['pair']}: the criterion against TOFU's forget quality", "",
             f"Chosen point {s['chosen']}; best forget quality within the retain tolerance {s['retain_tolerance']}: "
             f"point {s['best_within_tolerance']}; log10(best / chosen) = {_fmt(s['log10_regret'])}. Spearman "
             f"rank correlation of the criterion's closeness -|gap| with forget quality over the "
             f"{len(result['points'])} points: {s['spearman_closeness_vs_fq']:.2f} (p = {s['spearman_p']:.2g}).", "",
             "| point | target scale | retain weight | NLL shift gap | equivalence p | retain change | forget quality "
             "(95% interval) | forget truth ratio | forget prob | |", "|" + "---|" * 10]
    for i, p in enumerate(result["points"]):
        mark = " ".join(m for m, on in (("chosen", i == s["chosen"]), ("best", i == s["best_within_tolerance"]),
                                        ("outside tolerance", p["retain_change"] > s["retain_tolerance"])) if on)
        lines.append(f"| {i} | {p['scale']:g} | {p['retain_weight']:g} | {p['shift_gap']:+.3f} | "
                     f"{p['equivalence_pvalue']:.3g} | {p['retain_change']:+.3f} | {p['forget_quality']:.3g} "
                     f"({p['forget_quality_low']:.2g} - {p['forget_quality_high']:.2g}) | "
                     f"{p['forget_truth_ratio']:.3f} | {p['forget_prob']:.3f} | {mark} |")
    lines += ["", f"The chosen point's forget quality as the bench measured it (merged model, full evaluation): "
              f"{result['bench_chosen_forget_quality']:.3g}; here {result['points'][s['chosen']]['forget_quality']:.3g}.",
              f"Wall time: path fit {result['fit_seconds']:.0f} s, scoring {result['scoring_seconds']:.0f} s."]
    return "\n".join(lines) + "\n"


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def score_points(path: Any, model: Any, tokenizer: Any, rows: list[dict[str, Any]], reference_tr: list[float],
                 points: list[int]) -> list[dict[str, Any]]:
    """Each point's forget truth ratios and forget quality (the model is put back exactly after each, as
    :meth:`~hf_unlearn.methods.grom.GROMPath.select` does, with its own helpers)."""
    from hf_unlearn.evaluation.metrics import forget_quality_interval
    from hf_unlearn.evaluation.tofu import model_autocast
    from hf_unlearn.evaluation.tofu_stats import evaluate_split, evaluation_splits
    from hf_unlearn.methods.grom.strength_path import _add_deltas, _restore

    spec = evaluation_splits("forget10")[0]
    modules = dict(model.named_modules())
    saved = {n: modules[n].weight.detach().clone() for n in sorted({n for unit in path.unit_deltas for n in unit})}
    out = []
    for i in points:
        _add_deltas(modules, path.point_deltas(i))
        try:
            with model_autocast(model, EVAL_KWARGS["autocast_dtype"]):
                split = evaluate_split(model, tokenizer, rows, spec, progress=False, generate=False)
        finally:
            _restore(modules, saved)
        tr = split["per_example"]["truth_ratio"]
        fq = forget_quality_interval(tr, reference_tr)
        out.append({"forget_quality": fq["forget_quality"], "forget_quality_low": fq["forget_quality_low"],
                    "forget_quality_high": fq["forget_quality_high"], "forget_truth_ratio": split["truth_ratio"],
                    "forget_prob": split["prob"], "truth_ratios": tr})
        print(f"point {i}: forget quality {fq['forget_quality']:.3g}", flush=True)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subject", default="smollm2-135m")
    parser.add_argument("--data", default=os.environ.get("HF_UNLEARN_TOFU_DIR", "locuslab/TOFU"))
    parser.add_argument("--cache-dir", required=True, help="the bench's cache (its pair is reused)")
    parser.add_argument("--bench-partial", required=True, help="the bench's partial (or results) JSON with GROM")
    parser.add_argument("--output", required=True, help="JSON; the table goes beside it as .md")
    parser.add_argument("--points", type=int, nargs="+", default=None, help="score only these points (a check)")
    parser.add_argument("--max-rows", type=int, default=None, help="score only the first N forget rows (a check)")
    args = parser.parse_args(argv)

    from hf_unlearn.bench.resume import model_fingerprint
    from hf_unlearn.bench.rows import forget_rows_with_other_answers
    from hf_unlearn.bench.subjects import SmallRecipe, build_small_pair, gate_reports, load_tiny
    from hf_unlearn.data import RETAIN_FOR_FORGET, load_tofu_rows
    from hf_unlearn.methods.grom import GROMConfig, fit_grom_path

    row, record = bench_record(args.bench_partial)
    pair = build_small_pair(args.subject, args.data, recipe=SmallRecipe.v2(args.subject), cache_dir=args.cache_dir,
                            progress=False)
    reports = gate_reports(pair, EVAL_KWARGS)
    if reports is None:
        raise SystemExit(f"{pair.target} holds no gate reports evaluated with {EVAL_KWARGS}; run the bench first.")
    model, tokenizer = load_tiny(pair.target)
    model.eval()
    forget = forget_rows_with_other_answers(pair.forget_split, pair.source)
    retain = load_tofu_rows(RETAIN_FOR_FORGET[pair.forget_split], pair.source)
    start = time.perf_counter()
    path = fit_grom_path(model, tokenizer, forget, retain, GROMConfig(progress=False, **row["settings"]))
    fit_seconds = time.perf_counter() - start
    check_path(path.points, path.norms, record)
    rows = load_tofu_rows(f"{pair.forget_split}_perturbed", pair.source)[:args.max_rows]
    reference_tr = reports[1]["forget_truth_ratios"][:len(rows)]
    indices = args.points if args.points is not None else list(range(len(path.points)))
    start = time.perf_counter()
    scored = dict(zip(indices, score_points(path, model, tokenizer, rows, reference_tr, indices)))
    scoring_seconds = time.perf_counter() - start
    measurements = record["measurements"]
    points = [{**path.points[i], **{k: measurements[i][k] for k in ("shift_gap", "equivalence_pvalue",
                                                                  "retain_change")}, **scored[i]} for i in indices]
    result = {"pair": f"{args.subject} TOFU-small v2", "target_fingerprint": model_fingerprint(pair.target),
              "forget_rows": len(rows), "points": points, "bench_chosen_forget_quality": row["forget_quality"],
              "fit_seconds": fit_seconds, "scoring_seconds": scoring_seconds}
    if args.points is None:
        result["summary"] = summarize(record, [scored[i] for i in indices], record["rule"]["retain_tolerance"])
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    if "summary" in result:
        out.with_suffix(".md").write_text(markdown(result))
        print(markdown(result))
    return result


if __name__ == "__main__":
    main()
