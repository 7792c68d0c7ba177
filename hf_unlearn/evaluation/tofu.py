"""The TOFU evaluator (Maini et al., 2024): per-example statistics on the four evaluation splits, aggregates, report.

Per split (``{forget_split}_perturbed``, ``retain_perturbed``, ``real_authors_perturbed``,
``world_facts_perturbed``; statistics in :mod:`.tofu_stats`), with ``loss`` the average per-token answer NLL
(:mod:`hf_unlearn.logprobs`, so a custom ``scorer`` plugs in)::

    prob = exp(-loss(answer))                            (forget, retain)
    prob = p(answer) / (p(answer) + sum_j p(perturbed_j))  (real authors, world facts)
    tr_i = exp(loss(true_i) - mean_j loss(perturbed_ij))  (true: paraphrased on forget/retain, else the answer)

and the ROUGE-L recall of the greedy answer. Forget quality is the KS test of the forget truth ratios against a
retain reference's (:func:`.reference.load_retain_reference`, refused when its provenance differs); model utility
the harmonic mean of the nine retain / real-authors / world-facts components. Also extraction strength and exact
memorization (:mod:`.memorization`), the MIA AUCs against ``holdoutNN`` and privleak (:mod:`.privacy`), MU-ROUGE.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tqdm.auto import tqdm

from ..assets import __version__
from ..data import (
    HOLDOUT_FOR_FORGET,
    TOFU_HUB_ID,
    PromptTemplate,
    ensure_pad_token,
    load_tofu_rows,
    model_max_positions,
    resolve_template,
    template_fingerprint,
)
from ..logprobs import AnswerTokenStatistics, TokenScorer, answer_token_statistics, model_device
from . import metrics
from .attacks import attack_summary, check_attack_options, parse_attacks, run_attacks
from .generation import DEFAULT_MAX_NEW_TOKENS
from .reference import (
    COMPONENT_NAMES,
    UTILITY_SPLITS,
    UTILITY_STATS,
    RetainReference,
    check_provenance,
    load_retain_reference,
    rows_fingerprint,
    tokenizer_fingerprint,
)
from .report import TOFUReport, write_json_atomic
from .rouge import mu_rouge
from .tofu_stats import SplitSpec, evaluate_split, evaluation_splits, forget_memorization, mia_figures


def _cap(rows: list[dict[str, Any]], max_examples: int | None) -> list[dict[str, Any]]:
    return rows if max_examples is None else rows[:max_examples]


def _model_name(model: Any) -> str:
    config = getattr(model, "config", None)
    return str(getattr(config, "_name_or_path", None) or getattr(model, "name_or_path", None) or type(model).__name__)


AUTOCAST_DTYPES = (None, "bfloat16", "float16")


def model_autocast(model: Any, dtype: str | None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` on the model's device type with ``dtype`` (a no-op context for ``None``)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(model_device(model).type, dtype=getattr(torch, dtype))


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
    model: Any, tokenizer: Any, source: str = TOFU_HUB_ID, forget_split: str = "forget10",
    retain_reference: str | os.PathLike | Mapping[str, Any] | RetainReference | None = None,
    scorer: TokenScorer | None = None, generation_kwargs: Mapping[str, Any] | None = None,
    batch_size: int = 16, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, max_examples: int | None = None,
    progress: bool = True, output_path: str | os.PathLike | None = None, model_name: str | None = None,
    template: str | PromptTemplate | None = None, membership_inference: bool | None = None,
    autocast_dtype: str | None = None,
    attacks: str | Sequence[str] | Mapping[str, Mapping[str, Any] | None] | None = None,
    device: str | None = None,
) -> TOFUReport:
    """Evaluate a causal LM on TOFU and return (and optionally write) the :class:`TOFUReport`.

    Args:
        source: Hub id, local folder of ``<config>.jsonl`` files, or ``"synthetic"``.
        retain_reference: anything :func:`~hf_unlearn.evaluation.load_retain_reference` reads; ``None`` leaves
            ``forget_quality`` and ``ks_statistic`` ``None`` and privleak's reference AUC 0.5.
        scorer: token scorer for teacher-forced losses; under a custom one extraction strength, exact memorization
            and Min-K%++ are ``None``.
        max_examples: keep only the first ``max_examples`` rows of each split.
        output_path: write the report there as JSON (atomically); a path inside the model's, the tokenizer's or a
            local ``source`` folder, or through a link, is refused.
        template: preset name or :class:`~hf_unlearn.data.PromptTemplate`; ``None``: the tokenizer's chat template
            when it has one, else ``plain``.
        membership_inference: score the forget split against ``holdoutNN`` (MIA AUCs, privleak): ``None`` when the
            source has that split (else a warning), ``True`` always, ``False`` never.
        autocast_dtype: ``"bfloat16"`` or ``"float16"`` runs every model call under ``torch.autocast``; recorded in
            the provenance's ``dtype``.
        attacks: run on copies of the model after the evaluation (:func:`.attacks.parse_attacks`), on the forget
            and retain rows; with a custom ``scorer`` each needs a ``decoding``
            (:func:`~hf_unlearn.evaluation.artifact_decoding`).
        device: where to move the model first (``None``: where it is).

    Raises:
        ValueError: bad arguments or output path, an unknown split or template, bad rows, a tokenizer with neither
            pad nor EOS token, a retain reference whose size or provenance differs; all before any model call.
    """
    specs, device, chosen_attacks = _check_inputs(
        model, tokenizer, source=source, forget_split=forget_split, scorer=scorer,
        generation_kwargs=generation_kwargs, batch_size=batch_size, max_new_tokens=max_new_tokens,
        max_examples=max_examples, progress=progress, output_path=output_path, template=template,
        membership_inference=membership_inference, autocast_dtype=autocast_dtype, attacks=attacks, device=device,
    )
    ensure_pad_token(tokenizer)
    template = resolve_template(tokenizer, template)
    data = {spec.name: _cap(load_tofu_rows(spec.config, source), max_examples) for spec in specs}
    provenance = {  # the data side; the model's dtype and maximum length are added below
        "format": "hf_unlearn", "source": source, "forget_split": forget_split, "max_examples": max_examples,
        "num_rows": len(data["forget"]), "data_sha256": rows_fingerprint(data["forget"]),
        "template": template_fingerprint(tokenizer, template),
        "tokenizer": str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__),
        "tokenizer_sha256": tokenizer_fingerprint(tokenizer),
    }
    reference, unknown = _check_reference(retain_reference, provenance, len(data["forget"]))
    holdout = _load_holdout(forget_split, source, max_examples, membership_inference)
    # Everything above runs before the model is touched.
    if device is not None:
        model = model.to(device)
    dtype = None if getattr(model, "dtype", None) is None else str(model.dtype).replace("torch.", "")
    provenance["dtype"] = dtype if autocast_dtype is None else f"{dtype}+autocast:{autocast_dtype}"
    provenance["max_length"] = model_max_positions(model)
    if reference is not None:
        unknown += check_provenance(reference, provenance, ["dtype"])
        if unknown:
            warnings.warn(f"The retain reference ({reference.provenance.get('format', 'unknown format')}) does not "
                          f"record {', '.join(unknown)}; they could not be checked against this evaluation. Make "
                          "sure the retain model was evaluated with the same protocol.", stacklevel=2)
    with model_autocast(model, autocast_dtype):  # every model call; the aggregates below are plain numpy
        forget_stats, splits, holdout_stats = _score_splits(
            model, tokenizer, specs, data, holdout, scorer=scorer, generation_kwargs=generation_kwargs,
            batch_size=batch_size, max_new_tokens=max_new_tokens, template=template, progress=progress,
        )
    es, em = forget_memorization(forget_stats, splits["forget"])
    mia, aucs, leak = mia_figures(forget_stats, holdout_stats, tokenizer, forget_split,
                                  reference.mia_auc if reference is not None else None)
    settings = {  # how the evaluation ran
        "batch_size": batch_size, "max_new_tokens": max_new_tokens, "max_examples": max_examples,
        "template": template.name, "max_length": provenance["max_length"],
        "num_truncated": {name: s["num_truncated"] for name, s in splits.items()},
        "custom_scorer": scorer is not None, "generation_kwargs": sorted(generation_kwargs or {}),
        "membership_inference": mia is not None, "device": str(model_device(model)), "attacks": list(chosen_attacks),
    }
    report = _assemble_report(
        model_name or _model_name(model), source, forget_split, reference, splits, provenance, settings,
        memorization=(es, em), mia=mia, aucs=aucs, leak=leak,
    )
    if chosen_attacks:  # on copies of the model, on the forget and retain rows
        report.attacks = run_attacks(model, tokenizer, data["forget"], data["retain"], chosen_attacks,
                                     template=template, batch_size=batch_size, max_new_tokens=max_new_tokens,
                                     progress=progress)
        for key, value in attack_summary(report.attacks).items():
            setattr(report, key, value)  # the ATTACK_FIELDS
    if output_path is not None:
        write_json_atomic(report.to_dict(), output_path)
    return report


def _check_inputs(
    model: Any, tokenizer: Any, *, source: str, forget_split: str, scorer: TokenScorer | None,
    generation_kwargs: Mapping[str, Any] | None, batch_size: Any, max_new_tokens: Any, max_examples: Any,
    progress: bool, output_path: str | os.PathLike | None, template: str | PromptTemplate | None,
    membership_inference: Any, autocast_dtype: Any, attacks: Any, device: str | None,
) -> tuple[tuple[SplitSpec, ...], str | None, dict[str, dict[str, Any]]]:
    """Check :func:`evaluate_tofu`'s arguments before any work: ``(splits, resolved device, chosen attacks)``."""
    if output_path is not None:
        from ..safe_output import check_report_path

        check_report_path(output_path, [_model_name(model), getattr(tokenizer, "name_or_path", None), source],
                          overwrite=True)
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
        plain = [name for name, kwargs in chosen_attacks.items() if kwargs.get("decoding") is None]
        if plain:
            raise ValueError(
                f"The attacks {plain} score copies of the model, which the given scorer does not score; pass a "
                "decoding in their arguments (attacks={'quant': {'decoding': artifact_decoding(artifact)}})."
            )
    return specs, device, chosen_attacks


def _check_reference(
    retain_reference: str | os.PathLike | Mapping[str, Any] | RetainReference | None, provenance: Mapping[str, Any],
    num_forget: int,
) -> tuple[RetainReference | None, list[str]]:
    """The retain reference, read and checked against this evaluation (its number of forget truth ratios and its
    recorded provenance), and the provenance fields it does not record; ``(None, [])`` without one."""
    if retain_reference is None:
        return None, []
    reference = load_retain_reference(retain_reference)
    n_ref = len(reference.forget_truth_ratios)
    if n_ref != num_forget:
        hint = (" TOFU's original protocol scores the first 300 rows: pass max_examples=300."
                if n_ref == 300 and reference.provenance.get("format") == "tofu" else "")
        raise ValueError(
            f"The retain reference has {n_ref} forget truth ratios but this evaluation has {num_forget} forget "
            f"examples; evaluate the retain model on the same source, forget split and max_examples.{hint}"
        )
    unknown = check_provenance(reference, provenance, [f for f in ("forget_split", "num_rows", "data_sha256",
                                                                   "template", "tokenizer_sha256")])
    return reference, unknown


def _score_splits(
    model: Any, tokenizer: Any, specs: Sequence[SplitSpec], data: Mapping[str, list[dict[str, Any]]],
    holdout: list[dict[str, Any]] | None, *, scorer: TokenScorer | None, generation_kwargs: Mapping[str, Any] | None,
    batch_size: int, max_new_tokens: int, template: PromptTemplate, progress: bool,
) -> tuple[AnswerTokenStatistics, dict[str, dict[str, Any]], AnswerTokenStatistics | None]:
    """Every model call of the evaluation: the forget answers' token statistics, each split's statistics and
    generations (:func:`.tofu_stats.evaluate_split`), and the holdout answers' token statistics (``None`` without
    the holdout split)."""
    score = {"scorer": scorer, "batch_size": batch_size, "progress": progress, "template": template}
    forget_rows = data["forget"]
    forget_stats = answer_token_statistics(
        model, tokenizer, [r["question"] for r in forget_rows], [r["answer"] for r in forget_rows],
        desc="forget: answers", **score,
    )
    splits: dict[str, dict[str, Any]] = {}
    for spec in tqdm(specs, desc="TOFU evaluation", disable=not progress):
        splits[spec.name] = evaluate_split(
            model, tokenizer, data[spec.name], spec, scorer=scorer, generation_kwargs=generation_kwargs,
            batch_size=batch_size, max_new_tokens=max_new_tokens, template=template,
            answer_nll_values=forget_stats.avg_nll if spec.name == "forget" else None, progress=progress,
        )
    holdout_stats = None if holdout is None else answer_token_statistics(
        model, tokenizer, [r["question"] for r in holdout], [r["answer"] for r in holdout],
        desc="holdout: answers", **score,
    )
    return forget_stats, splits, holdout_stats


def _assemble_report(
    model_name: str, source: str, forget_split: str, reference: RetainReference | None,
    splits: dict[str, dict[str, Any]], provenance: dict[str, Any], settings: dict[str, Any], *,
    memorization: tuple[float | None, float | None], mia: dict[str, Any] | None,
    aucs: Mapping[str, float | None], leak: Mapping[str, float | None],
) -> TOFUReport:
    """The report from the split statistics: forget quality (KS test of the forget truth ratios against the
    reference's), model utility (harmonic mean of the nine components), MU-ROUGE, memorization, the MIA AUCs and
    privleak (of Min-K%)."""
    components = {f"{s}_{stat}": splits[s][stat] for s in UTILITY_SPLITS for stat in UTILITY_STATS}
    forget_ratios = splits["forget"]["per_example"]["truth_ratio"]
    fq = metrics.forget_quality(forget_ratios, reference.forget_truth_ratios) if reference is not None else None
    es, em = memorization
    forget = splits["forget"]
    return TOFUReport(
        model_name=model_name, source=source, forget_split=forget_split,
        retain_reference=None if reference is None else reference.summary(),
        forget_quality=None if fq is None else float(fq["forget_quality"]),
        ks_statistic=None if fq is None else float(fq["ks_statistic"]),
        model_utility=metrics.model_utility([components[k] for k in COMPONENT_NAMES]),
        forget_rouge_l=forget["rouge_l"], forget_truth_ratio=forget["truth_ratio"], forget_prob=forget["prob"],
        retain_rouge_l=components["retain_rouge_l"], retain_prob=components["retain_prob"],
        retain_truth_ratio=components["retain_truth_ratio"],
        mu_rouge=mu_rouge(*(components[f"{s}_rouge_l"] for s in UTILITY_SPLITS)),
        extraction_strength=es, exact_memorization=em, mia_loss=aucs["loss"], mia_zlib=aucs["zlib"],
        mia_min_k=aucs["min_k"], mia_min_k_plus_plus=aucs["min_k_plus_plus"], privleak=leak["min_k"],
        components=components, forget_truth_ratios=forget_ratios, mia=mia,
        num_examples={name: s["num_examples"] for name, s in splits.items()}, splits=splits, provenance=provenance,
        settings=settings, hf_unlearn_version=__version__,
    )
