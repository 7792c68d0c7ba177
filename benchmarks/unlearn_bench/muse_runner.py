"""The MUSE-News-small benchmark: every method on one MUSE pair, each picking its own strength, scored by MUSE.

For each method a fresh copy of the pair's target is unlearned with forget = the subset's forget documents and
retain = its retain documents, through :func:`hf_unlearn.run.fit_or_train` with a
:class:`~hf_unlearn.selection.SelectionCriterion` on documents (forget documents against the criterion's holdout
documents, the retain-validation documents no method sees; each document scored on its first ``max_length``
tokens), then evaluated by :func:`~hf_unlearn.evaluation.evaluate_muse` on the subset's data folder: C1 VerbMem,
C2 KnowMem forget, C3 PrivLeak relative to the retain reference's Min-40% AUC (on holdout texts the criterion
never reads), C4 KnowMem retain. A row also records the wall seconds (selection included), the optimizer steps,
what the criterion selected, and ``utility_kept = KnowMem retain / the target's``. A failure is recorded in its row
(``error``, ``failed_phase``, ``traceback``) and the other methods still run.

A decoding-time method's result is scored and generated through its own scorer and ``generate`` keywords
(:func:`evaluate_muse`'s ``scorer`` and ``generation_kwargs``), as the TOFU runner does.

:func:`write_muse_results` writes ``<out>.json``, ``<out>.md`` (the table, the sanity gate in its heading) and
``<out>.png`` (KnowMem retain against VerbMem forget), each atomically.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hf_unlearn.safe_output import atomic_write_json, atomic_write_text

#: Steps between two criterion measurements of a trainer run (best-checkpoint selection).
SELECTION_STEPS = 10
#: The optimizer-step budget of a trainer method that the subject's config file does not set.
DEFAULT_MAX_STEPS = 40
FIGURES = ("verbmem_forget", "knowmem_forget", "privleak", "knowmem_retain")


def muse_method_settings(methods: Sequence[str], subject: str) -> dict[str, dict[str, Any]]:
    """Each method's setting: its ``demo`` setting in ``benchmarks/configs/muse_news_<subject>.toml`` when that
    file exists and has the method, else its config's defaults with a step budget for a trainer method
    (``max_steps`` = :data:`DEFAULT_MAX_STEPS`)."""
    from hf_unlearn import registry

    from .registry import configs_dir, load_subject_presets

    path = configs_dir() / f"muse_news_{subject.replace('-', '_')}.toml"
    presets = load_subject_presets(path) if path.is_file() else {}
    out = {}
    for name in methods:
        if name in presets:
            out[name] = dict(presets[name]["demo"])
        else:
            out[name] = {"max_steps": DEFAULT_MAX_STEPS} if registry.get_method(name).is_trainer else {}
    return out


def _figures(report: Any) -> dict[str, Any]:
    return {**{k: getattr(report, k) for k in FIGURES}, "privleak_auc": report.privleak_auc}


def run_muse_one(
    method: str, settings: dict[str, Any], pair: Any, tokenizer: Any, documents: dict[str, Any], criterion: Any,
    retain_report: Any, *, eval_kwargs: dict[str, Any] | None = None, selection_steps: int = SELECTION_STEPS,
    work_dir: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Unlearn a fresh copy of ``pair.target`` with ``method`` (its strength picked by ``criterion``) and score it
    with MUSE; one result row. ``documents``: ``{"forget", "retain"}`` as ``datasets.Dataset`` text columns."""
    from transformers import AutoModelForCausalLM

    from hf_unlearn.evaluation import evaluate_muse
    from hf_unlearn.run import TrainOptions, fit_or_train, prepare_inputs

    from .rows import selected_summary, selection_applied

    row: dict[str, Any] = {"method": method, "settings": settings, "error": None}
    try:  # False for a method that stops by its own rule (the criterion only recorded beside it)
        applied = selection_applied(method)
    except KeyError:
        applied = True
    work = Path(work_dir or tempfile.mkdtemp(prefix=f"hf_unlearn_muse_{method}_"))
    phase = "training"
    try:
        model = AutoModelForCausalLM.from_pretrained(pair.target, trust_remote_code=False)
        inputs = prepare_inputs(method, model, tokenizer, documents["forget"], documents["retain"], work, settings)
        result = fit_or_train(inputs, TrainOptions(criterion=criterion, selection_steps=selection_steps))
        row["selected"] = selected_summary(result.info.get("selection"), applied=applied)
        row["candidates"] = candidate_figures(result.info.get("selection"))
        row["seconds"] = result.seconds
        row["steps"] = result.info.get("global_step")
        row["stop_reason"] = result.info.get("stop_reason")
        phase = "evaluation"
        start = time.perf_counter()
        report = evaluate_muse(result.model, tokenizer, source=pair.data, retain_reference=retain_report,
                               progress=False, model_name=method, scorer=result.scorer,
                               generation_kwargs=result.generation_kwargs, **(eval_kwargs or {}))
        row.update(_figures(report), eval_seconds=time.perf_counter() - start)
        row["warning"] = None
    except Exception as err:  # one method's failure must not stop the others
        row["error"] = f"{type(err).__name__}: {err}"
        row["failed_phase"] = phase
        row["traceback"] = traceback.format_exc(limit=8)
    finally:
        if work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return row


def candidate_figures(record: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    """Every candidate a selection record measured, compactly: the candidate and the criterion's forget NLL,
    holdout NLL, retain change, NLL shift gap and its equivalence and difference p-values there."""
    if not record:
        return None
    keys = ("forget_nll", "holdout_nll", "retain_change", "shift_gap", "equivalence_pvalue", "forget_holdout_pvalue")
    return [{"candidate": c, **{k: m.get(k) for k in keys}}
            for c, m in zip(record.get("candidates") or [], record.get("measurements") or [])]


def _criterion_factory(pair: Any, tokenizer: Any, target_model: Any, max_length: int,
                       options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """A function giving a fresh criterion on the pair's documents (the target's retain figures measured once and
    passed to each; ``options`` such as ``retain_tolerance``), and the criterion's figures on the target."""
    from hf_unlearn.selection import SelectionCriterion

    args = (pair.documents("forget"), pair.documents("holdout"), pair.documents("retain_validation"))
    first = SelectionCriterion(*args, max_length=max_length, **options)
    target_figures = first.measure(target_model, tokenizer)
    original = {k: v for k, v in target_figures.items() if k.endswith("_nll")}
    return (lambda: SelectionCriterion(*args, max_length=max_length, original=original, **options)), target_figures


def run_muse_bench(
    pair: Any, methods: Sequence[str] | None = None, *, subject: str = "tiny",
    settings: dict[str, dict[str, Any]] | None = None, eval_kwargs: dict[str, Any] | None = None,
    selection_steps: int = SELECTION_STEPS, criterion_options: dict[str, Any] | None = None, progress: bool = True,
) -> dict[str, Any]:
    """Every method in ``methods`` (default: every registered one that takes documents, :func:`document_methods`)
    on ``pair`` (a :class:`~unlearn_bench.subjects.muse_news.MusePair`); returns the results dict :func:`write_muse_results`
    writes: ``target``, ``retain_reference`` (their MUSE figures), ``gate``, ``rows`` (one per method),
    ``settings`` and the criterion's ``selection_rule``. ``settings`` replaces :func:`muse_method_settings`;
    ``criterion_options`` go to every :class:`~hf_unlearn.selection.SelectionCriterion` (``retain_tolerance``,
    ``holdout_level``); ``eval_kwargs`` to :func:`~hf_unlearn.evaluation.evaluate_muse`."""
    from hf_unlearn.data import documents_dataset
    from hf_unlearn.demo import load_tiny
    from hf_unlearn.evaluation import evaluate_muse

    from .subjects.muse_news import muse_sanity_gate

    methods = list(methods or document_methods())
    settings = settings or muse_method_settings(methods, subject)
    say = print if progress else (lambda *a, **k: None)
    retain_model, tokenizer = load_tiny(pair.retain)
    retain_report = evaluate_muse(retain_model, tokenizer, source=pair.data, progress=False,
                                  model_name="retain reference", **(eval_kwargs or {}))
    del retain_model
    target_model, tokenizer = load_tiny(pair.target)
    target_report = evaluate_muse(target_model, tokenizer, source=pair.data, retain_reference=retain_report,
                                  progress=False, model_name="target", **(eval_kwargs or {}))
    gate = muse_sanity_gate(target_report, retain_report)
    max_length = int(pair.recipe.get("max_length") or 256)
    make_criterion, target_criterion = _criterion_factory(pair, tokenizer, target_model, max_length,
                                                          dict(criterion_options or {}))
    del target_model
    documents = {"forget": documents_dataset(pair.documents("forget")),
                 "retain": documents_dataset(pair.documents("retain"))}
    rows: dict[str, dict[str, Any]] = {}
    for method in methods:
        say(f"[{method}] unlearning with selection ...", flush=True)
        criterion = make_criterion()
        row = run_muse_one(method, settings.get(method, {}), pair, tokenizer, documents, criterion, retain_report,
                           eval_kwargs=eval_kwargs, selection_steps=selection_steps)
        rows[method] = row
        say(f"[{method}] " + (f"failed in {row['failed_phase']}: {row['error']}" if row["error"] else
                              f"VerbMem {row['verbmem_forget']:.1f}, KnowMem forget {row['knowmem_forget']:.1f}, "
                              f"KnowMem retain {row['knowmem_retain']:.1f} ({row['seconds']:.1f} s)"), flush=True)
    target_utility = target_report.knowmem_retain
    for row in rows.values():
        kept = row.get("knowmem_retain")
        row["utility_kept"] = kept / target_utility if kept is not None and target_utility else None
    return {
        "subject": f"muse-news-small-{subject}", "pair": {"target": str(pair.target), "retain": str(pair.retain),
                                                          "data": str(pair.data), "recipe": pair.recipe},
        "subset": pair.subset, "gate": gate, "target": {**_figures(target_report), "criterion": target_criterion},
        "retain_reference": _figures(retain_report), "rows": rows, "settings": settings,
        "selection_rule": make_criterion().rule(), "selection_steps": selection_steps,
        "criterion_options": dict(criterion_options or {}),
        "num_examples": target_report.num_examples,
    }


def _fmt(value: Any, fmt: str = ".1f") -> str:
    return "n/a" if value is None else format(value, fmt)


def _candidate_text(candidate: Any) -> Any:
    """A candidate's settings as ``"name value, ..."`` (its edit norm left out); anything but a dict as it is."""
    if not isinstance(candidate, dict):
        return candidate
    return ", ".join(f"{k} {_fmt(v, '.3g') if isinstance(v, float) else v}" for k, v in candidate.items()
                     if k != "edit_norm")


def _selected_cell(row: dict[str, Any]) -> str:
    chosen = row.get("selected") or {}
    if not chosen:
        return ""
    figures = chosen.get("criterion") or {}
    text = f"{_candidate_text(chosen.get('candidate'))} ({chosen.get('index')} of {chosen.get('num_candidates')}; " \
           f"retain change {_fmt(figures.get('retain_change'), '+.3f')})"
    if chosen.get("applied") is False:  # the method stopped by its own rule; the criterion only looked
        pick = _candidate_text((chosen.get("criterion_choice") or {}).get("candidate"))
        text = f"own stop, {text}; the criterion's pick {pick or 'n/a'} not applied"
    return text + (" †" if chosen.get("warning") else "")


def muse_markdown_table(results: dict[str, Any], command: str | None = None) -> str:
    """The results as Markdown: a heading with the sanity gate, the target and retain reference rows, then one
    row per method (VerbMem, KnowMem forget, PrivLeak, KnowMem retain, utility kept vs the target, the selected
    candidate, seconds); failed methods show their error."""
    from .subjects.muse_news import format_muse_gate

    lines = [f"# {results['subject']}: every method, strength picked by the selection criterion", "",
             format_muse_gate(results["gate"]), ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += ["| method | VerbMem forget | KnowMem forget | PrivLeak | KnowMem retain | utility kept | selected | "
              "seconds |", "|---|---|---|---|---|---|---|---|"]
    for name, key in (("target", "target"), ("retain reference", "retain_reference")):
        r = results[key]
        kept = "1.00" if key == "target" else _fmt(
            r["knowmem_retain"] / results["target"]["knowmem_retain"] if results["target"]["knowmem_retain"] else None,
            ".2f")
        lines.append(f"| *{name}* | {_fmt(r['verbmem_forget'])} | {_fmt(r['knowmem_forget'])} | "
                     f"{_fmt(r['privleak'])} | {_fmt(r['knowmem_retain'])} | {kept} | | |")
    notes = []
    for method, row in results["rows"].items():
        if row.get("error"):
            error = row["error"].replace("|", "/").replace("\n", " ")
            lines.append(f"| {method} | failed ({row.get('failed_phase')}): {error[:120]} | | | | | | |")
            continue
        mark = " *" if row.get("warning") else ""
        lines.append(f"| {method}{mark} | {_fmt(row['verbmem_forget'])} | {_fmt(row['knowmem_forget'])} | "
                     f"{_fmt(row['privleak'])} | {_fmt(row['knowmem_retain'])} | {_fmt(row.get('utility_kept'), '.2f')}"
                     f" | {_selected_cell(row)} | {_fmt(row.get('seconds'))} |")
        if row.get("warning"):
            notes.append(f"\\* {method}: {row['warning']}.")
    n = results.get("num_examples") or {}
    lines += ["", *notes, "" if notes else None,
              f"VerbMem / KnowMem: 100 x ROUGE-L F1 ({n.get('verbmem_forget')} verbmem prompts, "
              f"{n.get('knowmem_forget')} forget and {n.get('knowmem_retain')} retain questions). PrivLeak: "
              f"(AUC - AUC_retain) / AUC_retain x 100 against the retain reference's AUC "
              f"{_fmt(results['retain_reference'].get('privleak_auc'), '.3f')} ({n.get('privleak_forget')} forget vs "
              f"{n.get('privleak_holdout')} holdout texts). Utility kept: KnowMem retain / the target's. Selected: the "
              "candidate the criterion chose (an optimizer step, a strength on an edit's path, a calibrated weight), "
              "its index among those measured, and its retain change (nats per token on the retain-validation "
              "documents; within the criterion's retain tolerance "
              f"{(results.get('selection_rule') or {}).get('retain_tolerance')}); a method with its own stopping "
              "rule keeps its own stop, the criterion's pick only recorded; † the criterion's warning: the chosen candidate's forget documents are not shown to "
              "lie within the equivalence margin of the holdout documents."]
    return "\n".join(line for line in lines if line is not None)


def plot_muse(results: dict[str, Any], path: str | os.PathLike, title: str) -> Path:
    """PNG of KnowMem retain (utility) against VerbMem forget, one labelled point per method, the target and the
    retain reference as stars; written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .report import save_figure

    fig, ax = plt.subplots(figsize=(7.5, 5), dpi=120)
    points = [("target", results["target"]), ("retain reference", results["retain_reference"])]
    points += [(m, r) for m, r in results["rows"].items() if not r.get("error")]
    at: dict[tuple[float, float], list[str]] = {}  # points that coincide (unchanged models) share one label
    for name, row in points:
        x, y = row.get("verbmem_forget"), row.get("knowmem_retain")
        if x is None or y is None:
            continue
        star = name in ("target", "retain reference")
        ax.scatter([x], [y], marker="*" if star else "o", s=110 if star else 50, zorder=3)
        at.setdefault((round(x, 1), round(y, 1)), []).append(name)
    for (x, y), names in at.items():
        lines = [", ".join(names[i : i + 4]) for i in range(0, len(names), 4)]
        ax.annotate("\n".join(lines), (x, y), textcoords="offset points", xytext=(6, 4), fontsize=7,
                    ha="right" if x > 70 else "left")
    ax.set_xlabel("VerbMem on the forget set (C1; lower = forgotten)")
    ax.set_ylabel("KnowMem on the retain set (C4; higher = utility kept)")
    ax.set_title(title)
    return save_figure(fig, path)


def document_methods() -> list[str]:
    """The registered methods that unlearn documents: every method but a trainer whose class says it takes
    question/answer rows only (``accepts_documents = False``: DPO and IdkDPO, a preferred answer needs a
    question)."""
    from hf_unlearn import registry

    names = []
    for name in registry.method_names():
        trainer = registry.get_method(name).trainer_cls
        if trainer is None or getattr(trainer, "accepts_documents", True):
            names.append(name)
    return names


def _jsonable_row(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if not k.startswith("_")}


def write_muse_results(results: dict[str, Any], out: str | os.PathLike, command: str | None = None
                       ) -> dict[str, Path | None]:
    """Write ``<out>.json`` (results, the table and the environment), ``<out>.md`` (the table) and, when
    matplotlib is installed, ``<out>.png``; each atomically. ``out`` is a path without a suffix."""
    import importlib.util

    from .report import environment_info

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    table = muse_markdown_table(results, command)
    payload = {**results, "rows": {m: _jsonable_row(r) for m, r in results["rows"].items()}, "command": command,
               "environment": environment_info(), "table_markdown": table}
    paths: dict[str, Path | None] = {"json": atomic_write_json(out.with_name(out.name + ".json"), payload),
                                     "markdown": atomic_write_text(out.with_name(out.name + ".md"), table + "\n")}
    paths["png"] = (plot_muse(results, out.with_name(out.name + ".png"), f"{out.name}: utility vs verbatim memory")
                    if importlib.util.find_spec("matplotlib") is not None else None)
    return paths


def run_muse_news(subject: str, methods: Sequence[str] | None = None, *, source: str | None = None,
                  output: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None,
                  selection_steps: int | None = None, retain_tolerance: float | None = None,
                  command: str | None = None) -> tuple[dict[str, Any], dict[str, Path | None]]:
    """The MUSE-News-small benchmark end to end, what ``unlearn-bench run --benchmark muse`` and
    ``benchmarks/muse_news.py`` run: build (or reuse) the pair of ``subject`` (``"tiny"`` or ``"smollm2-135m"``)
    from the MUSE-News folder ``source``, run ``methods`` (default: :func:`document_methods`) through
    :func:`run_muse_bench`, and write the results to ``output`` (default
    ``benchmarks/results/muse_news_<subject>``). Returns the results and the written paths."""
    from .subjects.muse_news import build_muse_small_pair, build_muse_tiny_pair

    build = build_muse_tiny_pair if subject == "tiny" else build_muse_small_pair
    pair = build(cache_dir=cache_dir, source=source)
    criterion = {"retain_tolerance": retain_tolerance} if retain_tolerance is not None else {}
    results = run_muse_bench(pair, methods, subject=subject, criterion_options=criterion,
                             selection_steps=selection_steps or SELECTION_STEPS)
    out = output or os.path.join("benchmarks", "results", f"muse_news_{subject.replace('-', '_')}")
    return results, write_muse_results(results, out, command=command)
