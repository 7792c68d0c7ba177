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

Beyond TOFU's table, as open-unlearning reports it: extraction strength and exact memorization on
the forget answers (:mod:`.memorization`), the membership-inference AUCs of the forget split against
the matching ``holdoutNN`` split and privleak (:mod:`.privacy`), and MU-ROUGE (:func:`.rouge.mu_rouge`).

Prompts come from one :class:`hf_unlearn.data.PromptTemplate` (``template=``); every sequence is
truncated at the answer end to the model's maximum positions (a prompt that does not fit is refused)
and generation stops there too. A retain reference is read by :func:`.reference.load_retain_reference`
from any supported source, and refused when its recorded provenance differs from this evaluation's.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from .. import __version__
from ..data import (
    FORGET_SPLITS,
    HOLDOUT_FOR_FORGET,
    TOFU_HUB_ID,
    PromptTemplate,
    ensure_pad_token,
    load_tofu_rows,
    model_max_positions,
    resolve_template,
    template_fingerprint,
    tokenize_qa,
)
from ..logprobs import (
    AnswerTokenStatistics,
    TokenScorer,
    answer_nll,
    answer_token_statistics,
    model_device,
    multi_answer_nll,
)
from . import metrics
from .attacks import attack_summary, check_attack_options, parse_attacks, run_attacks
from .generation import DEFAULT_MAX_NEW_TOKENS, generate_answers
from .memorization import exact_memorization, extraction_strength
from .privacy import (
    MIA_ATTACKS,
    MIN_K_FRACTION,
    loss_score,
    mia_auc,
    min_k_plus_plus_score,
    min_k_score,
    privleak,
    zlib_score,
)
from .reference import (
    COMPONENT_NAMES,
    UTILITY_SPLITS,
    UTILITY_STATS,
    RetainReference,
    check_provenance,
    load_retain_reference,
    rows_fingerprint,
    tokenizer_fingerprint,
    warn_unknown_provenance,
)
from .report import TOFUReport, write_json_atomic
from .rouge import mu_rouge, rouge_l_recall


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


def _model_name(model: Any) -> str:
    config = getattr(model, "config", None)
    return str(
        getattr(config, "_name_or_path", None) or getattr(model, "name_or_path", None) or type(model).__name__
    )


def _count_truncated(
    tokenizer: Any, questions: Sequence[str], answers: Sequence[str], limit: int | None, template: PromptTemplate
) -> int:
    if limit is None:
        return 0
    return sum(len(tokenize_qa(tokenizer, q, a, template=template)["input_ids"]) > limit for q, a in zip(questions, answers))


def evaluate_split(
    model: Any,
    tokenizer: Any,
    rows: Sequence[Mapping[str, Any]],
    spec: SplitSpec,
    *,
    scorer: TokenScorer | None = None,
    generation_kwargs: Mapping[str, Any] | None = None,
    batch_size: int = 16,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    template: str | PromptTemplate | None = None,
    answer_nll_values: np.ndarray | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """TOFU statistics of one split: aggregates and per-example values (see the module docstring).

    ``answer_nll_values`` (the answers' average NLLs, when already computed) skips scoring the answers again.
    """
    template = resolve_template(tokenizer, template)
    questions = [r["question"] for r in rows]
    answers = [r["answer"] for r in rows]
    perturbed = [list(r["perturbed_answer"]) for r in rows]
    if any(len(p) == 0 for p in perturbed):
        raise ValueError(f"Split {spec.config!r} has a row with an empty 'perturbed_answer' list.")
    score = {"scorer": scorer, "batch_size": batch_size, "progress": progress, "template": template}
    if answer_nll_values is None:
        gt_nll = answer_nll(model, tokenizer, questions, answers, desc=f"{spec.name}: answers", **score)
    else:
        gt_nll = np.asarray(answer_nll_values, dtype=np.float64)
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
        template=template,
        progress=progress,
        desc=f"{spec.name}: generating",
    )
    rouge = rouge_l_recall(generations, answers)
    limit = model_max_positions(model)
    texts = answers + [a for p in perturbed for a in p] + ([r["paraphrased_answer"] for r in rows] if spec.paraphrased else [])
    qs = questions + [q for q, p in zip(questions, perturbed) for _ in p] + (questions if spec.paraphrased else [])
    return {
        "config": spec.config,
        "num_examples": len(rows),
        "prob": float(np.mean(probs)),
        "rouge_l": float(np.mean(rouge)),
        "truth_ratio": float(tr["truth_ratio"]),
        "truth_ratio_aggregator": spec.aggregator,
        "num_truncated": _count_truncated(tokenizer, qs, texts, limit, template),
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


def mia_scores(
    stats: AnswerTokenStatistics, tokenizer: Any, k: float = MIN_K_FRACTION
) -> dict[str, list[float] | None]:
    """Per-example attack scores (loss-like: higher = less likely a member) for each attack in ``MIA_ATTACKS``:
    loss, zlib (on the decoded answer tokens, special tokens dropped, as open-unlearning), Min-K% and Min-K%++
    (``None`` without full-vocabulary statistics, i.e. under a custom scorer)."""
    texts = [tokenizer.decode([int(t) for t in ids], skip_special_tokens=True) for ids in stats.token_ids]
    out: dict[str, list[float] | None] = {
        "loss": [loss_score(lp) for lp in stats.token_log_probs],
        "zlib": [zlib_score(lp, text) for lp, text in zip(stats.token_log_probs, texts)],
        "min_k": [min_k_score(lp, k) for lp in stats.token_log_probs],
        "min_k_plus_plus": None,
    }
    if stats.vocab_mean is not None and stats.vocab_var is not None:
        out["min_k_plus_plus"] = [
            min_k_plus_plus_score(lp, mu, var, k)
            for lp, mu, var in zip(stats.token_log_probs, stats.vocab_mean, stats.vocab_var)
        ]
    return out


AUTOCAST_DTYPES = (None, "bfloat16", "float16")


def model_autocast(model: Any, dtype: str | None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` on the model's device type with ``dtype`` (a no-op context for ``None``)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(model_device(model).type, dtype=getattr(torch, dtype))


def _dtype_name(model: Any) -> str | None:
    dtype = getattr(model, "dtype", None)
    return None if dtype is None else str(dtype).replace("torch.", "")


def _load_holdout(
    forget_split: str, source: str, max_examples: int | None, membership_inference: bool | None
) -> list[dict[str, Any]] | None:
    if membership_inference is False:
        return None
    config = HOLDOUT_FOR_FORGET[forget_split]
    try:
        return _cap(load_tofu_rows(config, source), max_examples)
    except (FileNotFoundError, ConnectionError, ValueError) as err:
        if membership_inference:
            raise ValueError(
                f"Membership inference needs the {config!r} split of {source}, which could not be loaded ({err}); "
                "pass membership_inference=False to evaluate without it."
            ) from err
        warnings.warn(
            f"The {config!r} split is not available from {source} ({err}); the membership-inference AUCs and "
            "privleak are left out of the report.",
            stacklevel=3,
        )
        return None


def evaluate_tofu(
    model: Any,
    tokenizer: Any,
    source: str = TOFU_HUB_ID,
    forget_split: str = "forget10",
    retain_reference: str | os.PathLike | Mapping[str, Any] | RetainReference | None = None,
    scorer: TokenScorer | None = None,
    generation_kwargs: Mapping[str, Any] | None = None,
    batch_size: int = 16,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    max_examples: int | None = None,
    progress: bool = True,
    output_path: str | os.PathLike | None = None,
    model_name: str | None = None,
    template: str | PromptTemplate | None = None,
    membership_inference: bool | None = None,
    autocast_dtype: str | None = None,
    attacks: str | Sequence[str] | Mapping[str, Mapping[str, Any] | None] | None = None,
    device: str | None = None,
) -> TOFUReport:
    """Evaluate a causal LM on TOFU and return (and optionally write) the report.

    Args:
        model, tokenizer: any causal LM and its tokenizer (a pad token is set from EOS if missing).
        source: Hub id, local folder of ``<config>.jsonl`` files, or ``"synthetic"``.
        forget_split: ``forget01``, ``forget05`` or ``forget10``.
        retain_reference: the retain model's numbers, for forget quality and privleak: anything
            :func:`~hf_unlearn.evaluation.load_retain_reference` reads (our report or saved truth ratios,
            open-unlearning's ``TOFU_EVAL.json``, TOFU's ``eval_log_forget.json`` or results folder, a report
            dict, a ``RetainReference``); ``None`` leaves ``forget_quality`` and ``ks_statistic`` as ``None``
            and uses privleak's default reference AUC 0.5.
        scorer: token scorer for teacher-forced losses (default: the model's own log-probs). Extraction
            strength, exact memorization and Min-K%++ need the model's full distribution and are ``None``
            under a custom scorer.
        generation_kwargs: extra ``model.generate`` arguments (e.g. ``logits_processor``).
        batch_size: scoring/generation batch size.
        max_new_tokens: generated answer length (default 200, TOFU's and open-unlearning's; lowering it
            caps ROUGE-L for long answers).
        max_examples: keep only the first ``max_examples`` rows of each split (TOFU's original protocol scores
            300 rows, open-unlearning all of them: ``None``). Recorded in the report.
        progress: show progress bars.
        output_path: if given, the report is written there as JSON (atomically). A path inside the model's own
            folder (its ``name_or_path``), the tokenizer's or a local ``source`` folder, a link or a folder is
            refused before any work (:func:`hf_unlearn.safe_output.check_report_path`).
        model_name: name recorded in the report (default: the model's ``name_or_path``).
        template: prompt template (preset name or :class:`~hf_unlearn.data.PromptTemplate`); ``None`` is the
            tokenizer's chat template when it has one, else the ``plain`` preset.
        membership_inference: score the forget split against ``holdoutNN`` for the MIA AUCs and privleak:
            ``None`` when the source has that split (else a warning), ``True`` always, ``False`` never.
        autocast_dtype: ``"bfloat16"`` or ``"float16"`` runs every scoring and generation call under
            ``torch.autocast(<model's device type>, dtype)``; the weights are left as they are. ``None`` (default)
            computes in the model's own dtype. open-unlearning evaluates TOFU models loaded in bfloat16; on a CPU
            with AVX512-BF16, bfloat16 autocast halves SmolLM2-135M's evaluation time (20.6 s against 39.6 s for
            32 forget rows; average answer NLLs within 0.01 nats). Recorded in the provenance's ``dtype``
            (e.g. ``"float32+autocast:bfloat16"``), so a retain reference computed otherwise is refused.
        attacks: attacks that try to bring the forgotten rows back (:mod:`.attacks`), run on copies of the model
            after the evaluation: ``"quant,relearn"``, a list of names (``quant``: 4-bit NF4 and 8-bit re-measure;
            ``relearn``: a few fine-tuning steps on 10% of the forget rows, and on retain rows only) or a dict of
            names to their keyword arguments (e.g. ``{"relearn": {"original": target_model, "steps": 10}}``;
            ``original`` gives the recovered fractions). They use the forget split's rows, the retain split's rows
            (benign fine-tuning), this evaluation's template, batch size and ``max_new_tokens``. A model scored by a
            custom ``scorer`` needs its T3 head among the attack's arguments (``{"quant": {"head": head}}``) so that
            each attacked copy is scored through it. Adds ``attacks`` (each section) and the flat
            :data:`~hf_unlearn.evaluation.attacks.ATTACK_COLUMNS` figures to the report.
        device: ``None`` (default) evaluates on the device the model is on; ``"auto"``, ``"cpu"``, ``"cuda"`` or
            ``"cuda:N"`` (:func:`hf_unlearn.devices.resolve_device`) moves the model there first (``model.to``).
            The device evaluated on is recorded in ``settings["device"]``.

    Returns:
        A :class:`~hf_unlearn.evaluation.TOFUReport`: ``forget_quality``, ``ks_statistic``, ``model_utility``,
        ``forget_rouge_l``, ``forget_truth_ratio``, ``forget_prob``, ``components`` (the nine model-utility
        scores), ``mu_rouge``, ``extraction_strength``, ``exact_memorization``, ``mia_loss``, ``mia_zlib``,
        ``mia_min_k``, ``mia_min_k_plus_plus`` (AUCs), ``privleak``, ``mia`` (details), ``forget_truth_ratios``,
        ``num_examples`` (per split), ``splits`` (per-split aggregates and per-example values), ``source``,
        ``forget_split``, ``model_name``, ``retain_reference`` (its summary or ``None``), ``provenance``,
        ``settings``, ``wall_time_s``, ``hf_unlearn_version`` and, with ``attacks``, the attack section and
        figures, as attributes; ``report.to_dict()`` is the JSON written to ``output_path``.
        :data:`~hf_unlearn.evaluation.METRIC_DEFINITIONS` defines every figure.

    Raises:
        ValueError: bad arguments, an unsafe ``output_path``, an unknown split or template, rows lacking fields,
            empty splits, a tokenizer with neither pad nor EOS token, or a retain reference whose number of truth
            ratios or recorded provenance (forget split, rows, prompt template, tokenizer, dtype) differs from this
            evaluation's, a CUDA ``device`` without CUDA; all before any model call.
    """
    start = time.perf_counter()
    if output_path is not None:
        from ..safe_output import check_report_path

        check_report_path(output_path, [_model_name(model), getattr(tokenizer, "name_or_path", None), source])
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
    if membership_inference not in (None, True, False):
        raise ValueError(f"membership_inference must be None, True or False, got {membership_inference!r}.")
    if autocast_dtype not in AUTOCAST_DTYPES:
        raise ValueError(f"autocast_dtype must be one of {AUTOCAST_DTYPES}, got {autocast_dtype!r}.")
    if device is not None:
        from ..devices import resolve_device

        device = resolve_device(device)
    chosen_attacks = parse_attacks(attacks)
    check_attack_options(chosen_attacks, template=template, batch_size=batch_size, max_new_tokens=max_new_tokens,
                         progress=progress)
    if scorer is not None:
        headless = [name for name, kwargs in chosen_attacks.items() if kwargs.get("head") is None]
        if headless:
            raise ValueError(
                f"The attacks {headless} score copies of the model, which the given scorer does not score; pass the "
                "T3 head in their arguments (attacks={'quant': {'head': head}, 'relearn': {'head': head}})."
            )
    ensure_pad_token(tokenizer)
    template = resolve_template(tokenizer, template)
    data = {spec.name: _cap(load_tofu_rows(spec.config, source), max_examples) for spec in specs}
    provenance: dict[str, Any] = {
        "format": "hf_unlearn",
        "source": source,
        "forget_split": forget_split,
        "max_examples": max_examples,
        "num_rows": len(data["forget"]),
        "data_sha256": rows_fingerprint(data["forget"]),
        "template": template_fingerprint(tokenizer, template),
        "tokenizer": str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__),
        "tokenizer_sha256": tokenizer_fingerprint(tokenizer),
    }
    reference = None
    if retain_reference is not None:
        reference = load_retain_reference(retain_reference)
        n_ref, n_eval = len(reference.forget_truth_ratios), len(data["forget"])
        if n_ref != n_eval:
            hint = (" TOFU's original protocol scores the first 300 rows: pass max_examples=300."
                    if n_ref == 300 and reference.provenance.get("format") == "tofu" else "")
            raise ValueError(
                f"The retain reference has {n_ref} forget truth ratios but this evaluation has {n_eval} forget "
                f"examples; evaluate the retain model on the same source, forget split and max_examples.{hint}"
            )
        unknown = check_provenance(reference, provenance, [f for f in ("forget_split", "num_rows", "data_sha256",
                                                                       "template", "tokenizer_sha256")])
    holdout = _load_holdout(forget_split, source, max_examples, membership_inference)
    # Everything above runs before the model is touched.
    if device is not None:
        model = model.to(device)
    dtype = _dtype_name(model)
    provenance["dtype"] = dtype if autocast_dtype is None else f"{dtype}+autocast:{autocast_dtype}"
    limit = model_max_positions(model)
    provenance["max_length"] = limit
    if reference is not None:
        unknown += check_provenance(reference, provenance, ["dtype"])
        warn_unknown_provenance(reference, unknown)

    score = {"scorer": scorer, "batch_size": batch_size, "progress": progress, "template": template}
    forget_rows = data["forget"]
    with model_autocast(model, autocast_dtype):  # every model call; the aggregates below are plain numpy
        forget_stats = answer_token_statistics(
            model, tokenizer, [r["question"] for r in forget_rows], [r["answer"] for r in forget_rows],
            desc="forget: answers", **score,
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
                template=template,
                answer_nll_values=forget_stats.avg_nll if spec.name == "forget" else None,
                progress=progress,
            )
        holdout_stats = None if holdout is None else answer_token_statistics(
            model, tokenizer, [r["question"] for r in holdout], [r["answer"] for r in holdout],
            desc="holdout: answers", **score,
        )

    # Verbatim memorization of the forget answers (teacher-forced greedy agreement).
    es = em = None
    if forget_stats.greedy_correct is not None:
        es_values = [extraction_strength(g) for g in forget_stats.greedy_correct]
        em_values = [exact_memorization(g) for g in forget_stats.greedy_correct]
        es, em = float(np.mean(es_values)), float(np.mean(em_values))
        splits["forget"]["per_example"]["extraction_strength"] = es_values
        splits["forget"]["per_example"]["exact_memorization"] = em_values

    # Membership inference: forget (label 0) vs holdout (label 1), and privleak against the retain model.
    mia: dict[str, Any] | None = None
    aucs: dict[str, float | None] = dict.fromkeys(MIA_ATTACKS)
    leak: dict[str, float | None] = dict.fromkeys(MIA_ATTACKS)
    ref_aucs = (reference.mia_auc if reference is not None else None) or {}
    if holdout is not None:
        forget_scores = mia_scores(forget_stats, tokenizer)
        holdout_scores = mia_scores(holdout_stats, tokenizer)
        for attack in MIA_ATTACKS:
            if forget_scores[attack] is not None and holdout_scores[attack] is not None:
                aucs[attack] = mia_auc(forget_scores[attack], holdout_scores[attack])
                leak[attack] = privleak(aucs[attack], ref_aucs.get(attack))
        mia = {
            "holdout_split": HOLDOUT_FOR_FORGET[forget_split],
            "num_forget": len(forget_rows),
            "num_holdout": len(holdout),
            "k": MIN_K_FRACTION,
            "auc": aucs,
            "privleak": leak,
            "reference_auc": {a: ref_aucs.get(a) for a in MIA_ATTACKS},
            "per_example": {"forget": forget_scores, "holdout": holdout_scores},
        }

    components = {f"{s}_{stat}": splits[s][stat] for s in UTILITY_SPLITS for stat in UTILITY_STATS}
    forget_ratios = splits["forget"]["per_example"]["truth_ratio"]
    fq = metrics.forget_quality(forget_ratios, reference.forget_truth_ratios) if reference is not None else None
    report = TOFUReport(
        model_name=model_name or _model_name(model),
        source=source,
        forget_split=forget_split,
        retain_reference=None if reference is None else reference.summary(),
        forget_quality=None if fq is None else float(fq["forget_quality"]),
        ks_statistic=None if fq is None else float(fq["ks_statistic"]),
        model_utility=metrics.model_utility([components[k] for k in COMPONENT_NAMES]),
        forget_rouge_l=splits["forget"]["rouge_l"],
        forget_truth_ratio=splits["forget"]["truth_ratio"],
        forget_prob=splits["forget"]["prob"],
        retain_rouge_l=components["retain_rouge_l"],
        retain_prob=components["retain_prob"],
        retain_truth_ratio=components["retain_truth_ratio"],
        mu_rouge=mu_rouge(
            components["retain_rouge_l"], components["real_authors_rouge_l"], components["world_facts_rouge_l"]
        ),
        extraction_strength=es,
        exact_memorization=em,
        mia_loss=aucs["loss"],
        mia_zlib=aucs["zlib"],
        mia_min_k=aucs["min_k"],
        mia_min_k_plus_plus=aucs["min_k_plus_plus"],
        privleak=leak["min_k"],
        components=components,
        forget_truth_ratios=forget_ratios,
        mia=mia,
        num_examples={name: s["num_examples"] for name, s in splits.items()},
        splits=splits,
        provenance=provenance,
        settings={
            "batch_size": batch_size,
            "max_new_tokens": max_new_tokens,
            "max_examples": max_examples,
            "template": template.name,
            "max_length": limit,
            "num_truncated": {name: s["num_truncated"] for name, s in splits.items()},
            "custom_scorer": scorer is not None,
            "generation_kwargs": sorted(generation_kwargs or {}),
            "membership_inference": mia is not None,
            "device": str(model_device(model)),
        },
        hf_unlearn_version=__version__,
    )
    if chosen_attacks:
        common = {"template": template, "batch_size": batch_size, "max_new_tokens": max_new_tokens,
                  "progress": progress}
        report.attacks = run_attacks(model, tokenizer, forget_rows, data["retain"], chosen_attacks, **common)
        for key, value in attack_summary(report.attacks).items():
            report[key] = value  # the ATTACK_FIELDS
    report.settings["attacks"] = list(chosen_attacks)
    report.wall_time_s = time.perf_counter() - start
    if output_path is not None:
        write_json_atomic(report.to_dict(), output_path)
    return report
