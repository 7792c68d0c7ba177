"""``fit_grom``: forward passes of the unedited model collect keys, one linear solve per module gives the edit
(``k`` edited modules each take ``1/k`` of the margin drop).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import torch

from ...data.prompts import collate_qa
from ...integrity import model_fingerprint
from .attribution import TargetModule, attribution_scores, select_band
from .config import GROMConfig
from .edit import GROMEdit
from .inputs import _prepare, _Prepared
from .keys import KeyCollector, _dist
from .solve import GROMSolution, solve_grom
from .targets import corruption_targets, random_direction, specificity_weights, suppression_targets


def fit_grom(
    model: Any, tokenizer: Any, forget: Sequence[dict[str, Any]] | Any, retain: Sequence[dict[str, Any]] | Any,
    config: GROMConfig | None = None, generic_retain: Sequence[dict[str, Any]] | Any = None, *,
    device: Any = None, gram_device: Any = None,
) -> GROMEdit:
    """Fit the closed-form GROM edit of ``model`` (left unmodified) that unlearns ``forget`` while preserving a
    seeded sample of ``retain``: TOFU-shaped rows or documents. ``generic_retain``: optional general rows (``X_g``).
    Every input is checked before the first forward pass. ``gram_device``: where the float64 second moments
    accumulate. Under ``torchrun`` every process must call it with the same rows.
    """
    return _fit_grom(model, tokenizer, forget, retain, config, generic_retain, device, gram_device)[0]


def _fit_grom(
    model: Any, tokenizer: Any, forget: Any, retain: Any, config: GROMConfig | None, generic_retain: Any,
    device: Any, gram_device: Any, with_preservation: bool = False,
) -> tuple[GROMEdit, dict[str, torch.Tensor] | None]:
    """:func:`fit_grom` and each module's preservation part of ``A``, ``R = (w_r/r) X_r X_r^T + (w_g/g) X_g X_g^T``
    (float64; what the strength path rescales)."""
    from ...devices import join_launch, move_to_device, resolve_device

    config = config or GROMConfig()
    gram_device = None if gram_device is None else resolve_device(gram_device)
    move_to_device(model, device)
    join_launch()
    start = time.perf_counter()
    prep = _prepare(model, tokenizer, forget, retain, config, generic_retain)
    alpha = specificity_weights(prep.f_counts, prep.r_counts, config.specificity_power, config.specificity_smoothing,
                                config.specificity_smoothing_mode)
    distributed, rank, world = _dist()
    suppression = config.objective == "token_suppression"
    stats, layered, scores, passes_done = _collect(model, prep, config, tokenizer.pad_token_id, rank, world,
                                                   suppression, gram_device)
    edited = layered + prep.heads
    records = stats["records"]
    if records["gold"].numel() == 0:
        raise ValueError("No forget keys were collected: the forget set has no answer tokens.")
    alpha_t = alpha.to(records["gold"].device)[records["gold"]]
    solutions, keys_out, targets_out = _solve_modules(edited, stats, alpha_t, config, suppression)
    elapsed = time.perf_counter() - start
    edit = GROMEdit(
        config=config, deltas={name: sol.delta.float().cpu() for name, sol in solutions.items()},
        solutions=solutions, forget_keys=keys_out, targets=targets_out, example_ids=records["example"].cpu(),
        num_forget_examples=len(prep.forget_feats), layer_scores=scores,
        selected_layers=sorted({t.layer for t in layered}),
        stats={
            "num_forget_keys": int(records["gold"].numel()), "num_retain_keys": stats["num_retain"],
            "num_retain_rows_read": len(prep.retain_feats), "num_generic_keys": stats["num_generic"],
            "num_generic_rows_read": len(prep.generic_feats), "candidate_layers": prep.candidates,
            "max_positions": prep.limit, "forward_passes_over_data": passes_done, "processes": world,
            "distributed": distributed, "mean_specificity": float(alpha_t.mean()),
            "mean_forget_margin": float(records["margin"].mean()) if suppression else None, "seconds": elapsed,
        },
        base_model_name_or_path=getattr(model.config, "_name_or_path", None) or None,
        base_fingerprint=model_fingerprint(model), retain_indices=prep.retain_indices,
        untied_lm_head=prep.untied_lm_head,
    )
    if not with_preservation:
        return edit, None
    return edit, {name: _preservation(stats, name, config, sol.chol.device) for name, sol in solutions.items()}


def _preservation(stats: dict[str, Any], name: str, config: GROMConfig, device: torch.device) -> torch.Tensor:
    """``R`` of module ``name`` (float64; a term with a zero count or weight is left out)."""
    r, g = stats["num_retain"], stats["num_generic"]
    out = torch.zeros_like(stats["retain_moment"][name], dtype=torch.float64, device=device)
    if r > 0 and config.retain_weight > 0:
        out.add_(stats["retain_moment"][name].to(device=device, dtype=torch.float64), alpha=config.retain_weight / r)
    generic = stats["generic_moment"].get(name)
    if generic is not None and g > 0 and config.generic_retain_weight > 0:
        out.add_(generic.to(device=device, dtype=torch.float64), alpha=config.generic_retain_weight / g)
    return out


def _collect(
    model: Any, prep: _Prepared, config: GROMConfig, pad_id: int, rank: int, world: int, suppression: bool,
    gram_device: str | None = None,
) -> tuple[dict[str, Any], list[TargetModule], dict[int, dict[str, float]], int]:
    """The forward passes of :func:`fit_grom` over this process's examples, in eval mode: ``(statistics, layered
    modules to edit, layer scores, passes)``; ``layers="auto"`` may take two (:func:`_one_pass_affordable`)."""
    layered, heads, band = prep.layered, prep.heads, prep.band
    auto = config.layers == "auto" and bool(layered)
    feats = {"forget": prep.forget_feats, "retain": prep.retain_feats, "generic": prep.generic_feats}
    ids = {role: list(range(rank, len(f), world)) for role, f in feats.items()}

    def passes(key_modules: list[TargetModule], attribution: list[TargetModule]) -> dict[str, Any]:
        collector = KeyCollector(model, key_modules, attribution, suppression=suppression, gram_device=gram_device)
        roles = ["forget", "retain"] + (["generic"] if feats["generic"] and key_modules else [])
        with collector:
            for role in roles:
                total = math.ceil(len(ids[role]) / config.batch_size)
                collector.run(_batches(feats[role], ids[role], pad_id, config.batch_size), role, config.progress,
                              total)
        return collector.finalize()

    was_training = model.training
    model.eval()
    try:
        scores: dict[int, dict[str, float]] = {}
        if auto and not _one_pass_affordable(model, layered, band, int(prep.f_counts.sum()), config.max_stat_memory_gb):
            stats = passes([], layered)  # attribution pass, then a key pass over the chosen band only
            scores, layered = _choose_band(stats, layered, band)
            stats = passes(layered + heads, [])
            passes_done = 2
        else:
            stats = passes(layered + heads, layered if auto else [])
            if auto:
                scores, layered = _choose_band(stats, layered, band)
            passes_done = 1
    finally:
        model.train(was_training)
    return stats, layered, scores, passes_done


def _choose_band(stats: dict[str, Any], layered: list[TargetModule], band: int
                 ) -> tuple[dict[int, dict[str, float]], list[TargetModule]]:
    """The attribution scores of the candidate layers and the modules of the ``band`` layers they select."""
    a = stats["attribution"]
    scores = attribution_scores(a["forget"], a["forget_count"], a["retain"], a["retain_count"])
    chosen = select_band({k: v["score"] for k, v in scores.items()}, band)
    return scores, [t for t in layered if t.layer in chosen]


def _solve_modules(
    edited: list[TargetModule], stats: dict[str, Any], alpha_t: torch.Tensor, config: GROMConfig, suppression: bool
) -> tuple[dict[str, GROMSolution], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``(solutions, forget keys, targets)`` of every edited module; non-finite ones are refused."""
    records = stats["records"]
    solutions, keys_out, targets_out = {}, {}, {}
    for t in edited:
        keys = stats["forget_keys"][t.name]
        if suppression:
            w = records["w_logit"] if t.is_lm_head else records["w_resid"]
            d = suppression_targets(w.double(), records["margin"].double(), alpha_t, config.suppression_margin, len(edited))
        else:
            mean_norm = stats["out_norm_sum"][t.name] / keys.shape[0]
            direction = random_direction(t.module.out_features, config.seed + (t.layer or 0)).to(keys.device)
            d = corruption_targets(alpha_t.double(), direction, config.corruption_norm * mean_norm)
        if not bool(torch.isfinite(keys).all()) or not bool(torch.isfinite(d).all()):
            raise ValueError(f"GROM keys or targets of {t.name} are not finite: load the model in float32 or lower "
                             "suppression_margin / corruption_norm.")
        sol = solve_grom(
            stats["retain_moment"][t.name], stats["num_retain"], keys, d,
            config.forget_weight, config.retain_weight, config.ridge,
            stats["generic_moment"].get(t.name), stats["num_generic"], config.generic_retain_weight,
        )
        if not bool(torch.isfinite(sol.delta).all()):
            raise ValueError(f"The GROM edit of {t.name} is not finite: lower suppression_margin="
                             f"{config.suppression_margin} or forget_weight, or raise ridge.")
        solutions[t.name], keys_out[t.name], targets_out[t.name] = sol, keys, d
    return solutions, keys_out, targets_out


def _one_pass_affordable(
    model: Any, candidates: list[TargetModule], band: int, num_forget_keys: int, budget_gb: float
) -> bool:
    """Whether every candidate's moments and keys fit ``budget_gb`` and cost (``4 d_in^2`` flops per retain key on
    unused layers) under half a second pass (``2 N`` flops per token): then one pass collects them all."""
    stat_bytes = sum(8 * t.module.in_features**2 + 4 * num_forget_keys * t.module.in_features for t in candidates)
    if stat_bytes > budget_gb * 2**30:
        return False
    n_params = sum(p.numel() for p in model.parameters())
    unused = max(len(candidates) - band, 0) / max(len(candidates), 1)
    extra_flops_per_key = unused * sum(2 * 2 * t.module.in_features**2 for t in candidates)
    return extra_flops_per_key <= 0.5 * 2 * n_params


def _batches(features: list[dict[str, Any]], ids: list[int], pad_id: int, batch_size: int):
    order = sorted(range(len(ids)), key=lambda j: len(features[ids[j]]["input_ids"]))
    for start in range(0, len(order), batch_size):
        chunk = [ids[j] for j in order[start : start + batch_size]]
        batch = collate_qa([features[i] for i in chunk], pad_id, "right")
        batch["example_ids"] = chunk
        yield batch

