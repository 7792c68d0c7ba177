"""TOFU evaluation: per-example statistics, aggregates through the `evaluate` metric modules,
JSON reports and tables, and the 4-bit NF4 re-check of unlearned models."""

from .generation import generate_answers
from .metrics import load_metric
from .quantization import quantize_nf4
from .report import format_report_table, load_truth_ratios, save_truth_ratios, write_json_atomic
from .rouge import rouge_l_recall
from .tofu import (
    COMPONENT_NAMES,
    answer_probability,
    evaluate_split,
    evaluate_tofu,
    evaluation_splits,
    normalized_answer_probability,
)

__all__ = [
    "COMPONENT_NAMES",
    "answer_probability",
    "evaluate_split",
    "evaluate_tofu",
    "evaluation_splits",
    "format_report_table",
    "generate_answers",
    "load_metric",
    "load_truth_ratios",
    "normalized_answer_probability",
    "quantize_nf4",
    "rouge_l_recall",
    "save_truth_ratios",
    "write_json_atomic",
]
