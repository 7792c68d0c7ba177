"""TOFU evaluation: per-example statistics, aggregates through the `evaluate` metric modules,
retain references from any published source, the typed report (TOFUReport), its JSON and tables,
the 4-bit NF4 and 8-bit re-checks of unlearned models, and the quantization and relearning attacks; the MUSE
evaluation (VerbMem, KnowMem, PrivLeak) and its typed report (MUSEReport)."""

from .attack_measure import artifact_decoding, recovered_fraction
from .attacks import (
    ATTACK_COLUMNS,
    ATTACK_NAMES,
    attack_summary,
    format_attacks,
    quantization_attack,
    relearning_attack,
    run_attacks,
)
from .generation import DEFAULT_MAX_NEW_TOKENS, generate_answers
from .memorization import exact_memorization, extraction_strength
from .metrics import load_metric
from .muse import (
    MUSE_CRITERIA,
    MUSE_HUB_ID,
    NEWS_RETRAIN_AUC,
    build_knowmem_prompt,
    evaluate_muse,
    load_muse_part,
    text_min_k_scores,
)
from .muse_report import MUSE_METRIC_DEFINITIONS, MUSEReport, is_muse_report, render_muse_report
from .privacy import (
    MIA_ATTACKS,
    loss_score,
    mia_auc,
    min_k_plus_plus_score,
    min_k_score,
    privleak,
    zlib_score,
)
from .quantization import quantize_int8, quantize_nf4
from .reference import COMPONENT_NAMES, RetainReference, check_provenance, load_retain_reference
from .report import (
    METRIC_DEFINITIONS,
    TOFUReport,
    format_report_table,
    load_truth_ratios,
    metric_definitions_text,
    render_report,
    save_truth_ratios,
    write_json_atomic,
)
from .rouge import mu_rouge, rouge_l_recall
from .tofu import evaluate_tofu
from .tofu_stats import (
    answer_probability,
    evaluate_split,
    evaluation_splits,
    mia_scores,
    normalized_answer_probability,
)

__all__ = [
    "ATTACK_COLUMNS", "ATTACK_NAMES", "COMPONENT_NAMES", "DEFAULT_MAX_NEW_TOKENS", "METRIC_DEFINITIONS",
    "MIA_ATTACKS", "MUSE_CRITERIA", "MUSE_HUB_ID", "MUSE_METRIC_DEFINITIONS", "MUSEReport",
    "NEWS_RETRAIN_AUC", "RetainReference", "TOFUReport", "answer_probability", "artifact_decoding",
    "attack_summary", "build_knowmem_prompt", "check_provenance", "evaluate_muse", "evaluate_split",
    "evaluate_tofu", "evaluation_splits", "exact_memorization", "extraction_strength", "format_attacks",
    "is_muse_report", "format_report_table", "generate_answers", "load_metric", "load_muse_part",
    "load_retain_reference", "load_truth_ratios", "loss_score", "metric_definitions_text", "mia_auc",
    "mia_scores", "min_k_plus_plus_score", "min_k_score", "mu_rouge", "normalized_answer_probability",
    "privleak", "quantization_attack", "quantize_int8", "quantize_nf4", "recovered_fraction",
    "relearning_attack", "render_muse_report", "render_report", "rouge_l_recall", "run_attacks",
    "save_truth_ratios", "text_min_k_scores", "write_json_atomic", "zlib_score",
]
