"""The comparison's anchors: the target and the retain reference evaluated on TOFU, and TOFU-tiny's sanity gate."""

from __future__ import annotations

from typing import Any


def reference_rows(pair: Any, source: str, forget_split: str, eval_kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """The TOFU reports of the target and of the retain reference (scored against itself: forget quality 1)."""
    from ..evaluation import evaluate_tofu
    from ..evaluation.metrics import forget_quality
    from .tofu_tiny import load_tiny

    retain_model, tokenizer = load_tiny(pair.retain, eval_kwargs.get("device"))
    retain_report = evaluate_tofu(retain_model, tokenizer, source=source, forget_split=forget_split, progress=False, **eval_kwargs)
    self_fq = forget_quality(retain_report.forget_truth_ratios, retain_report.forget_truth_ratios)
    retain_report.forget_quality = float(self_fq["forget_quality"])
    retain_report.ks_statistic = float(self_fq["ks_statistic"])
    target_model, _ = load_tiny(pair.target, eval_kwargs.get("device"))
    target_report = evaluate_tofu(
        target_model, tokenizer, source=source, forget_split=forget_split, retain_reference=retain_report,
        progress=False, **eval_kwargs,
    )
    return target_report, retain_report


GATE_ROUGE_MIN = 0.8
GATE_FQ_MAX = 1e-3


def sanity_gate(target_report: Any, retain_report: Any) -> dict[str, Any]:
    """TOFU-tiny's sanity gate: the target's forget ROUGE-L >= 0.8 (it memorized the forget set), its forget
    quality against the retain reference < 1e-3 (the two are told apart), the retain reference's against itself 1.0."""
    from ..evaluation.report import as_report

    target_report, retain_report = as_report(target_report), as_report(retain_report)
    checks = {
        "target_forget_rouge_l": (target_report.forget_rouge_l, target_report.forget_rouge_l >= GATE_ROUGE_MIN),
        "target_forget_quality": (target_report.forget_quality, (target_report.forget_quality or 1.0) < GATE_FQ_MAX),
        "retain_self_forget_quality": (retain_report.forget_quality, retain_report.forget_quality == 1.0),
    }
    return {
        "passed": all(ok for _, ok in checks.values()),
        "checks": {k: {"value": v, "passed": ok} for k, (v, ok) in checks.items()},
        "thresholds": {"forget_rouge_l_min": GATE_ROUGE_MIN, "forget_quality_max": GATE_FQ_MAX},
        "target_model_utility": target_report.model_utility,
        "retain_model_utility": retain_report.model_utility,
    }


def format_gate(gate: dict[str, Any]) -> str:
    """The sanity gate as printable lines."""
    lines = [f"{gate.get('title', 'TOFU-tiny sanity gate')}: {'PASSED' if gate['passed'] else 'FAILED'}"]
    for name, check in gate["checks"].items():
        lines.append(f"  {name:28s} {check['value']!s:>24}  {'ok' if check['passed'] else 'FAIL'}")
    base = f", base {gate['base_model_utility']:.3f}" if gate.get("base_model_utility") is not None else ""
    lines.append(f"  model utility: target {gate['target_model_utility']:.3f}, retain reference {gate['retain_model_utility']:.3f}{base}")
    return "\n".join(lines)
