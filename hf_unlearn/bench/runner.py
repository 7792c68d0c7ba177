"""Every method side by side on one target model, scored by one evaluator (`demo` and `bench`).

For each method and each setting of its grid, a fresh copy of the target is unlearned, timed
(wall seconds, peak resident memory sampled from ``/proc/self/status``), evaluated with
:func:`hf_unlearn.evaluation.evaluate_tofu` against the retain reference. The chosen setting of a
method is the one with the highest forget quality among those keeping model utility >= 90% of
the target's (the highest-utility setting when none does); for methods that change weights it is
re-checked after 4-bit NF4 quantization (forget ROUGE-L). GROM's wall time is also given against
one plain forward pass over forget + retain, and decoding-time methods (T3) report greedy
``generate`` tokens per second against plain ``generate``, both measured in the same process. A
failure in one method is recorded in its row and the others still run.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

UTILITY_KEEP = 0.9
COLUMNS = (
    ("forget_quality", "forget quality", ".3g"),
    ("model_utility", "model utility", ".3f"),
    ("forget_rouge_l", "forget ROUGE-L", ".3f"),
    ("forget_truth_ratio", "forget truth ratio", ".3f"),
    ("forget_rouge_l_nf4", "forget ROUGE-L (NF4)", ".3f"),
    ("seconds", "wall s", ".2f"),
    ("time_vs_grad_diff", "time / GradDiff", ".3f"),
    ("peak_rss_mb", "peak RSS MB", ".0f"),
    ("trainable_share", "trainable share", ".2e"),
    ("time_vs_forward", "time / forward pass", ".2f"),
    ("generate_speed_ratio", "generate speed vs plain", ".2f"),
)
SPEED_QUESTIONS = 16  # generation-speed batch: the first forget questions
SPEED_NEW_TOKENS = 32


def _rss_mb() -> float:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class PeakMemory:
    """Context manager sampling the process's resident memory every 20 ms; ``.peak_mb`` after exit."""

    def __init__(self, interval: float = 0.02):
        self.interval = interval
        self.peak_mb = 0.0
        self._stop = threading.Event()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_mb = max(self.peak_mb, _rss_mb())
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakMemory:
        self.peak_mb = _rss_mb()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_mb = max(self.peak_mb, _rss_mb())


def choose_setting(grid_rows: Sequence[dict[str, Any]], target_utility: float) -> int | None:
    """Index of the chosen grid row: highest forget quality with utility >= 90% of the target's.

    Rows that failed are skipped; when no row keeps enough utility, the highest-utility row.
    """
    ok = [i for i, r in enumerate(grid_rows) if r.get("error") is None]
    if not ok:
        return None
    keep = [i for i in ok if (grid_rows[i]["model_utility"] or 0) >= UTILITY_KEEP * target_utility]
    if keep:
        return max(keep, key=lambda i: (grid_rows[i]["forget_quality"] or 0, grid_rows[i]["model_utility"]))
    return max(ok, key=lambda i: grid_rows[i]["model_utility"] or 0)


def quantized_forget_rouge(model: Any, tokenizer: Any, forget_rows: list[dict[str, Any]], eval_kwargs: dict[str, Any]) -> float:
    """Forget ROUGE-L recall of greedy answers from the NF4-quantized copy of ``model``."""
    from ..evaluation import generate_answers, quantize_nf4, rouge_l_recall

    quantized = quantize_nf4(model)
    answers = generate_answers(
        quantized, tokenizer, [r["question"] for r in forget_rows],
        batch_size=eval_kwargs.get("batch_size", 16), max_new_tokens=eval_kwargs.get("max_new_tokens", 64),
    )
    scores = rouge_l_recall(answers, [r["answer"] for r in forget_rows])
    return float(sum(scores) / len(scores))


def _row_from_report(report: dict[str, Any]) -> dict[str, Any]:
    return {k: report.get(k) for k in ("forget_quality", "model_utility", "forget_rouge_l", "forget_truth_ratio", "forget_prob", "retain_prob")}


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
) -> dict[str, Any]:
    """Unlearn a fresh copy of the target with one method/setting, evaluate it; one result row."""
    from transformers import AutoModelForCausalLM

    from ..evaluation import evaluate_tofu
    from .measure import generation_speed
    from .registry import run_method

    row: dict[str, Any] = {"method": method, "settings": settings, "error": None}
    work = Path(work_dir or tempfile.mkdtemp(prefix=f"hf_unlearn_{method}_"))
    try:
        model = AutoModelForCausalLM.from_pretrained(target_path)
        with PeakMemory() as mem:
            result = run_method(method, model, tokenizer, forget_rows, retain_rows, work, settings)
        report = evaluate_tofu(
            result.model, tokenizer, source=source, forget_split=forget_split, retain_reference=reference,
            scorer=result.scorer, generation_kwargs=result.generation_kwargs, progress=False, **eval_kwargs,
        )
        row.update(_row_from_report(report))
        row.update(
            seconds=result.seconds, peak_rss_mb=mem.peak_mb, trainable_share=result.trainable_share,
            info={k: v for k, v in result.info.items() if _jsonable(v)},
        )
        row["forget_rouge_l_nf4"] = None
        processors = (result.generation_kwargs or {}).get("logits_processor")
        if processors is not None:  # decoding-time methods: tokens/s against plain generate
            speed = generation_speed(result.model, tokenizer, [r["question"] for r in forget_rows[:SPEED_QUESTIONS]],
                                     processors, max_new_tokens=SPEED_NEW_TOKENS)
            row["generate_speed_ratio"] = speed["speed_ratio"]
            row["generation_speed"] = speed
        if quantization_check:
            nf4_check(row, result, report, tokenizer, source, forget_split, eval_kwargs)
        row["_result"] = result
        row["_report"] = report
    except Exception as err:  # one method's failure must not stop the others
        row["error"] = f"{type(err).__name__}: {err}"
        row["traceback"] = traceback.format_exc(limit=8)
    finally:
        if work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return row


def nf4_check(row: dict[str, Any], result: Any, report: dict[str, Any], tokenizer: Any, source: str,
              forget_split: str, eval_kwargs: dict[str, Any]) -> None:
    """Fill ``row["forget_rouge_l_nf4"]`` for a method that changed weights (merge, quantize, regenerate)."""
    if result.weights_changed:
        n = report["splits"]["forget"]["num_examples"]
        rows = _forget_eval_rows(source, forget_split, n)
        row["forget_rouge_l_nf4"] = quantized_forget_rouge(result.model, tokenizer, rows, eval_kwargs)


def _forget_eval_rows(source: str, forget_split: str, n: int) -> list[dict[str, Any]]:
    from ..data import load_tofu_rows

    return load_tofu_rows(f"{forget_split}_perturbed", source)[:n]


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
    lines = [f"TOFU-tiny sanity gate: {'PASSED' if gate['passed'] else 'FAILED'}"]
    for name, check in gate["checks"].items():
        lines.append(f"  {name:28s} {check['value']!s:>24}  {'ok' if check['passed'] else 'FAIL'}")
    lines.append(f"  model utility: target {gate['target_model_utility']:.3f}, retain reference {gate['retain_model_utility']:.3f}")
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
) -> dict[str, Any]:
    """Run ``methods`` (their demo setting, or their whole grid when ``grid``) on ``pair.target``.

    Returns ``{"rows": {name: row}, "grid": {name: [rows]}, "target": row, "retain_reference": row}``
    where each row holds the benchmark columns.
    """
    from transformers import AutoTokenizer

    from ..data import RETAIN_FOR_FORGET, load_tofu_rows
    from .registry import METHODS
    from .subjects import load_tiny

    eval_kwargs = dict(eval_kwargs or {})
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"Unknown method(s) {unknown}; registered: {sorted(METHODS)}.")
    tokenizer = AutoTokenizer.from_pretrained(pair.target)  # the weights are loaded per method
    forget_rows = load_tofu_rows(forget_split, source)
    retain_rows = load_tofu_rows(RETAIN_FOR_FORGET[forget_split], source)
    target_report, retain_report = reference_rows(pair, source, forget_split, eval_kwargs)
    reference = retain_report
    target_row = {"method": "target", **_row_from_report(target_report), "error": None}
    retain_row = {"method": "retain reference", **_row_from_report(retain_report), "error": None}
    if quantization_check:
        target_model, _ = load_tiny(pair.target)
        n = target_report["splits"]["forget"]["num_examples"]
        target_row["forget_rouge_l_nf4"] = quantized_forget_rouge(target_model, tokenizer, _forget_eval_rows(source, forget_split, n), eval_kwargs)
    plain_forward = None
    if "grom" in methods:  # GROM's floor: one plain forward pass over forget + retain, in this process
        from .measure import plain_forward_seconds

        target_model, _ = load_tiny(pair.target)
        target_model.eval()
        plain_forward_seconds(target_model, tokenizer, forget_rows[:32])  # warm-up
        plain_forward = plain_forward_seconds(target_model, tokenizer, forget_rows + retain_rows)
        del target_model
    jobs = [(m, s) for m in methods for s in (METHODS[m].grid if grid else (METHODS[m].demo,))]
    grids: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    bar = tqdm(jobs, desc="methods", disable=not progress)
    for method, settings in bar:
        bar.set_postfix(method=method)
        row = run_one(method, dict(settings), pair.target, tokenizer, forget_rows, retain_rows, reference,
                      source, forget_split, eval_kwargs, quantization_check=False)
        grids[method].append(row)
        # The NF4 re-check is run for a row only when it is the method's chosen setting so far
        # (a later row may still replace it): the table needs it for the chosen row alone.
        result, report = row.pop("_result", None), row.pop("_report", None)
        now_chosen = choose_setting(grids[method], target_report["model_utility"]) == len(grids[method]) - 1
        if quantization_check and result is not None and now_chosen:
            try:
                nf4_check(row, result, report, tokenizer, source, forget_split, eval_kwargs)
            except Exception as err:  # the row's other numbers stand
                row["nf4_error"] = f"{type(err).__name__}: {err}"
        del result, report
    rows = {}
    for method, grid_rows in grids.items():
        idx = choose_setting(grid_rows, target_report["model_utility"])
        rows[method] = dict(grid_rows[idx if idx is not None else 0], chosen_index=idx)
    base = rows.get("grad_diff", {}).get("seconds")
    for row in [r for g in grids.values() for r in g] + list(rows.values()):
        row["time_vs_grad_diff"] = (row["seconds"] / base) if base and row.get("seconds") else None
        if row.get("method") == "grom" and plain_forward and row.get("seconds"):
            row["time_vs_forward"] = row["seconds"] / plain_forward
    return {
        "target": target_row, "retain_reference": retain_row, "rows": rows, "grid": grids,
        "sanity_gate": sanity_gate(target_report, retain_report),
        "plain_forward_seconds": plain_forward,
    }


def environment_info() -> dict[str, Any]:
    """Versions, machine and git commit recorded with every benchmark result."""
    import importlib.metadata as md

    versions = {}
    for pkg in ("torch", "transformers", "trl", "peft", "datasets", "evaluate", "accelerate", "huggingface_hub", "bitsandbytes"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                                cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    from .. import __version__

    return {
        "hf_unlearn": __version__, "python": sys.version.split()[0], "versions": versions,
        "machine": {"platform": platform.platform(), "processor": platform.machine(), "cpus": os.cpu_count()},
        "git_commit": commit, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _fmt(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return format(value, fmt)


def markdown_table(results: dict[str, Any]) -> str:
    """The benchmark table: reference rows first, then one row per method (its chosen setting)."""
    header = "| method | " + " | ".join(title for _, title, _ in COLUMNS) + " |"
    lines = [header, "|" + "---|" * (len(COLUMNS) + 1)]
    ordered = [("target", results["target"]), ("retain reference", results["retain_reference"])]
    ordered += list(results["rows"].items())
    for name, row in ordered:
        if row.get("error"):
            lines.append(f"| {name} | failed: {row['error'][:80]} |" + " |" * (len(COLUMNS) - 1))
            continue
        lines.append(f"| {name} | " + " | ".join(_fmt(row.get(k), f) for k, _, f in COLUMNS) + " |")
    return "\n".join(lines)


GRID_COLUMNS = COLUMNS[:4] + (("seconds", "wall s", ".2f"),)


def varying_settings(grid_rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each row of one method's grid, the settings whose values differ across that grid."""
    keys = sorted({k for r in grid_rows for k in r.get("settings", {})})
    varying = [k for k in keys if len({json.dumps(r.get("settings", {}).get(k)) for r in grid_rows}) > 1]
    return [{k: r.get("settings", {}).get(k) for k in varying} for r in grid_rows]


def grid_markdown_table(results: dict[str, Any]) -> str:
    """Every setting of every method's grid (the settings that vary within it), the chosen one marked."""
    lines = ["| method | setting | chosen | " + " | ".join(t for _, t, _ in GRID_COLUMNS) + " |",
             "|" + "---|" * (len(GRID_COLUMNS) + 3)]
    for method, grid_rows in results["grid"].items():
        chosen = results["rows"].get(method, {}).get("chosen_index")
        for i, (row, varied) in enumerate(zip(grid_rows, varying_settings(grid_rows))):
            setting = ", ".join(f"{k}={v}" for k, v in varied.items()) or "(single setting)"
            mark = "yes" if i == chosen else ""
            if row.get("error"):
                cells = f"failed: {row['error'][:60]} |" + " |" * (len(GRID_COLUMNS) - 1)
            else:
                cells = " | ".join(_fmt(row.get(k), f) for k, _, f in GRID_COLUMNS) + " |"
            lines.append(f"| {method} | {setting} | {mark} | {cells}")
    return "\n".join(lines)


def plot_tradeoff(results: dict[str, Any], path: str | os.PathLike, title: str) -> Path:
    """PNG of forget quality (log scale) against model utility, one labelled point per row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5), dpi=120)
    points = [("target", results["target"]), ("retain reference", results["retain_reference"])]
    points += [(name, row) for name, row in results["rows"].items() if not row.get("error")]
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
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def write_results(results: dict[str, Any], out_dir: str | os.PathLike, name: str, meta: dict[str, Any]) -> dict[str, Path]:
    """Write ``<name>.json`` (results + environment + meta), ``<name>.md`` (chosen settings),
    ``<name>_grid.md`` (every setting) and ``<name>.png``."""
    from ..evaluation import write_json_atomic

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = markdown_table(results)
    grid_table = grid_markdown_table(results)
    payload = {**meta, "environment": environment_info(), **results, "table_markdown": table,
               "grid_table_markdown": grid_table}
    json_path = write_json_atomic(payload, out / f"{name}.json")
    for suffix, text in (("", table), ("_grid", grid_table)):
        md_tmp = out / f".{name}{suffix}.md.tmp"
        md_tmp.write_text(text + "\n")
        os.replace(md_tmp, out / f"{name}{suffix}.md")
    png = plot_tradeoff(results, out / f"{name}.png", f"{name}: forget quality vs model utility")
    return {"json": Path(json_path), "markdown": out / f"{name}.md", "grid_markdown": out / f"{name}_grid.md",
            "png": png}
