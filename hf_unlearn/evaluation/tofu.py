"""The TOFU evaluator: per-example statistics on the four evaluation splits, aggregates, report.

For each split (``{forget_split}_perturbed``, ``retain_perturbed``, ``real_authors_perturbed``,
``world_facts_perturbed``), as in TOFU (Maini et al., 2024):

* answer, paraphrased-answer and perturbed-answer losses (average per-token NLL), teacher-forced
  through :mod:`hf_unlearn.logprobs` (so a custom ``scorer``, e.g. T3's tilted one, plugs in);
* probability: ``exp(-loss(answer))`` on forget/retain, the normalised
  ``p(answer) / (p(answer) + sum_j p(perturbed_j))`` on real authors / world facts;
* truth ratio ``tr_i = exp(loss(true_i) - mean_j loss(perturbed_ij))``, with the paraphrased
  answer as the true one on forget/retain and the answer on real authors / world facts;
  aggregated ``closer_to_1_better`` on forget, ``true_better`` elsewhere;
* ROUGE-L recall of the greedy answer against the gold answer.

Forget quality is the KS test of the forget truth ratios against a retain reference's; model
utility the harmonic mean of the nine retain / real-authors / world-facts components. Every
aggregate goes through the package's ``evaluate`` metric modules (:mod:`.metrics`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from .. import __version__
from ..data import FORGET_SPLITS, TOFU_HUB_ID, ensure_pad_token, load_tofu_rows
from ..logprobs import TokenScorer, answer_nll, multi_answer_nll
from . import metrics
from .generation import generate_answers
from .report import checked_truth_ratios, load_truth_ratios, write_json_atomic
from .rouge import rouge_l_recall


@dataclass(frozen=True)
class SplitSpec:
    """One evaluation split: report name, TOFU config, and whether a paraphrased answer is the truth."""

    name: str
    config: str
    paraphrased: bool
    aggregator: str


def evaluation_splits(forget_split: str) -> tuple[SplitSpec, ...]:
    """The four TOFU evaluation splits for ``forget_split`` (``forget01``/``forget05``/``forget10``)."""
    if forget_split not in FORGET_SPLITS:
        raise ValueError(f"Unknown forget split {forget_split!r}; use one of {list(FORGET_SPLITS)}.")
    return (
        SplitSpec("forget", f"{forget_split}_perturbed", True, "closer_to_1_better"),
        SplitSpec("retain", "retain_perturbed", True, "true_better"),
        SplitSpec("real_authors", "real_authors_perturbed", False, "true_better"),
        SplitSpec("world_facts", "world_facts_perturbed", False, "true_better"),
    )


UTILITY_SPLITS = ("retain", "real_authors", "world_facts")
UTILITY_STATS = ("prob", "rouge_l", "truth_ratio")
COMPONENT_NAMES = tuple(f"{split}_{stat}" for split in UTILITY_SPLITS for stat in UTILITY_STATS)


def answer_probability(answer_nll: np.ndarray) -> np.ndarray:
    """Per-token answer probability ``exp(-avg NLL)`` (TOFU's forget/retain probability)."""
    return np.exp(-np.asarray(answer_nll, dtype=np.float64))


def normalized_answer_probability(answer_nll: np.ndarray, perturbed_nll: Sequence[np.ndarray]) -> np.ndarray:
    """``p_true / (p_true + sum_j p_false_j)`` with ``p = exp(-avg NLL)`` (real authors, world facts).

    Computed in log space: ``exp(-l - logsumexp([-l, -f_1, ..., -f_k]))``.
    """
    out = np.empty(len(answer_nll), dtype=np.float64)
    for i, (true, false) in enumerate(zip(answer_nll, perturbed_nll)):
        logits = -np.concatenate([[true], np.asarray(false, dtype=np.float64)])
        top = logits.max()
        out[i] = np.exp(logits[0] - top - np.log(np.exp(logits - top).sum()))
    return out


def _cap(rows: list[dict[str, Any]], max_examples: int | None) -> list[dict[str, Any]]:
    return rows if max_examples is None else rows[:max_examples]


def _resolve_reference(
    retain_reference: str | os.PathLike | Mapping[str, Any] | None, forget_split: str
) -> tuple[list[float] | None, str | None]:
    """Forget truth ratios of the retain reference and a description, or ``(None, None)``."""
    if retain_reference is None:
        return None, None
    if isinstance(retain_reference, (str, os.PathLike)):
        data = load_truth_ratios(retain_reference)
        description = str(retain_reference)
    elif isinstance(retain_reference, Mapping):
        data = dict(
            retain_reference, forget_truth_ratios=checked_truth_ratios(retain_reference, "retain_reference")
        )
        description = str(data.get("model_name") or "report")
    else:
        raise ValueError(
            "retain_reference must be None, a path to a JSON saved by save_truth_ratios, or a report dict; "
            f"got {type(retain_reference).__name__}."
        )
    ref_split = data.get("forget_split")
    if ref_split is not None and ref_split != forget_split:
        raise ValueError(
            f"The retain reference was computed on forget split {ref_split!r}, not {forget_split!r}."
        )
    return data["forget_truth_ratios"], description


def _model_name(model: Any) -> str:
    config = getattr(model, "config", None)
    return str(
        getattr(config, "_name_or_path", None) or getattr(model, "name_or_path", None) or type(model).__name__
    )


def evaluate_split(
    model: Any,
    tokenizer: Any,
    rows: Sequence[Mapping[str, Any]],
    spec: SplitSpec,
    *,
    scorer: TokenScorer | None = None,
    generation_kwargs: Mapping[str, Any] | None = None,
    batch_size: int = 16,
    max_new_tokens: int = 64,
    progress: bool = True,
) -> dict[str, Any]:
    """TOFU statistics of one split: aggregates and per-example values (see the module docstring)."""
    questions = [r["question"] for r in rows]
    answers = [r["answer"] for r in rows]
    perturbed = [list(r["perturbed_answer"]) for r in rows]
    if any(len(p) == 0 for p in perturbed):
        raise ValueError(f"Split {spec.config!r} has a row with an empty 'perturbed_answer' list.")
    score = {"scorer": scorer, "batch_size": batch_size, "progress": progress}
    gt_nll = answer_nll(model, tokenizer, questions, answers, desc=f"{spec.name}: answers", **score)
    false_nll = multi_answer_nll(
        model, tokenizer, questions, perturbed, desc=f"{spec.name}: perturbed", **score
    )
    if spec.paraphrased:
        paraphrased = [r["paraphrased_answer"] for r in rows]
        true_nll = answer_nll(
            model, tokenizer, questions, paraphrased, desc=f"{spec.name}: paraphrased", **score
        )
        probs = answer_probability(gt_nll)
    else:
        true_nll = gt_nll
        probs = normalized_answer_probability(gt_nll, false_nll)
    tr = metrics.truth_ratio(true_nll, false_nll, spec.aggregator)
    generations = generate_answers(
        model,
        tokenizer,
        questions,
        batch_size=batch_size,
        max_new_tokens=max_new_tokens,
        generation_kwargs=generation_kwargs,
        progress=progress,
        desc=f"{spec.name}: generating",
    )
    rouge = rouge_l_recall(generations, answers)
    return {
        "config": spec.config,
        "num_examples": len(rows),
        "prob": float(np.mean(probs)),
        "rouge_l": float(np.mean(rouge)),
        "truth_ratio": float(tr["truth_ratio"]),
        "truth_ratio_aggregator": spec.aggregator,
        "per_example": {
            "answer_nll": [float(v) for v in gt_nll],
            "true_nll": [float(v) for v in true_nll],
            "perturbed_nll": [[float(v) for v in f] for f in false_nll],
            "prob": [float(v) for v in probs],
            "truth_ratio": [float(v) for v in tr["truth_ratios"]],
            "rouge_l": rouge,
            "generation": generations,
        },
    }


def evaluate_tofu(
    model: Any,
    tokenizer: Any,
    source: str = TOFU_HUB_ID,
    forget_split: str = "forget10",
    retain_reference: str | os.PathLike | Mapping[str, Any] | None = None,
    scorer: TokenScorer | None = None,
    generation_kwargs: Mapping[str, Any] | None = None,
    batch_size: int = 16,
    max_new_tokens: int = 64,
    max_examples: int | None = None,
    progress: bool = True,
    output_path: str | os.PathLike | None = None,
    model_name: str | None = None,
) -> dict[str, Any]:
    """Evaluate a causal LM on TOFU and return (and optionally write) the report.

    Args:
        model, tokenizer: any causal LM and its tokenizer (a pad token is set from EOS if missing).
        source: Hub id, local folder of ``<config>.jsonl`` files, or ``"synthetic"``.
        forget_split: ``forget01``, ``forget05`` or ``forget10``.
        retain_reference: the retain model's forget truth ratios, for forget quality: a JSON path
            written by :func:`~hf_unlearn.evaluation.save_truth_ratios`, or a report dict; ``None``
            leaves ``forget_quality`` and ``ks_statistic`` as ``None``.
        scorer: token scorer for teacher-forced losses (default: the model's own log-probs).
        generation_kwargs: extra ``model.generate`` arguments (e.g. ``logits_processor``).
        batch_size, max_new_tokens: scoring/generation batch size and generated answer length.
        max_examples: keep only the first ``max_examples`` rows of each split.
        progress: show progress bars.
        output_path: if given, the report is written there as JSON (atomically).
        model_name: name recorded in the report (default: the model's ``name_or_path``).

    Returns:
        A dict with ``forget_quality``, ``ks_statistic``, ``model_utility``, ``forget_rouge_l``,
        ``forget_truth_ratio``, ``forget_prob``, ``components`` (the nine model-utility scores),
        ``forget_truth_ratios``, ``num_examples`` (per split), ``splits`` (per-split aggregates and
        per-example values), ``source``, ``forget_split``, ``model_name``, ``retain_reference``,
        ``settings``, ``wall_time_s`` and ``hf_unlearn_version``.

    Raises:
        ValueError: bad arguments, an unknown split, rows lacking fields, empty splits, a
            tokenizer with neither pad nor EOS token, or a retain reference whose number of truth
            ratios (or forget split) differs from this evaluation's; all before any model call.
    """
    start = time.perf_counter()
    specs = evaluation_splits(forget_split)
    for name, value in (("batch_size", batch_size), ("max_new_tokens", max_new_tokens)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    if max_examples is not None and (not isinstance(max_examples, int) or max_examples < 1):
        raise ValueError(f"max_examples must be None or a positive integer, got {max_examples!r}.")
    if generation_kwargs is not None and not isinstance(generation_kwargs, Mapping):
        raise ValueError(f"generation_kwargs must be a dict, got {type(generation_kwargs).__name__}.")
    if scorer is not None and not callable(scorer):
        raise ValueError(
            "scorer must be a callable (input_ids, attention_mask, position_ids, labels) -> log-probs."
        )
    ensure_pad_token(tokenizer)
    data = {spec.name: _cap(load_tofu_rows(spec.config, source), max_examples) for spec in specs}
    reference, reference_name = _resolve_reference(retain_reference, forget_split)
    if reference is not None and len(reference) != len(data["forget"]):
        raise ValueError(
            f"The retain reference has {len(reference)} forget truth ratios but this evaluation has "
            f"{len(data['forget'])} forget examples; evaluate the retain model on the same source, "
            "forget split and max_examples."
        )

    splits: dict[str, dict[str, Any]] = {}
    for spec in tqdm(specs, desc="TOFU evaluation", disable=not progress):
        splits[spec.name] = evaluate_split(
            model,
            tokenizer,
            data[spec.name],
            spec,
            scorer=scorer,
            generation_kwargs=generation_kwargs,
            batch_size=batch_size,
            max_new_tokens=max_new_tokens,
            progress=progress,
        )

    components = {f"{s}_{stat}": splits[s][stat] for s in UTILITY_SPLITS for stat in UTILITY_STATS}
    forget_ratios = splits["forget"]["per_example"]["truth_ratio"]
    fq = metrics.forget_quality(forget_ratios, reference) if reference is not None else None
    report: dict[str, Any] = {
        "model_name": model_name or _model_name(model),
        "source": source,
        "forget_split": forget_split,
        "retain_reference": reference_name,
        "forget_quality": None if fq is None else float(fq["forget_quality"]),
        "ks_statistic": None if fq is None else float(fq["ks_statistic"]),
        "model_utility": metrics.model_utility([components[k] for k in COMPONENT_NAMES]),
        "forget_rouge_l": splits["forget"]["rouge_l"],
        "forget_truth_ratio": splits["forget"]["truth_ratio"],
        "forget_prob": splits["forget"]["prob"],
        **{k: components[k] for k in ("retain_rouge_l", "retain_prob", "retain_truth_ratio")},
        "components": components,
        "forget_truth_ratios": forget_ratios,
        "num_examples": {name: s["num_examples"] for name, s in splits.items()},
        "splits": splits,
        "settings": {
            "batch_size": batch_size,
            "max_new_tokens": max_new_tokens,
            "max_examples": max_examples,
            "custom_scorer": scorer is not None,
            "generation_kwargs": sorted(generation_kwargs or {}),
        },
        "hf_unlearn_version": __version__,
    }
    report["wall_time_s"] = time.perf_counter() - start
    if output_path is not None:
        write_json_atomic(report, output_path)
    return report
