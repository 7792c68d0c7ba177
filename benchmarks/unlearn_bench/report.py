"""The benchmark's outputs: the markdown tables, the trade-off plot and the written result files.

:func:`markdown_table` shows one row per method (its chosen setting) with the fixed :data:`COLUMNS`;
:func:`grid_markdown_table` shows every setting of every grid, with the settings that vary within it,
the cost columns and any extra metrics a method reported (``Unlearned.metrics``, e.g. ATWU's token
AUROC). :func:`write_results` writes them with the JSON record (results + :func:`environment_info`)
and :func:`plot_tradeoff`'s PNG, each file atomically.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hf_unlearn.evaluation.generation import DEFAULT_MAX_NEW_TOKENS
from hf_unlearn.safe_output import atomic_write_bytes, atomic_write_json, atomic_write_text

from .bar import UTILITY_KEEP, side_utilities, utility_bar

COLUMNS = (
    ("forget_quality", "forget quality", ".3g"),
    ("forget_quality_low", "FQ 95% low", ".2g"),
    ("forget_quality_high", "FQ 95% high", ".2g"),
    ("model_utility", "model utility", ".3f"),
    ("forget_rouge_l", "forget ROUGE-L", ".3f"),
    ("forget_truth_ratio", "forget truth ratio", ".3f"),
    ("forget_rouge_l_nf4", "forget ROUGE-L (NF4)", ".3f"),
    ("seconds", "wall s", ".2f"),
    ("time_vs_grad_diff", "time / GradDiff", ".3f"),
    ("peak_rss_mb", "peak RSS MB", ".0f"),
    ("peak_added_mb", "memory added MB", ".0f"),
    ("memory_vs_forward", "memory / forward pass", ".2f"),
    ("trainable_share", "trainable share", ".2e"),
    ("time_vs_forward", "time / forward pass", ".2f"),
    ("generate_speed_ratio", "generate speed vs plain", ".2f"),
)
GRID_COLUMNS = (COLUMNS[0], *COLUMNS[3:6]) + (
    ("forget_nll", "forget NLL", ".3f"),
    ("retain_nll", "retain NLL", ".3f"),
    ("steps", "steps", "d"),
    ("seconds", "wall s", ".2f"),
    ("peak_rss_mb", "peak RSS MB", ".0f"),
    ("peak_gpu_mb", "peak GPU MB", ".0f"),
)
EXTRA_FORMAT = ".3f"


def _fmt(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return format(value, fmt)


def _table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines)


def _cells(row: dict[str, Any], columns: Sequence[tuple[str, str, str]], error_width: int) -> list[str]:
    if row.get("error"):
        return [f"failed: {row['error'][:error_width]}"] + [""] * (len(columns) - 1)
    return [_fmt(row.get(key), fmt) for key, _, fmt in columns]


def step_ceiling_notes(rows: dict[str, dict[str, Any]]) -> list[str]:
    """One line per row whose run ended at its step ceiling rather than by its own stopping rule (MASC's
    ``stop_reason == "budget"``)."""
    notes = []
    for name, row in rows.items():
        info = row.get("info") or {}
        if not row.get("error") and info.get("stop_reason") == "budget":
            steps = info.get("global_step", row.get("steps"))
            notes.append(f"{name} reached its step ceiling ({steps} steps) without its own stop: its rule never "
                         "confirmed, so the row is the budget's model, not the rule's.")
    return notes


def markdown_table(results: dict[str, Any]) -> str:
    """The benchmark table: reference rows first, then one row per method (its chosen setting). When answers were
    generated with fewer new tokens than TOFU's 200 (the demo), a line under the table says so; so does a line per
    method that reached its step ceiling without its own stop (:func:`step_ceiling_notes`)."""
    ordered = [("target", results["target"]), ("retain reference", results["retain_reference"])]
    ordered += list(results["rows"].items())
    body = [[name, *_cells(row, COLUMNS, 80)] for name, row in ordered]
    table = _table(["method", *(title for _, title, _ in COLUMNS)], body)
    notes = step_ceiling_notes(results["rows"])
    if notes:
        table += "\n\n" + "\n".join(notes)
    tokens = results.get("max_new_tokens")
    if tokens is not None and tokens < DEFAULT_MAX_NEW_TOKENS:
        table += (f"\n\nForget ROUGE-L from greedy answers of at most {tokens} new tokens (TOFU generates up to "
                  f"{DEFAULT_MAX_NEW_TOKENS}; longer answers are cut, which caps ROUGE-L).")
    return table


UTILITY_PART_COLUMNS = tuple(
    (f"{split}_{stat}", f"{title} {stat_title}", ".3f")
    for split, title in (("retain", "retain"), ("real_authors", "real authors"), ("world_facts", "world facts"))
    for stat, stat_title in (("prob", "prob"), ("rouge_l", "ROUGE-L"), ("truth_ratio", "truth ratio"))
)


def utility_parts_table(results: dict[str, Any]) -> str:
    """Model utility's nine components per row (target, retain reference, each method's chosen setting), each
    side's harmonic mean as a fraction of the target's, and whether the row passes the utility bar on the retain
    side, on the general side (each side's fraction >= 0.9), and as one number."""
    target = results["target"]
    target_sides = side_utilities(target)
    ordered = [("target", target), ("retain reference", results["retain_reference"])]
    ordered += [(name, row) for name, row in results["rows"].items() if not row.get("error")]
    body = []
    for name, row in ordered:
        parts = row.get("components") or {}
        bar = utility_bar(row, target)
        sides = side_utilities(row)
        ratios = [sides[k] / target_sides[k] if sides[k] is not None and target_sides[k] else None
                  for k in ("retain", "general")]
        body.append([name, _fmt(row.get("model_utility"), ".3f"),
                     *(_fmt(parts.get(key), fmt) for key, _, fmt in UTILITY_PART_COLUMNS),
                     *(_fmt(r, ".3f") for r in ratios),
                     *("yes" if bar[k] else "no" for k in ("retain", "general", "single"))])
    header = ["method", "model utility", *(title for _, title, _ in UTILITY_PART_COLUMNS),
              "retain side / target", "general side / target", "retain bar", "general bar", "single bar"]
    return _table(header, body)


def attacks_table(results: dict[str, Any]) -> str | None:
    """One column per attack figure (:data:`~hf_unlearn.evaluation.attacks.ATTACK_COLUMNS`) for every row: the
    target and the retain reference (the anchors, attacked the same way), then each method's chosen setting;
    ``None`` when no row was attacked."""
    from hf_unlearn.evaluation.attacks import ATTACK_COLUMNS

    ordered = [("target", results["target"]), ("retain reference", results["retain_reference"])]
    ordered += list(results["rows"].items())
    if not any(row.get("attacks") for _, row in ordered):
        return None
    columns = (("forget_rouge_l", "forget ROUGE-L", ".3f"), *((k, t, ".3f") for k, t in ATTACK_COLUMNS))
    body = []
    for name, row in ordered:
        if row.get("attack_error"):
            body.append([name, f"failed: {row['attack_error'][:80]}"] + [""] * (len(columns) - 1))
        else:
            body.append([name, *_cells(row, columns, 80)])
    return _table(["method", *(title for _, title, _ in columns)], body)


def _level_text(rule: dict[str, Any]) -> str:
    """The rule's level in words: the equivalence margin and level the chosen candidate must pass."""
    margin, level = rule.get("holdout_margin"), rule.get("holdout_level")
    if margin is None or level is None:
        return "the rule's level: see the selection rule"
    return f"the rule's level: equivalence p < {level:g} for a margin of {margin:g} nats/token"


def _interval(row: dict[str, Any]) -> str:
    ci = row.get("forget_quality_interval") or {}
    if ci.get("forget_quality_low") is None:
        return "n/a"
    return f"{ci['forget_quality_low']:.2g} - {ci['forget_quality_high']:.2g}"


def _settings_text(candidate: dict[str, Any] | None) -> str:
    """A selection candidate as ``"name=value, ..."`` (floats as ``:g``); ``""`` for none."""
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in (candidate or {}).items())


def selection_table(results: dict[str, Any]) -> str | None:
    """One row per method run with selection: the chosen candidate (for a method that stops by its own rule, its
    stop, with the rule's unapplied pick beside it), how many were measured, the criterion at the
    chosen one (forget-minus-holdout NLL shift gap, its equivalence and difference p-values, Min-K% AUC, retain
    change in nats/token), whether the choice carries a warning,
    TOFU's forget quality with its bootstrap 95% interval; then the criterion's rank correlation with forget
    quality. ``None`` when no row was selected."""
    rows = [(name, row) for name, row in results["rows"].items() if row.get("selected")]
    if not rows:
        return None

    def num(value: Any, fmt: str) -> str:
        return _fmt(value if isinstance(value, (int, float)) else None, fmt)

    body = []
    for name, row in rows:
        sel = row["selected"]
        crit = sel.get("criterion") or {}
        candidate = _settings_text(sel.get("candidate"))
        if sel.get("applied") is False:  # a method's own stop: the row is its last candidate
            pick = _settings_text((sel.get("criterion_choice") or {}).get("candidate"))
            candidate = f"own stop, {candidate} (the rule's pick {pick or 'n/a'} not applied)"
        body.append([name, candidate or "n/a", str(sel.get("num_candidates", "n/a")),
                     num(crit.get("shift_gap"), "+.3f"), num(crit.get("equivalence_pvalue"), ".3g"),
                     num(crit.get("forget_holdout_pvalue"), ".3g"), num(crit.get("mia_auc"), ".3f"),
                     num(crit.get("retain_change"), "+.3f"), "yes" if sel.get("warning") else "no",
                     _fmt(row.get("forget_quality"), ".3g"), _interval(row)])
    header = ["method", "chosen", "candidates", "NLL shift gap (forget - holdout)", "equivalence p",
              "difference p (group test)", "Min-K% AUC", "retain change (nats/token)", "warning", "forget quality",
              "forget quality 95% interval"]
    text = _table(header, body)
    anchors = [(name, (results.get(key) or {}).get("criterion") or {})
               for name, key in (("target", "target"), ("retain reference", "retain_reference"))]
    if any(crit for _, crit in anchors):
        text += "\n\nThe criterion on the anchors: " + "; ".join(
            f"{name} NLL shift gap {num(crit.get('shift_gap'), '+.3f')}, equivalence p "
            f"{num(crit.get('equivalence_pvalue'), '.3g')}, difference p {num(crit.get('forget_holdout_pvalue'), '.3g')}"
            for name, crit in anchors) + f" ({_level_text(results.get('selection_rule') or {})})."
    corr = results.get("criterion_vs_forget_quality") or {}
    if corr:
        rho = corr.get("spearman")
        text += (f"\n\nSpearman rank correlation of the criterion's p-value with TOFU's forget quality over "
                 f"{corr.get('n', 0)} rows (target, retain reference and every selected row): "
                 f"{'n/a' if rho is None else format(rho, '.2f')}.")
    return text


def extra_metric_names(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Names of the extra metrics (``row["extra_metrics"]``) that any of ``rows`` reported, first seen first."""
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row.get("extra_metrics", ())))
    return list(names)


def varying_settings(grid_rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each row of one method's grid, the settings whose values differ across that grid (a setting that a row
    does not set is left out of that row, not shown as ``None``)."""
    keys = sorted({k for r in grid_rows for k in r.get("settings", {})})
    varying = [k for k in keys if len({json.dumps(r.get("settings", {}).get(k)) for r in grid_rows}) > 1]
    return [{k: r["settings"][k] for k in varying if k in r.get("settings", {})} for r in grid_rows]


def grid_markdown_table(results: dict[str, Any]) -> str:
    """Every setting of every method's grid (the settings that vary within it), the chosen one marked,
    with the cost columns and the extra metrics any method reported."""
    extra = extra_metric_names([r for g in results["grid"].values() for r in g])
    columns = GRID_COLUMNS + tuple((name, name.replace("_", " "), EXTRA_FORMAT) for name in extra)
    body = []
    for method, grid_rows in results["grid"].items():
        chosen = results["rows"].get(method, {}).get("chosen_index")
        for i, (row, varied) in enumerate(zip(grid_rows, varying_settings(grid_rows))):
            setting = ", ".join(f"{k}={v}" for k, v in varied.items()) or "(single setting)"
            body.append([method, setting, "yes" if i == chosen else "", *_cells(row, columns, 60)])
    return _table(["method", "setting", "chosen", *(title for _, title, _ in columns)], body)


def plot_tradeoff(results: dict[str, Any], path: str | os.PathLike, title: str) -> Path:
    """PNG of forget quality (log scale) against model utility, one labelled point per row."""

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5), dpi=120)
    points = [("target", results["target"]), ("retain reference", results["retain_reference"])]
    points += [(name, row) for name, row in results["rows"].items() if not row.get("error")]
    others = [r for method, g in results.get("grid", {}).items() for i, r in enumerate(g)
              if i != results["rows"].get(method, {}).get("chosen_index") and not r.get("error")
              and r.get("forget_quality") is not None and r.get("model_utility") is not None]
    if others:  # every candidate measured, the chosen ones drawn over them
        ax.scatter([r["model_utility"] for r in others], [max(r["forget_quality"], 1e-300) for r in others],
                   marker=".", s=30, color="lightgrey", label="other candidates", zorder=0)
    placed = []
    for name, row in points:
        fq, mu = row.get("forget_quality"), row.get("model_utility")
        if fq is None or mu is None:
            continue
        marker = "*" if name in ("target", "retain reference") else "o"
        ax.scatter([mu], [max(fq, 1e-300)], marker=marker, s=90, label=name)
        placed.append((name, mu, max(fq, 1e-300)))
    ax.set_yscale("log")
    ax.set_ylim(top=10.0)
    target_mu = results["target"].get("model_utility")
    if target_mu:
        ax.axvline(UTILITY_KEEP * target_mu, color="grey", lw=0.8, ls=":")
    fig.canvas.draw()
    # Label each point; points that nearly coincide get stacked labels instead of overprinted ones.
    taken: list[tuple[float, float]] = []
    for name, mu, fq in sorted(placed, key=lambda p: (p[2], p[1])):
        x, y = ax.transData.transform((mu, fq))
        dy = 6.0
        while any(abs(x - tx) < 80 and abs(y + dy - ty) < 11 for tx, ty in taken):
            dy += 11.0
        taken.append((x, y + dy))
        ax.annotate(name, (mu, fq), textcoords="offset points", xytext=(8, dy), fontsize=8,
                    arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "grey"} if dy > 6.0 else None)
    ax.set_xlabel("model utility (dotted: 90% of the target's)")
    ax.set_ylabel("forget quality (KS p-value, log scale)")
    ax.axhline(0.05, color="grey", lw=0.8, ls="--")
    ax.set_title(title)
    return save_figure(fig, path)


def save_figure(fig: Any, path: str | os.PathLike) -> Path:
    """Write a matplotlib figure (its grid light, its layout tight) to ``path`` as PNG, atomically, and close it."""
    import io

    import matplotlib.pyplot as plt

    for ax in fig.axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buffer.getvalue())
    return path


def environment_info() -> dict[str, Any]:
    """Versions, machine and git commit recorded with every benchmark result."""
    import importlib.metadata as md

    from hf_unlearn.assets import __version__

    versions = {}
    for pkg in ("torch", "transformers", "trl", "peft", "datasets", "evaluate", "accelerate", "huggingface_hub",
                "bitsandbytes"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                                cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "hf_unlearn": __version__, "python": sys.version.split()[0], "versions": versions,
        "machine": {"platform": platform.platform(), "processor": platform.machine(), "cpus": os.cpu_count()},
        "git_commit": commit, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def print_and_save(result: dict[str, Any], table: str, out: str | os.PathLike | None) -> None:
    """Print a measurement's ``table`` and its JSON; write the JSON to ``out`` (atomically) when given."""
    print(table)
    print(json.dumps(result, indent=2))
    if out:
        atomic_write_json(out, result)


def run_speed_script(parser: Any, run: Any, table: Any, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """A speed script's main: parse ``argv``, ``result = run(args)``, print ``table(result)`` and the JSON
    (written to ``--out`` when given)."""
    args = parser.parse_args(argv)
    result = run(args)
    print_and_save(result, table(result), args.out)
    return result


def write_results(results: dict[str, Any], out_dir: str | os.PathLike, name: str, meta: dict[str, Any]
                  ) -> dict[str, Path | None]:
    """Write ``<name>.json`` (results + environment + meta), ``<name>.md`` (chosen settings),
    ``<name>_grid.md`` (every setting), ``<name>_details.md`` (utility parts, attacks) and, when matplotlib is installed, ``<name>.png``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = markdown_table(results)
    grid_table = grid_markdown_table(results)
    # <name>_details.md: the nine utility components with the bar on each side, and the attacks
    details = []
    if results["target"].get("components"):
        details.append("Model utility's parts:\n\n" + utility_parts_table(results))
    selected = selection_table(results)
    if selected is not None:
        details.append("Selection (each method's own choice of strength, reference-free):\n\n" + selected)
    attacked = attacks_table(results)
    if attacked is not None:  # "recovered": the share of the unlearning gap (forget NLL) the attack brought back
        details.append("Attacks (recovered: share of the forget-NLL gap to the target brought back):\n\n" + attacked)
    details_text = "\n\n".join(details) or None
    payload = {**meta, "environment": environment_info(), **results, "table_markdown": table,
               "grid_table_markdown": grid_table, "details_markdown": details_text}
    paths = {"json": out / f"{name}.json", "markdown": out / f"{name}.md", "grid_markdown": out / f"{name}_grid.md"}
    atomic_write_json(paths["json"], payload)
    atomic_write_text(paths["markdown"], table + "\n")
    atomic_write_text(paths["grid_markdown"], grid_table + "\n")
    if details_text is not None:
        paths["details_markdown"] = out / f"{name}_details.md"
        atomic_write_text(paths["details_markdown"], details_text + "\n")
    # the plot needs matplotlib (the `bench` extra); without it the tables and JSON are the whole result
    if importlib.util.find_spec("matplotlib") is not None:
        paths["png"] = plot_tradeoff(results, out / f"{name}.png", f"{name}: forget quality vs model utility")
    else:
        paths["png"] = None
    return paths
