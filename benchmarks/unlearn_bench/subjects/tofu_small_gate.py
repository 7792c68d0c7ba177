"""TOFU-small's sanity gate: the pair is benchmarked only when the target is distinguishable from the retain
reference, reproduces the forget answers and keeps the base subject's utility (:func:`small_gate`); the full target
and retain-reference reports are kept beside it (:func:`gate_reports`) so the benchmark does not evaluate them again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .pretrained import load_float32
from .tofu_small import SmallPair

SMALL_GATE_FQ_MAX = 1e-3
SMALL_GATE_ROUGE_MIN = 0.6
SMALL_GATE_UTILITY_KEEP = 0.9


def small_sanity_gate(target_report: dict[str, Any], retain_report: dict[str, Any],
                      base_report: dict[str, Any]) -> dict[str, Any]:
    """TOFU-small's sanity gate: the benchmark on the pair is meaningful only if all checks pass.

    target forget quality against the retain reference < 1e-3 (distinguishable); target forget
    ROUGE-L recall >= 0.6 (it learned the forget answers); the retain reference against itself =
    1.0; target model utility >= 0.9x the untouched base model's (fine-tuning kept its knowledge).
    Same shape as :func:`unlearn_bench.runner.sanity_gate` plus the base model's figures.
    """
    keep = SMALL_GATE_UTILITY_KEEP * base_report["model_utility"]
    checks = {
        "target_forget_quality": (target_report["forget_quality"], (target_report["forget_quality"] or 1.0) < SMALL_GATE_FQ_MAX),
        "target_forget_rouge_l": (target_report["forget_rouge_l"], target_report["forget_rouge_l"] >= SMALL_GATE_ROUGE_MIN),
        "retain_self_forget_quality": (retain_report["forget_quality"], retain_report["forget_quality"] == 1.0),
        "target_vs_base_model_utility": (target_report["model_utility"] / max(base_report["model_utility"], 1e-12),
                                         target_report["model_utility"] >= keep),
    }
    return {
        "title": "TOFU-small sanity gate",
        "passed": all(ok for _, ok in checks.values()),
        "checks": {k: {"value": v, "passed": ok} for k, (v, ok) in checks.items()},
        "thresholds": {"forget_quality_max": SMALL_GATE_FQ_MAX, "forget_rouge_l_min": SMALL_GATE_ROUGE_MIN,
                       "model_utility_vs_base_min": SMALL_GATE_UTILITY_KEEP},
        "target_model_utility": target_report["model_utility"],
        "retain_model_utility": retain_report["model_utility"],
        "base_model_utility": base_report["model_utility"],
        "base_forget_quality": base_report.get("forget_quality"),
        "base_forget_rouge_l": base_report["forget_rouge_l"],
        "retain_forget_rouge_l": retain_report["forget_rouge_l"],
        "general_components": general_component_ratios(target_report, base_report),
    }


def general_component_ratios(target_report: dict[str, Any], base_report: dict[str, Any],
                             keep: float = SMALL_GATE_UTILITY_KEEP) -> dict[str, Any]:
    """What fine-tuning cost the base's general knowledge: each real-author and world-fact model-utility component
    of the target as a ratio to the base's, and whether every one kept at least ``keep`` of it.

    Reported beside the gate, not part of it: a recipe that makes the target reproduce the forget answers may cost
    some general knowledge, and the figure says how much. ``{"ratios": {}, "kept": None}`` when either report
    lacks the components (a source without real authors or world facts).
    """
    target_c, base_c = target_report.get("components") or {}, base_report.get("components") or {}
    names = [f"{split}_{stat}" for split in ("real_authors", "world_facts") for stat in ("prob", "rouge_l", "truth_ratio")]
    if not all(isinstance(target_c.get(n), (int, float)) and isinstance(base_c.get(n), (int, float)) for n in names):
        return {"ratios": {}, "kept": None, "keep": keep}
    ratios = {n: float(target_c[n]) / max(float(base_c[n]), 1e-12) for n in names}
    return {"ratios": ratios, "kept": all(r >= keep for r in ratios.values()), "keep": keep}


def small_gate(pair: SmallPair, eval_kwargs: dict[str, Any] | None = None, progress: bool = True) -> dict[str, Any]:
    """Evaluate the base subject, the target and the retain reference; the gate (cached in the target folder).

    The figures are written to ``<target>/sanity_gate.json`` (with the recipe, the subject's
    provenance and the seconds each evaluation took) and reused when the evaluation settings match.
    """
    import time

    from hf_unlearn.evaluation import evaluate_tofu
    from hf_unlearn.evaluation.metrics import forget_quality
    from hf_unlearn.safe_output import atomic_write_json

    eval_kwargs = dict(eval_kwargs or {})
    cached = Path(pair.target) / "sanity_gate.json"
    # The reports file is written (just before the gate) with the same eval settings and source, and
    # gate_reports checks both, so a matching reports file means the cached gate matches too.
    if cached.is_file() and gate_reports(pair, eval_kwargs) is not None:
        return json.loads(cached.read_text())
    seconds: dict[str, float] = {}

    def run(name: str, path: Path, reference: Any = None) -> dict[str, Any]:
        model, tokenizer = load_float32(path)
        start = time.perf_counter()
        report = evaluate_tofu(model, tokenizer, source=pair.source, forget_split=pair.forget_split,
                               retain_reference=reference, progress=progress, model_name=name, **eval_kwargs)
        seconds[name] = time.perf_counter() - start
        return report

    retain_report = run("retain reference", Path(pair.retain))
    self_fq = forget_quality(retain_report.forget_truth_ratios, retain_report.forget_truth_ratios)
    retain_report.forget_quality = float(self_fq["forget_quality"])
    retain_report.ks_statistic = float(self_fq["ks_statistic"])
    target_report = run("target", Path(pair.target), retain_report)
    base_report = run("base", Path(pair.base), retain_report) if pair.base is not None else None
    # the reports' dict forms, as the gate reads them (and as they are written beside it)
    target_report, retain_report = target_report.to_dict(), retain_report.to_dict()
    base_report = base_report.to_dict() if base_report is not None else None
    gate = small_sanity_gate(target_report, retain_report, base_report)
    train = {name: json.loads((Path(p) / "tofu_small.json").read_text()).get("train_seconds")
             for name, p in (("target", pair.target), ("retain", pair.retain))}
    gate.update(
        recipe=pair.recipe, subject=pair.subject, source=pair.source, forget_split=pair.forget_split,
        target=str(pair.target), retain_reference=str(pair.retain), eval_kwargs=eval_kwargs,
        eval_seconds=seconds, train_seconds=train,
        num_examples=target_report["num_examples"],
        reports={name: {k: r.get(k) for k in ("forget_quality", "model_utility", "forget_rouge_l", "forget_truth_ratio",
                                                "forget_prob", "retain_prob", "components")}
                 for name, r in (("target", target_report), ("retain_reference", retain_report), ("base", base_report))
                 if r is not None},
    )
    # The full target / retain reports are kept beside the gate so that the benchmark scores every method
    # against them instead of evaluating both models again (two TOFU evaluations of a 135M model).
    atomic_write_json(Path(pair.target) / GATE_REPORTS_FILE, {
        "eval_kwargs": eval_kwargs, "source": pair.source,
        "target": target_report, "retain_reference": retain_report,
    })
    atomic_write_json(cached, gate)
    return gate


GATE_REPORTS_FILE = "sanity_gate_reports.json"


def gate_reports(pair: SmallPair, eval_kwargs: dict[str, Any] | None = None) -> tuple[dict, dict] | None:
    """The full (target, retain reference) TOFU reports :func:`small_gate` evaluated with ``eval_kwargs``.

    ``None`` when they were not written, or were evaluated with other settings or another source.
    """
    path = Path(pair.target) / GATE_REPORTS_FILE
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    if saved.get("eval_kwargs") != dict(eval_kwargs or {}) or saved.get("source") != pair.source:
        return None
    return saved["target"], saved["retain_reference"]
