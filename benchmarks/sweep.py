"""The equal-budget tuning sweep (``docs/tuning-protocol.md``): every method's configurations on one author split,
each candidate scored by the criterion and TOFU's truth ratios, one configuration per method picked by the
pre-registered rule, resumable by content.

    python benchmarks/sweep.py --subject tofu-tiny --authors tuning --data TOFU_DIR --cache-dir runs/cache \\
        --output benchmarks/results/tuning_sweep_tiny [--methods npo grad_diff ...] [--stop-after N]
    python benchmarks/sweep.py --subject smollm2-135m --authors reported --chosen DIR/chosen.json ...

``--authors``: ``tuning`` (forget10 authors 5-8), ``reported`` (1-4) or ``replication`` (13-16), each with its own
pair. With ``--chosen`` (a tuning sweep's ``chosen.json``) each method runs only its chosen configuration. Writes
``sweep.json`` (every finished configuration, keyed by content; a rerun skips them), ``chosen.json`` (the rule's
pick per method whose configurations have all finished), ``sweep.md`` and ``tradeoff.png`` into ``--output``.
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
    reference_tr: list[float] = field(default_factory=list)
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
    return SweepPair(subject, Path(target), Path(retain), Path(source), base and Path(base),
                     load_tofu_rows("forget10", str(source)), load_tofu_rows("retain90", str(source))[:n_retain],
                     load_tofu_rows("holdout10", str(source)), small_retain_validation_rows(source),
                     load_tofu_rows("forget10_perturbed", str(source)))


def score_forget(model: Any, tokenizer: Any, pair: SweepPair, scorer: Any = None,
                 n_resamples: int = N_RESAMPLES) -> dict[str, Any]:
    """A candidate's forget truth ratios (no generation), forget quality and the KS statistic, each with its
    interval by author."""
    from hf_unlearn.evaluation.cluster_bootstrap import author_clusters, forget_quality_by_author
    from hf_unlearn.evaluation.tofu_stats import evaluate_split, evaluation_splits

    spec = evaluation_splits("forget10")[0]
    split = evaluate_split(model, tokenizer, pair.forget_eval, spec, scorer=scorer, progress=False, generate=False)
    tr = split["per_example"]["truth_ratio"]
    if not pair.reference_tr:
        return {"truth_ratios": tr, "forget_truth_ratio": split["truth_ratio"]}
    fq = forget_quality_by_author(tr, pair.reference_tr, author_clusters(len(tr)), n_resamples=n_resamples)
    return {**fq, "forget_truth_ratio": split["truth_ratio"], "forget_prob": split["prob"]}



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
    parser.add_argument("--output", required=True, help="folder of sweep.json, chosen.json, sweep.md, tradeoff.png")
    parser.add_argument("--methods", nargs="+", default=[*protocol.TRAINERS, "grom", "t3"])
    parser.add_argument("--chosen", default=None, help="a tuning sweep's chosen.json: run only those configurations")
    parser.add_argument("--selection-steps", type=int, default=5, help="criterion reading every N optimizer steps")
    parser.add_argument("--stop-after", type=int, default=None, help="run at most N new configurations, then stop")
    parser.add_argument("--tiny-epochs", type=int, default=None,
                        help="TOFU-tiny: train the pair for N epochs instead of 40 (a smaller pair for a slow machine)")
    args = parser.parse_args(argv)
    if args.authors != "tuning" and args.chosen is None:
        parser.error("Only the tuning authors are swept; the reported and replication runs take --chosen.")

    plan = planned_configurations(args.methods, args.chosen)  # refuses unequal budgets before any work
    from unlearn_bench.registry import load_subject_presets

    from hf_unlearn.demo import load_tiny

    presets = load_subject_presets("tofu_tiny" if args.subject == "tofu-tiny" else f"{args.subject}-v2")
    pair = build_pair(args.subject, args.authors, args.data, args.cache_dir, args.tiny_epochs)
    _, tokenizer = load_tiny(pair.target)
    reference, _ = load_tiny(pair.retain)
    pair.reference_tr = score_forget(reference.eval(), tokenizer, pair)["truth_ratios"]
    del reference
    out = Path(args.output)
    log = protocol.SweepLog(out / "sweep.json")
    context = context_of(pair, args.selection_steps)
    header = {"protocol": "docs/tuning-protocol.md", "subject": args.subject, "authors": AUTHOR_NAMES[args.authors],
              "context": context, "plan": plan, "provenance": provenance(argv)}
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


def planned_configurations(methods: list[str], chosen_path: str | None) -> dict[str, list[dict[str, Any]]]:
    """The protocol's configurations of ``methods`` (equal counts checked), or each method's chosen one."""
    import json

    if chosen_path is None:
        return protocol.protocol_configurations(methods)
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
    """``chosen.json`` and ``sweep.md`` (and ``tradeoff.png``) from the finished configurations."""
    from hf_unlearn.safe_output import atomic_write_json, atomic_write_text

    chosen = choose(records, plan)
    atomic_write_json(out / "chosen.json", {"protocol": header["protocol"], "authors": header["authors"],
                                            "chosen": chosen})
    atomic_write_text(out / "sweep.md", markdown(records, plan, chosen, header))
    plot(out / "tradeoff.png", records, plan)
    return {"chosen": chosen, "finished": len(records)}


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
            label = ", ".join(f"{k} {v:g}" for k, v in overrides.items() if k in ("learning_rate", "ridge", "rank"))
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


def plot(path: Path, records: dict[str, dict[str, Any]], plan: dict[str, list[dict[str, Any]]]) -> None:
    """Each method's candidates: forget quality against the retain change the criterion measured, one curve per
    configuration (the trade-off as the sweep sees it, without generation)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hf_unlearn.safe_output import atomic_write_bytes

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method, configs in plan.items():
        xs, ys = [], []
        for overrides in configs:
            r = _find(records, method, overrides)
            for m, s in zip((r or {}).get("selection", {}).get("measurements", []), (r or {}).get("candidate_scores", [])):
                if s and s.get("forget_quality"):
                    xs.append(m["retain_change"])
                    ys.append(s["forget_quality"])
        if xs:
            ax.scatter(xs, ys, s=12, label=method)
    ax.set_yscale("log")
    ax.set_xlabel("retain change (nats/token, retain-validation authors)")
    ax.set_ylabel("forget quality (KS p-value)")
    ax.legend(fontsize=7)
    import io

    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


if __name__ == "__main__":
    main()
