"""The reported run of the tuning protocol (``docs/tuning-protocol.md``): each method's chosen configuration run once
on a reported author split with that split's own pair, the chosen candidate evaluated with generation, every figure
with its interval by author, and each paper method compared with the best baseline on the same authors.

    python benchmarks/reported_run.py --subject smollm2-135m --authors 1-4 --data TOFU_DIR --cache-dir runs/cache \\
        --chosen benchmarks/results/tuning_sweep_smollm2-135m/chosen.json --out benchmarks/results/reported_smollm2-135m

``--authors``: ``1-4`` (the reported split) or ``13-16`` (the replication). Writes ``reported.json`` (the retain
reference's and the target's evaluations, then every finished method, keyed by content: a rerun skips them) and
``reported.md`` into ``--out``.

Per method: forget quality ``KS_pvalue({tr_i}, {tr_i^ref})`` with the KS statistic ``D``, model utility (TOFU's
harmonic mean of probability, ROUGE-L and truth-ratio score over retain, real authors and world facts), the gaps
(the NLL shift gap ``mean_f(n_i - n_i^target) - mean_h(n_j - n_j^target)`` between forget and holdout authors, and
the forget truth-ratio score and model utility minus the retain reference's), each with its 95% cluster-bootstrap
interval over authors (real authors and world facts: over rows). Each paper method (:data:`PAPER_METHODS`) is
compared with the best baseline (the other method with the highest forget quality on these authors):
``Delta = S(method) - S(baseline)`` on the same resampled authors, for forget quality, ``D`` and model utility.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _load(name: str) -> Any:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


sweep = _load("sweep")
protocol = sweep.protocol

#: The methods the paper proposes; every other method is a baseline.
PAPER_METHODS = ("t3", "masc", "atwu", "grom")
SPLITS = {"1-4": "reported", "13-16": "replication"}
N_RESAMPLES = 1000
BOOTSTRAP_SEED = 0
UTILITY_SPLITS = ("retain", "real_authors", "world_facts")
#: How each model-utility split's rows cluster (real authors and world facts are one question per row).
UTILITY_CLUSTERS = {"retain": "author", "real_authors": "row", "world_facts": "row"}


# ---- the figures (pure: per-row values in, figures with intervals out) -------------------------------------------

def split_clusters(n_rows: int, kind: str, rows_per_author: int) -> np.ndarray:
    """Cluster labels of a split's rows: ``floor(i / rows_per_author)`` by author, else every row its own."""
    from hf_unlearn.evaluation.cluster_bootstrap import author_clusters, row_clusters

    return author_clusters(n_rows, rows_per_author) if kind == "author" else row_clusters(n_rows)


def utility_parts(evaluation: Mapping[str, Any]) -> list[dict[str, np.ndarray]]:
    """Per utility split, the per-row scores whose means make TOFU's model utility: ``prob``, ``rouge_l`` and the
    truth-ratio score ``max(0, 1 - tr_i)`` (``rouge_l`` left out where it was not generated)."""
    from hf_unlearn.evaluation.cluster_bootstrap import truth_ratio_scores

    parts = []
    for name in UTILITY_SPLITS:
        rows = evaluation[name]
        part = {"prob": np.asarray(rows["prob"], dtype=np.float64),
                "truth_ratio": truth_ratio_scores(rows["truth_ratio"], "true_better")}
        if rows.get("rouge_l") is not None:
            part["rouge_l"] = np.asarray(rows["rouge_l"], dtype=np.float64)
        parts.append(part)
    return parts


def _utility(parts: list[dict[str, np.ndarray]], indices: Sequence[np.ndarray]) -> float:
    from hf_unlearn.evaluation.cluster_bootstrap import harmonic_mean

    return harmonic_mean([a[i].mean() for part, i in zip(parts, indices) for a in part.values()])


def utility_difference(first: Mapping[str, Any], second: Mapping[str, Any] | None, rows_per_author: int,
                       n_resamples: int = N_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> dict[str, float]:
    """``MU(first) - MU(second)`` (``MU(first)`` when ``second`` is ``None``) with its cluster-bootstrap interval,
    the same resampled authors and rows applied to both models. Returns ``value``, ``low``, ``high``."""
    from hf_unlearn.evaluation.cluster_bootstrap import cluster_bootstrap

    a = utility_parts(first)
    b = utility_parts(second) if second is not None else None
    clusters = [split_clusters(len(first[n]["prob"]), UTILITY_CLUSTERS[n], rows_per_author) for n in UTILITY_SPLITS]

    def statistic(*indices: np.ndarray) -> float:
        return _utility(a, indices) - (_utility(b, indices) if b is not None else 0.0)

    out = cluster_bootstrap(statistic, clusters, n_resamples=n_resamples, seed=seed)
    return {k: out[k] for k in ("value", "low", "high")}


def shift_gap_by_author(forget_nll: Sequence[float], holdout_nll: Sequence[float], target: Mapping[str, Any],
                        rows_per_author: int, n_resamples: int = N_RESAMPLES,
                        seed: int = BOOTSTRAP_SEED) -> dict[str, float]:
    """The NLL shift gap ``mean_f(n_i - n_i^target) - mean_h(n_j - n_j^target)`` with its interval, forget and
    holdout authors resampled independently. Returns ``value``, ``low``, ``high``."""
    from hf_unlearn.evaluation.cluster_bootstrap import author_clusters, cluster_bootstrap

    f = np.asarray(forget_nll, dtype=np.float64) - np.asarray(target["nll"]["forget"], dtype=np.float64)
    h = np.asarray(holdout_nll, dtype=np.float64) - np.asarray(target["nll"]["holdout"], dtype=np.float64)
    out = cluster_bootstrap(lambda i, j: f[i].mean() - h[j].mean(),
                            [author_clusters(len(f), rows_per_author), author_clusters(len(h), rows_per_author)],
                            n_resamples=n_resamples, seed=seed)
    return {k: out[k] for k in ("value", "low", "high")}


def method_figures(evaluation: Mapping[str, Any], reference: Mapping[str, Any], target: Mapping[str, Any],
                   rows_per_author: int, n_resamples: int = N_RESAMPLES,
                   seed: int = BOOTSTRAP_SEED) -> dict[str, Any]:
    """One model's reported figures from its per-row evaluation (:func:`evaluate_model`) against the retain
    reference's and the target's: forget quality and ``D`` (``forget_quality_by_author``), model utility, the
    shift gap, and the forget truth-ratio score and model utility minus the reference's, each with ``_low`` /
    ``_high``."""
    from hf_unlearn.evaluation.cluster_bootstrap import (
        author_clusters,
        forget_quality_by_author,
        paired_difference_by_author,
        truth_ratio_scores,
    )

    options = {"n_resamples": n_resamples, "seed": seed}
    tr, ref_tr = evaluation["forget"]["truth_ratio"], reference["forget"]["truth_ratio"]
    clusters = author_clusters(len(tr), rows_per_author)
    out: dict[str, Any] = dict(forget_quality_by_author(tr, ref_tr, clusters, **options))
    for name, figure in (("model_utility", utility_difference(evaluation, None, rows_per_author, **options)),
                         ("utility_gap_to_reference",
                          utility_difference(evaluation, reference, rows_per_author, **options)),
                         ("shift_gap", shift_gap_by_author(evaluation["nll"]["forget"], evaluation["nll"]["holdout"],
                                                           target, rows_per_author, **options))):
        out.update({name: figure["value"], f"{name}_low": figure["low"], f"{name}_high": figure["high"]})
    gap = paired_difference_by_author(lambda v, i: truth_ratio_scores(v[i], "closer_to_1_better").mean(),
                                      tr, ref_tr, clusters, **options)
    out.update({"forget_truth_ratio_gap_to_reference": gap["difference"],
                "forget_truth_ratio_gap_to_reference_low": gap["difference_low"],
                "forget_truth_ratio_gap_to_reference_high": gap["difference_high"]})
    return out


def best_baseline(figures: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The baseline (a method not in :data:`PAPER_METHODS`) with the highest forget quality; ties: the earlier."""
    baselines = [m for m in figures if m not in PAPER_METHODS]
    return max(baselines, key=lambda m: (figures[m]["forget_quality"], -baselines.index(m))) if baselines else None


def paired_comparison(first: Mapping[str, Any], second: Mapping[str, Any], reference: Mapping[str, Any],
                      rows_per_author: int, n_resamples: int = N_RESAMPLES,
                      seed: int = BOOTSTRAP_SEED) -> dict[str, float]:
    """``S(first) - S(second)`` on the same resampled authors for forget quality, ``D`` and model utility, each
    with ``_low`` / ``_high`` (``forget_quality_difference``, ``ks_statistic_difference``,
    ``model_utility_difference``)."""
    from scipy.stats import ks_2samp

    from hf_unlearn.evaluation.cluster_bootstrap import author_clusters, paired_difference_by_author

    ref = np.asarray(reference["forget"]["truth_ratio"], dtype=np.float64)
    clusters = author_clusters(len(ref), rows_per_author)
    options = {"n_resamples": n_resamples, "seed": seed}
    out: dict[str, float] = {}
    for name, field in (("forget_quality", "pvalue"), ("ks_statistic", "statistic")):
        d = paired_difference_by_author(lambda v, i, f=field: getattr(ks_2samp(v[i], ref[i]), f),
                                        first["forget"]["truth_ratio"], second["forget"]["truth_ratio"], clusters,
                                        **options)
        out.update({f"{name}_difference": d["difference"], f"{name}_difference_low": d["difference_low"],
                    f"{name}_difference_high": d["difference_high"]})
    mu = utility_difference(first, second, rows_per_author, **options)
    out.update({"model_utility_difference": mu["value"], "model_utility_difference_low": mu["low"],
                "model_utility_difference_high": mu["high"]})
    return out


# ---- models (the one place a method is run) ----------------------------------------------------------------------

def row_nlls(model: Any, tokenizer: Any, rows: Sequence[Mapping[str, Any]], scorer: Any = None) -> list[float]:
    """Each row's average answer NLL ``-mean_t log p(a_t | q, a_<t)``."""
    from hf_unlearn.logprobs import answer_token_statistics

    stats = answer_token_statistics(model, tokenizer, [r["question"] for r in rows], [r["answer"] for r in rows],
                                    scorer=scorer)
    return [float(-np.mean(lp)) if len(lp) else 0.0 for lp in stats.token_log_probs]


def evaluate_model(model: Any, tokenizer: Any, pair: Any, scorer: Any = None,
                   generation_kwargs: Mapping[str, Any] | None = None, max_new_tokens: int | None = None) -> dict:
    """A model's per-row figures on the pair: TOFU's four splits with generation (``prob``, ``rouge_l``,
    ``truth_ratio`` per row) and the forget and holdout rows' answer NLLs (``nll``)."""
    from hf_unlearn.evaluation.generation import DEFAULT_MAX_NEW_TOKENS
    from hf_unlearn.evaluation.tofu_stats import evaluate_split, evaluation_splits

    rows = {"forget": pair.forget_eval, **pair.utility_rows}
    out: dict[str, Any] = {}
    for spec in evaluation_splits("forget10"):
        split = evaluate_split(model, tokenizer, rows[spec.name], spec, scorer=scorer,
                               generation_kwargs=generation_kwargs, progress=False,
                               max_new_tokens=max_new_tokens or DEFAULT_MAX_NEW_TOKENS)
        out[spec.name] = {k: split["per_example"][k] for k in ("prob", "rouge_l", "truth_ratio")}
    out["nll"] = {"forget": row_nlls(model, tokenizer, pair.forget, scorer),
                  "holdout": row_nlls(model, tokenizer, pair.holdout, scorer)}
    return out


def run_chosen(method: str, settings: dict[str, Any], pair: Any, tokenizer: Any, selection_steps: int,
               max_new_tokens: int | None) -> dict[str, Any]:
    """The chosen configuration run once with the package's strength selection, its chosen candidate evaluated."""
    from hf_unlearn.demo import load_tiny
    from hf_unlearn.run import TrainOptions, fit_or_train, prepare_inputs

    model, _ = load_tiny(pair.target)
    template = settings.get("prompt_template")
    criterion = pair.criteria.get(template) or pair.criteria.setdefault(
        template, sweep.make_criterion(pair, tokenizer, template))
    with tempfile.TemporaryDirectory(prefix=f"reported-{method}-") as work:
        inputs = prepare_inputs(method, model, tokenizer, pair.forget, pair.retain_rows, work, dict(settings))
        result = fit_or_train(inputs, TrainOptions(criterion=criterion, selection_steps=selection_steps))
        start = time.perf_counter()
        result.model.eval()
        evaluation = evaluate_model(result.model, tokenizer, pair, result.scorer, result.generation_kwargs,
                                    max_new_tokens)
    return {"method": method, "settings": settings, "selection": result.info["selection"], "evaluation": evaluation,
            "seconds": result.seconds, "evaluation_seconds": time.perf_counter() - start}


def build_pair(subject: str, split: str, data: str, cache_dir: str, tiny_epochs: int | None) -> Any:
    return sweep.build_pair(subject, split, data, cache_dir, tiny_epochs)


# ---- the command --------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subject", default="tofu-tiny", help="tofu-tiny or a pretrained subject (smollm2-135m)")
    parser.add_argument("--authors", choices=sorted(SPLITS), required=True,
                        help="1-4 (reported) or 13-16 (replication); never the tuning authors")
    parser.add_argument("--chosen", required=True, help="the tuning sweep's chosen.json")
    parser.add_argument("--out", required=True, help="folder of reported.json and reported.md")
    parser.add_argument("--data", default=os.environ.get("HF_UNLEARN_TOFU_DIR", "locuslab/TOFU"))
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--methods", nargs="+", default=[*protocol.TRAINERS, "grom", "t3"])
    parser.add_argument("--selection-steps", type=int, default=5, help="criterion reading every N optimizer steps")
    parser.add_argument("--tiny-epochs", type=int, default=None,
                        help="TOFU-tiny: train the pair for N epochs instead of 40 (as the tuning sweep did)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="generation length (default: TOFU's 200)")
    parser.add_argument("--resamples", type=int, default=N_RESAMPLES, help="cluster-bootstrap resamples")
    args = parser.parse_args(argv)
    import json

    tuned_on = json.loads(Path(args.chosen).read_text(encoding="utf-8")).get("authors")
    if tuned_on != sweep.AUTHOR_NAMES["tuning"]:
        parser.error(f"{args.chosen} was chosen on {tuned_on!r}; the reported run takes configurations chosen on "
                     f"{sweep.AUTHOR_NAMES['tuning']}.")
    plan = sweep.planned_configurations(args.methods, args.chosen)
    from unlearn_bench.registry import load_subject_presets

    from hf_unlearn import __version__
    from hf_unlearn.demo import load_tiny

    split = SPLITS[args.authors]
    presets = load_subject_presets("tofu_tiny" if args.subject == "tofu-tiny" else f"{args.subject}-v2")
    pair = build_pair(args.subject, split, args.data, args.cache_dir, args.tiny_epochs)
    _, tokenizer = load_tiny(pair.target)
    out = Path(args.out)
    log = protocol.SweepLog(out / "reported.json")
    # what a method's per-row evaluation depends on; the bootstrap is applied afterwards, from the stored rows
    context = {**sweep.context_of(pair, args.selection_steps), "max_new_tokens": args.max_new_tokens}
    header = {"protocol": "docs/tuning-protocol.md", "subject": args.subject, "authors": sweep.AUTHOR_NAMES[split],
              "chosen": args.chosen, "context": context, "plan": plan,
              "bootstrap": {"n_resamples": args.resamples, "seed": BOOTSTRAP_SEED, "confidence": 0.95},
              "provenance": {**sweep.provenance(argv), "command": "python benchmarks/reported_run.py "
                             + " ".join(argv if argv is not None else sys.argv[1:]),
                             "hf_unlearn": __version__, "data": args.data,
                             "forget_offset_authors": sweep.AUTHOR_OFFSETS[split]}}
    for name, path in (("retain reference", pair.retain), ("target", pair.target)):
        key = protocol.configuration_key(f"__{name}__", {}, context)
        if not log.done(key):
            model, _ = load_tiny(path)
            log.add(key, {"method": f"__{name}__", "evaluation": evaluate_model(model.eval(), tokenizer, pair,
                                                                                 max_new_tokens=args.max_new_tokens)},
                    header)
    for method, (overrides,) in plan.items():
        settings = {**presets[method]["demo"], **overrides}
        key = protocol.configuration_key(method, settings, context)
        if log.done(key):
            continue
        print(f"{method} {overrides}", flush=True)
        record = run_chosen(method, settings, pair, tokenizer, args.selection_steps, args.max_new_tokens)
        log.add(key, {**record, "overrides": overrides, "seed": settings.get("seed")}, header)
    return write_outputs(out, log.records, header, pair.rows_per_author, args.resamples)


def write_outputs(out: Path, records: Mapping[str, Mapping[str, Any]], header: Mapping[str, Any],
                  rows_per_author: int, n_resamples: int = N_RESAMPLES) -> dict[str, Any]:
    """Every model's figures and the paired comparisons, into ``reported.md`` (``reported.json`` holds the rows)."""
    from hf_unlearn.safe_output import atomic_write_text

    by_method = {r["method"]: r for r in records.values()}
    reference, target = by_method["__retain reference__"]["evaluation"], by_method["__target__"]["evaluation"]
    figures = {m: method_figures(r["evaluation"], reference, target, rows_per_author, n_resamples)
               for m, r in by_method.items() if m != "__retain reference__"}
    methods = {m: f for m, f in figures.items() if not m.startswith("__")}
    baseline = best_baseline(methods)
    comparisons = {m: {"baseline": baseline, **paired_comparison(by_method[m]["evaluation"],
                                                                by_method[baseline]["evaluation"], reference,
                                                                rows_per_author, n_resamples)}
                   for m in methods if m in PAPER_METHODS and baseline is not None}
    atomic_write_text(out / "reported.md", markdown(figures, comparisons, header))
    return {"figures": figures, "comparisons": comparisons, "best_baseline": baseline}


def _interval(f: Mapping[str, Any], name: str, spec: str) -> str:
    return f"{f[name]:{spec}} ({f[name + '_low']:{spec}} to {f[name + '_high']:{spec}})"


def markdown(figures: Mapping[str, Mapping[str, Any]], comparisons: Mapping[str, Mapping[str, Any]],
             header: Mapping[str, Any]) -> str:
    lines = [f"# Reported run: {header['subject']}, {header['authors']}", "",
             f"Each method's configuration chosen on the tuning authors ({header['chosen']}), run once on these "
             "authors with their own pair; the chosen candidate evaluated with generation. Intervals: 95% cluster "
             "bootstrap over authors (real authors and world facts: over rows).", "",
             "| method | forget quality | KS D | model utility | NLL shift gap (forget - holdout) | "
             "forget truth-ratio score - reference's | model utility - reference's |", "|" + "---|" * 7]
    for m, f in figures.items():
        lines.append(f"| {m.strip('_')} | {_interval(f, 'forget_quality', '.3g')} | "
                     f"{_interval(f, 'ks_statistic', '.3f')} | {_interval(f, 'model_utility', '.3f')} | "
                     f"{_interval(f, 'shift_gap', '+.3f')} | "
                     f"{_interval(f, 'forget_truth_ratio_gap_to_reference', '+.3f')} | "
                     f"{_interval(f, 'utility_gap_to_reference', '+.3f')} |")
    if comparisons:
        lines += ["", "Each paper method against the best baseline (the baseline with the highest forget quality on "
                  "these authors): the difference, method minus baseline, on the same resampled authors.", "",
                  "| method | baseline | forget quality difference | KS D difference | model utility difference |",
                  "|" + "---|" * 5]
        for m, c in comparisons.items():
            lines.append(f"| {m} | {c['baseline']} | {_interval(c, 'forget_quality_difference', '+.3g')} | "
                         f"{_interval(c, 'ks_statistic_difference', '+.3f')} | "
                         f"{_interval(c, 'model_utility_difference', '+.3f')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
