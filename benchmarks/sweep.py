"""The equal-budget tuning sweep (``docs/tuning-protocol.md``): every method's configurations on the tuning authors,
each candidate scored by the criterion, TOFU's truth ratios and model utility without generation, one configuration
per method picked by the pre-registered rule, resumable by content.

    python benchmarks/sweep.py --subject tofu-tiny --authors tuning --data TOFU_DIR --cache-dir runs/cache \\
        --output benchmarks/results/tuning_sweep_tiny [--methods npo grad_diff ...] [--stop-after N]

Only the tuning authors (forget10 authors 5-8, their own pair) are swept; the reported and replication runs are
``benchmarks/reported_run.py``. Writes ``sweep.json`` (every finished configuration, keyed by content; a rerun skips
them), ``chosen.json`` (the rule's pick per method whose configurations have all finished), ``sweep.md`` (with the
utility-matched view), ``tradeoff.png`` and ``utility.png`` into ``--output``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from unlearn_bench.probe import CheckpointProbe  # noqa: E402


def _load_protocol() -> Any:
    spec = importlib.util.spec_from_file_location("tuning_protocol", Path(__file__).with_name("tuning_protocol.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("tuning_protocol", module)
    spec.loader.exec_module(module)
    return module


protocol = _load_protocol()

AUTHOR_OFFSETS = {"tuning": 4, "reported": 0, "replication": 12}
AUTHOR_NAMES = {"tuning": "forget10 authors 5-8", "reported": "forget10 authors 1-4",
                "replication": "forget10 authors 13-16"}
N_RESAMPLES = 1000  # the chosen candidate's interval by author
PROBE_RESAMPLES = 200  # every other candidate's (it is shown, never read by a rule)
AXIS_KEYS = ("learning_rate", "ridge", "rank", *(key for key, _ in protocol.MAIN_WEIGHTS.values()))


@dataclass
class SweepPair:
    """A pair for one author split, its rows and the retain reference's forget truth ratios."""

    subject: str
    target: Path
    retain: Path
    source: Path
    base: Path | None
    forget: list[dict[str, Any]]
    retain_rows: list[dict[str, Any]]
    holdout: list[dict[str, Any]]
    validation: list[dict[str, Any]]
    forget_eval: list[dict[str, Any]]
    utility_rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    rows_per_author: int = 20
    reference_tr: list[float] = field(default_factory=list)
    target_utility: float | None = None
    criteria: dict[str | None, Any] = field(default_factory=dict)


def build_pair(subject: str, authors: str, data: str, cache_dir: str, tiny_epochs: int | None = None) -> SweepPair:
    """The subject's TOFU-small v2 pair for ``authors``: SmolLM2 fine-tuned on it, or TOFU-tiny (models trained
    from scratch on the same v2 rows: its 4 forget authors, the first 4 retain authors, real authors, world facts;
    ``tiny_epochs`` replaces the recipe's 40 epochs, a smaller pair for a slow machine)."""
    from unlearn_bench.subjects.tofu_small import (
        SmallRecipe,
        build_small_pair,
        small_retain_validation_rows,
        small_tofu_configs,
        write_small_source,
    )

    from hf_unlearn.data import load_tofu_rows
    from hf_unlearn.demo import build_tiny_pair, recipe_for
    from hf_unlearn.evaluation.tofu_stats import evaluation_splits

    recipe = SmallRecipe.v2(subject if subject != "tofu-tiny" else "smollm2-135m", forget_offset=AUTHOR_OFFSETS[authors])
    if subject == "tofu-tiny":
        tiny = recipe_for("tofu-test")
        if tiny_epochs is not None:
            tiny = replace(tiny, epochs=tiny_epochs)
        source = write_small_source(small_tofu_configs(data, recipe),
                                    Path(cache_dir) / f"tofu-tiny-v2-offset{recipe.forget_offset}")
        pair = build_tiny_pair(str(source), "forget10", tiny, cache_dir, progress=False)
        target, retain, base, n_retain = pair.target, pair.retain, None, tiny.retain_rows
    else:
        pair = build_small_pair(subject, data, recipe=recipe, cache_dir=cache_dir, progress=False)
        target, retain, base, source, n_retain = pair.target, pair.retain, pair.base, Path(pair.source), None
    utility = {s.name: load_tofu_rows(s.config, str(source)) for s in evaluation_splits("forget10")[1:]}
    return SweepPair(subject, Path(target), Path(retain), Path(source), base and Path(base),
                     load_tofu_rows("forget10", str(source)), load_tofu_rows("retain90", str(source))[:n_retain],
                     load_tofu_rows("holdout10", str(source)), small_retain_validation_rows(source),
                     load_tofu_rows("forget10_perturbed", str(source)), utility)


def score_forget(model: Any, tokenizer: Any, pair: SweepPair, scorer: Any = None,
                 n_resamples: int = N_RESAMPLES) -> dict[str, Any]:
    """A candidate's forget truth ratios (no generation), forget quality and the KS statistic, each with its
    interval by author, and (where the pair has utility rows) its model utility without generation
    (:func:`tuning_protocol.model_utility_without_generation`)."""
    from hf_unlearn.evaluation.cluster_bootstrap import author_clusters, forget_quality_by_author
    from hf_unlearn.evaluation.tofu_stats import evaluate_split, evaluation_splits

    specs = evaluation_splits("forget10")
    split = evaluate_split(model, tokenizer, pair.forget_eval, specs[0], scorer=scorer, progress=False, generate=False)
    tr = split["per_example"]["truth_ratio"]
    utility = {}
    if pair.utility_rows:
        parts = {}
        for spec in specs[1:]:
            rows = evaluate_split(model, tokenizer, pair.utility_rows[spec.name], spec, scorer=scorer, progress=False,
                                  generate=False)["per_example"]
            parts[spec.name] = {"prob": rows["prob"], "truth_ratio": rows["truth_ratio"]}
        utility = {"model_utility": protocol.model_utility_without_generation(parts)}
    if not pair.reference_tr:
        return {"truth_ratios": tr, "forget_truth_ratio": split["truth_ratio"], **utility}
    fq = forget_quality_by_author(tr, pair.reference_tr, author_clusters(len(tr), pair.rows_per_author),
                                  n_resamples=n_resamples)
    return {**fq, "forget_truth_ratio": split["truth_ratio"], "forget_prob": split["prob"], **utility}


def make_criterion(pair: SweepPair, tokenizer: Any, template: str | None) -> Any:
    """The selection criterion on the pair's forget, holdout and retain-validation rows (by author; the base's
    NLLs as reference where the pair has a base), its original figures the target's."""
    from unlearn_bench.criterion import selection_criterion_options

    from hf_unlearn.demo import load_tiny
    from hf_unlearn.selection import SelectionCriterion

    options = selection_criterion_options(pair, pair.forget, pair.holdout, pair.validation, tokenizer,
                                          {template, None})
    options = {t: {"groups": "tofu_authors", **o} for t, o in options.items()}
    model, _ = load_tiny(pair.target)
    own = SelectionCriterion(pair.forget, pair.holdout, pair.validation, **options[None]).measure(model, tokenizer)
    original = {k: v for k, v in own.items() if k.endswith("_nll")}
    return SelectionCriterion(pair.forget, pair.holdout, pair.validation, template=template, original=original,
                              **options[template])


def run_configuration(method: str, settings: dict[str, Any], pair: SweepPair, tokenizer: Any,
                      selection_steps: int) -> dict[str, Any]:
    """One configuration: the method run with its strength chosen by the criterion, every checkpoint of a trainer
    scored by the probe, the chosen candidate scored; ``seconds`` is the run without the probe's scoring."""
    from hf_unlearn import registry
    from hf_unlearn.demo import load_tiny
    from hf_unlearn.run import TrainOptions, fit_or_train, prepare_inputs

    trainer = registry.get_method(method).is_trainer
    model, _ = load_tiny(pair.target)
    template = settings.get("prompt_template")
    criterion = pair.criteria.get(template) or pair.criteria.setdefault(template, make_criterion(pair, tokenizer, template))
    probe = CheckpointProbe(lambda m: score_forget(m, tokenizer, pair, n_resamples=PROBE_RESAMPLES), selection_steps)
    options = TrainOptions(callbacks=[probe] if trainer else (), criterion=criterion, selection_steps=selection_steps)
    with tempfile.TemporaryDirectory(prefix=f"sweep-{method}-") as work:
        inputs = prepare_inputs(method, model, tokenizer, pair.forget, pair.retain_rows, work, dict(settings))
        result = fit_or_train(inputs, options)
        start = time.perf_counter()
        result.model.eval()
        chosen = score_forget(result.model, tokenizer, pair, scorer=result.scorer)
        chosen_seconds = time.perf_counter() - start
    probe_seconds = sum(probe.seconds.values())
    selection = result.info["selection"]
    candidates = ([probe.scores.get(int(c["step"])) for c in selection["candidates"]] if trainer
                  else [None] * len(selection["candidates"]))
    candidates[selection["index"]] = chosen
    return {"method": method, "settings": settings, "selection": selection, "candidate_scores": candidates,
            "seconds": result.seconds - probe_seconds, "scoring_seconds": probe_seconds + chosen_seconds,
            "outcome": asdict(protocol.outcome_from_selection(0, selection))}


def context_of(pair: SweepPair, selection_steps: int) -> dict[str, Any]:
    """What a configuration's result depends on besides its settings: the models by content, the rows, the rule."""
    from unlearn_bench.resume import model_fingerprint, rows_digest

    return {"target": model_fingerprint(pair.target), "retain_reference": model_fingerprint(pair.retain),
            "rows": rows_digest(pair.forget, pair.retain_rows, pair.holdout, pair.validation, pair.forget_eval),
            "selection_steps": selection_steps, "n_resamples": [N_RESAMPLES, PROBE_RESAMPLES]}


def choose(records: dict[str, dict[str, Any]], plan: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The rule's configuration per method whose planned configurations have all finished."""
    chosen = {}
    for method, configs in plan.items():
        finished = [_find(records, method, c) for c in configs]
        if all(r is not None for r in finished):
            outcomes = [protocol.outcome_from_selection(i, r["selection"]) for i, r in enumerate(finished)]
            index = protocol.choose_configuration(outcomes)
            chosen[method] = {"index": index, "overrides": configs[index], "settings": finished[index]["settings"]}
    return chosen


def _find(records: dict[str, dict[str, Any]], method: str, overrides: dict[str, Any]) -> dict[str, Any] | None:
    for r in records.values():
        if r["method"] == method and r.get("overrides") == overrides:
            return r
    return None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subject", default="tofu-tiny", help="tofu-tiny or a pretrained subject (smollm2-135m)")
    parser.add_argument("--authors", choices=sorted(AUTHOR_OFFSETS), default="tuning")
    parser.add_argument("--data", default=os.environ.get("HF_UNLEARN_TOFU_DIR", "locuslab/TOFU"))
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--output", required=True, help="folder of sweep.json, chosen.json, sweep.md and the figures")
    parser.add_argument("--methods", nargs="+", default=[*protocol.TRAINERS, "grom", "t3"])
    parser.add_argument("--selection-steps", type=int, default=5, help="criterion reading every N optimizer steps")
    parser.add_argument("--second-axis", action="store_true",
                        help="join each learning rate with every value of the method's main weight (NPO's beta, "
                             "SimNPO's delta, GradDiff's retain weight, ATWU's token budget)")
    parser.add_argument("--stop-after", type=int, default=None, help="run at most N new configurations, then stop")
    parser.add_argument("--tiny-epochs", type=int, default=None,
                        help="TOFU-tiny: train the pair for N epochs instead of 40 (a smaller pair for a slow machine)")
    args = parser.parse_args(argv)
    if args.authors != "tuning":
        parser.error("Only the tuning authors are swept; the reported and replication runs are "
                     "benchmarks/reported_run.py.")

    try:  # refuses unequal budgets before any work
        plan = planned_configurations(args.methods, None, args.second_axis)
    except ValueError as error:
        parser.error(str(error))
    from unlearn_bench.registry import load_subject_presets

    from hf_unlearn.demo import load_tiny

    presets = load_subject_presets("tofu_tiny" if args.subject == "tofu-tiny" else f"{args.subject}-v2")
    pair = build_pair(args.subject, args.authors, args.data, args.cache_dir, args.tiny_epochs)
    _, tokenizer = load_tiny(pair.target)
    reference, _ = load_tiny(pair.retain)
    pair.reference_tr = score_forget(reference.eval(), tokenizer, pair)["truth_ratios"]
    del reference
    target, _ = load_tiny(pair.target)
    pair.target_utility = score_forget(target.eval(), tokenizer, pair).get("model_utility")
    del target
    out = Path(args.output)
    log = protocol.SweepLog(out / "sweep.json")
    context = context_of(pair, args.selection_steps)
    header = {"protocol": "docs/tuning-protocol.md", "subject": args.subject, "authors": AUTHOR_NAMES[args.authors],
              "context": context, "plan": plan, "target_model_utility": pair.target_utility,
              "settings": {m: [{**presets[m]["demo"], **o} for o in configs] for m, configs in plan.items()},
              "provenance": provenance(argv)}
    ran = 0
    for method, configs in plan.items():
        for overrides in configs:
            settings = {**presets[method]["demo"], **overrides}
            key = protocol.configuration_key(method, settings, context)
            if log.done(key):
                continue
            if args.stop_after is not None and ran >= args.stop_after:
                break
            print(f"{method} {overrides}", flush=True)
            record = run_configuration(method, settings, pair, tokenizer, args.selection_steps)
            log.add(key, {**record, "overrides": overrides}, header)
            ran += 1
    return write_outputs(out, log.records, plan, header)


def planned_configurations(methods: list[str], chosen_path: str | None,
                           second_axis: bool = False) -> dict[str, list[dict[str, Any]]]:
    """The protocol's configurations of ``methods`` (equal counts checked), or each method's chosen one."""
    import json

    if chosen_path is None:
        return protocol.protocol_configurations(methods, second_axis)
    chosen = json.loads(Path(chosen_path).read_text(encoding="utf-8"))["chosen"]
    missing = [m for m in methods if m not in chosen]
    if missing:
        raise SystemExit(f"{chosen_path} has no chosen configuration for {missing}.")
    return {m: [chosen[m]["overrides"]] for m in methods}


def provenance(argv: list[str] | None) -> dict[str, Any]:
    import platform
    import subprocess

    import torch
    import transformers

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False,
                                cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        commit = None
    return {"command": "python benchmarks/sweep.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "code_commit": commit, "torch": torch.__version__, "transformers": transformers.__version__,
            "machine": platform.machine(), "python": platform.python_version(), "cpu_count": os.cpu_count()}


def write_outputs(out: Path, records: dict[str, dict[str, Any]], plan: dict[str, list[dict[str, Any]]],
                  header: dict[str, Any]) -> dict[str, Any]:
    """``chosen.json``, ``sweep.md`` (with the utility-matched view), ``tradeoff.png`` and ``utility.png`` from the
    finished configurations."""
    from hf_unlearn.safe_output import atomic_write_json, atomic_write_text

    if "settings" in header:
        records = planned_records(records, plan, header["settings"])
    chosen = choose(records, plan)
    atomic_write_json(out / "chosen.json", {"protocol": header["protocol"], "authors": header["authors"],
                                            "chosen": chosen})
    view = utility_view(records, plan, chosen, header.get("target_model_utility"))
    atomic_write_text(out / "sweep.md", markdown(records, plan, chosen, header) + view_markdown(view, header))
    plot(out / "tradeoff.png", records, plan)
    plot_utility(out / "utility.png", records, plan, header.get("target_model_utility"))
    return {"chosen": chosen, "finished": len(records), "utility_view": view}


def planned_records(records: dict[str, dict[str, Any]], plan: dict[str, list[dict[str, Any]]],
                    settings: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The finished record of each planned configuration, found by its full settings (a configuration the log
    holds under another plan with the same settings is the same run), labelled with this plan's overrides."""
    out = {}
    for method, configs in plan.items():
        for overrides, full in zip(configs, settings[method]):
            r = next((r for r in records.values() if r["method"] == method and r["settings"] == full), None)
            if r is not None:
                out[f"{method}/{len(out)}"] = {**r, "overrides": overrides}
    return out


def scored_candidates(records: dict[str, dict[str, Any]], method: str,
                      configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every scored candidate of ``method``'s finished configurations, in the protocol's order: its forget quality,
    model utility (without generation), configuration index and candidate."""
    out = []
    for i, overrides in enumerate(configs):
        r = _find(records, method, overrides)
        for k, score in enumerate((r or {}).get("candidate_scores", [])):
            if score and score.get("forget_quality") is not None:
                out.append({"forget_quality": score["forget_quality"], "model_utility": score.get("model_utility"),
                            "configuration": i, "candidate": r["selection"]["candidates"][k]})
    return out


def utility_view(records: dict[str, dict[str, Any]], plan: dict[str, list[dict[str, Any]]], chosen: dict[str, Any],
                 target_utility: float | None) -> dict[str, dict[str, Any]]:
    """Per method, the rule's pick (the user's view) beside the best forget quality among every scored candidate
    that keeps 90% of the target's model utility (the oracle view, :func:`tuning_protocol.utility_matched_view`)."""
    view = {}
    for method, configs in plan.items():
        pick = None
        if method in chosen:
            r = _find(records, method, chosen[method]["overrides"])
            score = r["candidate_scores"][r["selection"]["index"]] or {}
            pick = {"forget_quality": score.get("forget_quality"), "model_utility": score.get("model_utility"),
                    "configuration": chosen[method]["index"]}
        candidates = scored_candidates(records, method, configs)
        oracle = (protocol.utility_matched_view(candidates, target_utility)
                  if target_utility is not None else None)
        view[method] = {"rule": pick, "oracle": oracle, "scored_candidates": len(candidates),
                        "utility_measured": any(c["model_utility"] is not None for c in candidates)}
    return view


def view_markdown(view: dict[str, dict[str, Any]], header: dict[str, Any]) -> str:
    target = header.get("target_model_utility")
    lines = ["", "## The utility-matched view", "",
             "Model utility here is the truth-ratio and probability part of TOFU's model utility (retain, real "
             "authors, world facts; no generation), target "
             f"{_fmt(target, '.3f')}. The oracle column reads forget quality, which the rule never does.", "",
             "| method | the rule's pick: forget quality | its model utility | best forget quality at >= 90% of the "
             "target's utility (oracle) | its model utility | its configuration, candidate | scored candidates |",
             "|" + "---|" * 7]
    for method, v in view.items():
        rule, oracle = v["rule"] or {}, v["oracle"] or {}
        measured = target is not None and v["utility_measured"]
        where = (f"{oracle['configuration']}, {', '.join(f'{k} {c:g}' for k, c in oracle['candidate'].items())}"
                 if oracle else "none keeps 90%" if measured else "utility not measured" if v["scored_candidates"]
                 else "")
        lines.append(f"| {method} | {_fmt(rule.get('forget_quality'))} | {_fmt(rule.get('model_utility'), '.3f')} | "
                     f"{_fmt(oracle.get('forget_quality'))} | {_fmt(oracle.get('model_utility'), '.3f')} | {where} | "
                     f"{v['scored_candidates']} |")
    return "\n".join(lines) + "\n"


def _fmt(value: Any, spec: str = ".3g") -> str:
    return "n/a" if value is None else format(value, spec)


def markdown(records: dict[str, dict[str, Any]], plan: dict[str, list[dict[str, Any]]], chosen: dict[str, Any],
             header: dict[str, Any]) -> str:
    """Every configuration's chosen candidate (criterion figures, forget quality with its interval by author, KS
    D), the rule's pick per method, and each method's cost."""
    finished = sum(_find(records, m, c) is not None for m, cs in plan.items() for c in cs)
    total = sum(len(cs) for cs in plan.values())
    lines = [f"# Tuning sweep: {header['subject']}, {header['authors']}", "",
             f"{finished} of {total} configurations finished; the rule ([tuning-protocol.md](../../../docs/"
             "tuning-protocol.md)) picks a configuration once all of a method's have finished. Forget quality is "
             "shown, never read by the rule.", "",
             "| method | configuration | chosen candidate | NLL shift gap | equivalence p | retain change | "
             "forget quality (95% interval by author) | KS D | train s | scoring s | |", "|" + "---|" * 11]
    for method, configs in plan.items():
        cost = 0.0
        for i, overrides in enumerate(configs):
            r = _find(records, method, overrides)
            label = ", ".join(f"{k} {v:g}" for k, v in overrides.items() if k in AXIS_KEYS)
            if r is None:
                lines.append(f"| {method} | {label} | not run yet | | | | | | | | |")
                continue
            cost += r["seconds"]
            sel, o = r["selection"], r["outcome"]
            s = r["candidate_scores"][sel["index"]] or {}
            cand = sel["candidates"][sel["index"]]
            where = f"step {cand['step']}" if "step" in cand else ", ".join(f"{k} {v:g}" for k, v in cand.items()
                                                                          if isinstance(v, (int, float)))
            mark = "**picked**" if chosen.get(method, {}).get("index") == i else ""
            lines.append(f"| {method} | {label} | {where} | {o['shift_gap']:+.3f} | {o['equivalence_pvalue']:.3g} | "
                         f"{o['retain_change']:+.3f} | {_fmt(s.get('forget_quality'))} "
                         f"({_fmt(s.get('forget_quality_low'), '.2g')} - {_fmt(s.get('forget_quality_high'), '.2g')})"
                         f" | {_fmt(s.get('ks_statistic'), '.3f')} | {r['seconds']:.0f} | {r['scoring_seconds']:.0f} |"
                         f" {mark} |")
        lines.append(f"| {method} | cost so far | | | | | | | {cost:.0f} | | |")
    return "\n".join(lines) + "\n"


def plot_utility(path: Path, records: dict[str, dict[str, Any]], plan: dict[str, list[dict[str, Any]]],
                 target_utility: float | None) -> None:
    """Each method's forget quality against model utility (without generation), one line per configuration
    through its candidates in order, and the 90% bar of the target's utility."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n, (method, configs) in enumerate(plan.items()):
        style, labelled = _method_style(n), False
        for i in range(len(configs)):
            points = [(c["model_utility"], c["forget_quality"]) for c in scored_candidates(records, method, configs)
                      if c["configuration"] == i and c["model_utility"] is not None and c["forget_quality"] > 0]
            if points:
                ax.plot(*zip(*points), ms=3, lw=0.8, label=None if labelled else method, **style)
                labelled = True
    if target_utility is not None:
        ax.axvline(0.9 * target_utility, color="grey", ls="--", lw=0.8, label="90% of the target's utility")
    _save_forget_quality_plot(fig, ax, "model utility (truth ratio and probability part, no generation)", path)


def _method_style(n: int) -> dict[str, str]:
    """The ``n``-th method's colour and marker: ten colours, then the next marker, so no two methods look alike."""
    return {"color": f"C{n % 10}", "marker": "os^D"[n // 10 % 4]}


def _save_forget_quality_plot(fig: Any, ax: Any, xlabel: str, path: Path) -> None:
    """Forget quality on a log axis against ``xlabel``, the legend when there is one, saved as PNG."""
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("forget quality (KS p-value)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    _save(fig, path)


def _save(fig: Any, path: Path) -> None:
    import io

    import matplotlib.pyplot as plt

    from hf_unlearn.safe_output import atomic_write_bytes

    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def plot(path: Path, records: dict[str, dict[str, Any]], plan: dict[str, list[dict[str, Any]]]) -> None:
    """Each method's candidates: forget quality against the retain change the criterion measured, one curve per
    configuration (the trade-off as the sweep sees it, without generation)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n, (method, configs) in enumerate(plan.items()):
        xs, ys = [], []
        for overrides in configs:
            r = _find(records, method, overrides)
            for m, s in zip((r or {}).get("selection", {}).get("measurements", []), (r or {}).get("candidate_scores", [])):
                if s and s.get("forget_quality"):
                    xs.append(m["retain_change"])
                    ys.append(s["forget_quality"])
        if xs:
            ax.scatter(xs, ys, s=12, label=method, **_method_style(n))
    _save_forget_quality_plot(fig, ax, "retain change (nats/token, retain-validation authors)", path)


if __name__ == "__main__":
    main()
