"""``fit_grom``: forward passes collect keys, one linear solve per module gives the edit (``GROMEdit``).

The edit is computed from the *unedited* model: keys and targets of all edited modules come from the
same forward passes, and each module's ``P`` is solved independently (``k`` edited modules each take
``1/k`` of the requested margin drop). Nothing is backpropagated through the model.

Multi-process: every process passes the same forget/retain rows; forward passes are sharded across
``torch.distributed`` processes (example ``i`` goes to rank ``i % world_size``), the second moments and
attribution sums are all-reduced and the forget records all-gathered, so each process ends with the
edit the single-process run computes.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..data.pairing import overlapping_examples
from ..data.prompts import IGNORE_INDEX, collate_qa, ensure_pad_token, tokenize_qa
from .attribution import TargetModule, attribution_scores, find_target_modules, select_band
from .config import GROMConfig
from .keys import KeyCollector, _dist
from .peft_export import adapter_state_dict, lora_config, lora_factors, save_adapter, to_peft_model
from .solve import GROMSolution, solve_grom, woodbury_drop
from .targets import corruption_targets, random_direction, specificity_weights, suppression_targets


@dataclass
class GROMEdit:
    """A fitted GROM edit.

    ``deltas``: ``{module name: P}`` (float32, CPU), the weight change of each edited ``nn.Linear``
    (``W <- W + P``). ``layer_scores``: the logit-lens attribution per candidate layer (``layers="auto"``).
    ``influence(i)`` audits forget example ``i`` exactly; ``to_peft`` / ``save_pretrained`` export the edit
    as a LoRA adapter.
    """

    config: GROMConfig
    deltas: dict[str, torch.Tensor]
    solutions: dict[str, GROMSolution]
    forget_keys: dict[str, torch.Tensor]
    targets: dict[str, torch.Tensor]
    example_ids: torch.Tensor
    num_forget_examples: int
    layer_scores: dict[int, dict[str, float]] = field(default_factory=dict)
    selected_layers: list[int] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    base_model_name_or_path: str | None = None

    def influence(self, example_index: int) -> dict[str, torch.Tensor]:
        """Exact change of each ``P`` (float64) if forget example ``example_index`` were dropped.

        Dropping means removing that example's keys and targets from the objective with the per-key forget
        weight ``w_f/s`` kept at its fitted value; computed by the Sherman-Morrison-Woodbury identity from
        the cached Cholesky factor (see :func:`hf_unlearn.grom.solve.woodbury_drop`), not by re-solving.
        """
        if not 0 <= example_index < self.num_forget_examples:
            raise ValueError(f"example_index must be in [0, {self.num_forget_examples}), got {example_index}")
        rows = (self.example_ids == example_index).nonzero().squeeze(-1)
        out = {}
        for name, sol in self.solutions.items():
            r = rows.to(self.forget_keys[name].device)
            out[name] = woodbury_drop(sol, self.forget_keys[name][r], self.targets[name][r]).cpu()
        return out

    def lora_factors(self) -> dict[str, Any]:
        """``{module: LoraFactors}`` reproducing each ``P`` (exact up to float rounding unless ``max_rank`` binds)."""
        return {n: lora_factors(p, self.config.max_rank) for n, p in self.deltas.items()}

    def _export(self) -> tuple[Any, dict[str, torch.Tensor], dict[str, Any]]:
        factors = self.lora_factors()
        rank = max(f.rank for f in factors.values())
        config = lora_config(list(self.deltas), rank, self.base_model_name_or_path)
        state = adapter_state_dict(factors, rank)
        meta = {
            "method": "GROM",
            "formula": "P = (w_f/s) D X_f^T A^{-1}, A = (w_r/r) X_r X_r^T + (w_f/s) X_f X_f^T + mu I",
            "config": self.config.to_dict(),
            "lora_rank": rank,
            "modules": {
                n: {"rank": f.rank, "relative_frobenius_error": f.relative_error, "truncated": f.truncated}
                for n, f in factors.items()
            },
            "layer_scores": {str(k): v for k, v in self.layer_scores.items()},
            "selected_layers": self.selected_layers,
            "stats": self.stats,
        }
        return config, state, meta

    def truncation_errors(self) -> dict[str, float]:
        """Relative Frobenius error of the LoRA export of each module (0 when exact)."""
        return {n: f.relative_error for n, f in self.lora_factors().items()}

    def to_peft(self, model: Any) -> Any:
        """``peft.PeftModel`` (LoRA, ``lora_alpha = r``) applying ``W + P``; wraps ``model`` in place."""
        config, state, _ = self._export()
        return to_peft_model(model, config, state)

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Write ``adapter_config.json``, ``adapter_model.safetensors`` and ``grom_metadata.json``; load with
        ``PeftModel.from_pretrained(base_model, path)``."""
        config, state, meta = self._export()
        save_adapter(path, config, state, meta)

    def apply_(self, model: Any, sign: float = 1.0) -> Any:
        """Add ``sign * P`` to the edited weights of ``model`` in place (``sign=-1`` undoes the edit)."""
        modules = dict(model.named_modules())
        with torch.no_grad():
            for name, p in self.deltas.items():
                w = modules[name].weight
                w.add_(sign * p.to(device=w.device, dtype=w.dtype))
        return model


def _rows(data: Any, what: str) -> list[dict[str, Any]]:
    rows = [dict(r) for r in data] if data is not None else []
    if not rows:
        raise ValueError(f"The {what} set is empty.")
    for r in rows[:1]:
        if "question" not in r or "answer" not in r:
            raise ValueError(f"{what} rows need 'question' and 'answer' fields; got {sorted(r)}")
    return rows


def _batches(features: list[dict[str, Any]], ids: list[int], pad_id: int, batch_size: int):
    order = sorted(range(len(ids)), key=lambda j: len(features[ids[j]]["input_ids"]))
    for start in range(0, len(order), batch_size):
        chunk = [ids[j] for j in order[start : start + batch_size]]
        batch = collate_qa([features[i] for i in chunk], pad_id, "right")
        batch["example_ids"] = chunk
        yield batch


def _answer_token_counts(features: list[dict[str, Any]], vocab: int) -> torch.Tensor:
    tokens = [t for f in features for t in f["labels"][1:] if t != IGNORE_INDEX]
    return torch.bincount(torch.tensor(tokens, dtype=torch.long), minlength=vocab)[:vocab]


def _check_vocab(model: Any, tokenizer: Any, features: list[dict[str, Any]]) -> int:
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output embeddings (LM head): GROM needs a causal LM.")
    vocab = head.weight.shape[0]
    if len(tokenizer) > vocab:
        raise ValueError(
            f"Tokenizer/model vocabulary mismatch: the tokenizer has {len(tokenizer)} tokens but the model's LM head "
            f"has {vocab} rows. Use the tokenizer the model was trained with."
        )
    top = max(max(f["input_ids"]) for f in features)
    if top >= vocab:
        raise ValueError(f"Token id {top} is outside the model's vocabulary ({vocab}): tokenizer/model mismatch.")
    return vocab


def fit_grom(
    model: Any,
    tokenizer: Any,
    forget: Sequence[dict[str, Any]] | Any,
    retain: Sequence[dict[str, Any]] | Any,
    config: GROMConfig | None = None,
) -> GROMEdit:
    """Fit the closed-form GROM edit of ``model`` that unlearns ``forget`` while preserving ``retain``.

    ``forget`` / ``retain``: TOFU-shaped rows (``question``, ``answer``) as a list of dicts or a
    ``datasets.Dataset``. Returns a :class:`GROMEdit`; ``model`` itself is not modified.
    """
    config = config or GROMConfig()
    start = time.perf_counter()
    forget_rows, retain_rows = _rows(forget, "forget"), _rows(retain, "retain")
    overlap = overlapping_examples(forget_rows, retain_rows)
    if overlap:
        raise ValueError(f"{overlap} forget examples also occur in the retain set; forget and retain must be disjoint.")
    ensure_pad_token(tokenizer)
    targets = find_target_modules(model, config.target_modules)
    layered = [t for t in targets if not t.is_lm_head]
    heads = [t for t in targets if t.is_lm_head]
    if config.layers != "auto":
        available = sorted({t.layer for t in layered})
        missing = [i for i in config.layers if i not in available]
        if layered and missing:
            raise ValueError(f"layers {missing} have no {config.target_modules} module; available layers: {available}")
        layered = [t for t in layered if t.layer in config.layers]

    forget_feats = [tokenize_qa(tokenizer, r["question"], r["answer"], config.max_length) for r in forget_rows]
    retain_feats = [tokenize_qa(tokenizer, r["question"], r["answer"], config.max_length) for r in retain_rows]
    vocab = _check_vocab(model, tokenizer, forget_feats + retain_feats)
    f_counts = _answer_token_counts(forget_feats, vocab)
    r_counts = _answer_token_counts(retain_feats, vocab)
    if int(f_counts.sum()) == 0:
        raise ValueError(
            "The forget set has no answer tokens (every label is -100, e.g. empty answers or max_length cutting "
            "them off): there are no forget keys to unlearn."
        )
    alpha = specificity_weights(f_counts, r_counts, config.specificity_power, config.specificity_smoothing)

    distributed, rank, world = _dist()
    forget_ids = list(range(rank, len(forget_feats), world))
    retain_ids = list(range(rank, len(retain_feats), world))
    pad_id = tokenizer.pad_token_id
    suppression = config.objective == "token_suppression"
    auto = config.layers == "auto" and bool(layered)

    def passes(key_modules: list[TargetModule], attribution: list[TargetModule]) -> dict[str, Any]:
        collector = KeyCollector(model, key_modules, attribution, suppression=suppression)
        with collector:
            for role, feats, ids in (("forget", forget_feats, forget_ids), ("retain", retain_feats, retain_ids)):
                total = math.ceil(len(ids) / config.batch_size)
                collector.run(_batches(feats, ids, pad_id, config.batch_size), role, config.progress, total)
        return collector.finalize()

    was_training = model.training
    model.eval()
    try:
        scores: dict[int, dict[str, float]] = {}
        stat_bytes = sum(8 * t.module.in_features**2 for t in layered)
        if auto and stat_bytes > config.max_stat_memory_gb * 2**30:
            stats = passes([], layered)  # attribution pass, then a key pass over the chosen band only
            scores = attribution_scores(**_attr_args(stats))
            chosen = select_band({k: v["score"] for k, v in scores.items()}, config.num_layers)
            layered = [t for t in layered if t.layer in chosen]
            stats = passes(layered + heads, [])
            passes_done = 2
        else:
            stats = passes(layered + heads, layered if auto else [])
            if auto:
                scores = attribution_scores(**_attr_args(stats))
                chosen = select_band({k: v["score"] for k, v in scores.items()}, config.num_layers)
                layered = [t for t in layered if t.layer in chosen]
            passes_done = 1
    finally:
        model.train(was_training)
    edited = layered + heads
    records = stats["records"]
    if records["gold"].numel() == 0:
        raise ValueError("No forget keys were collected: the forget set has no answer tokens.")

    gold = records["gold"]
    alpha_t = alpha.to(gold.device)[gold]
    solutions, deltas, keys_out, targets_out = {}, {}, {}, {}
    for t in edited:
        keys = stats["forget_keys"][t.name]
        if suppression:
            w = records["w_logit"] if t.is_lm_head else records["w_resid"]
            d = suppression_targets(w.double(), records["margin"].double(), alpha_t, config.suppression_margin, len(edited))
        else:
            mean_norm = stats["out_norm_sum"][t.name] / keys.shape[0]
            direction = random_direction(t.module.out_features, config.seed + (t.layer or 0)).to(keys.device)
            d = corruption_targets(alpha_t.double(), direction, config.corruption_norm * mean_norm)
        sol = solve_grom(
            stats["retain_moment"][t.name], stats["num_retain"], keys, d,
            config.forget_weight, config.retain_weight, config.ridge,
        )
        solutions[t.name], keys_out[t.name], targets_out[t.name] = sol, keys, d
        deltas[t.name] = sol.delta.float().cpu()
    elapsed = time.perf_counter() - start
    return GROMEdit(
        config=config,
        deltas=deltas,
        solutions=solutions,
        forget_keys=keys_out,
        targets=targets_out,
        example_ids=records["example"].cpu(),
        num_forget_examples=len(forget_feats),
        layer_scores=scores,
        selected_layers=sorted({t.layer for t in layered}),
        stats={
            "num_forget_keys": int(gold.numel()),
            "num_retain_keys": stats["num_retain"],
            "forward_passes_over_data": passes_done,
            "processes": world,
            "distributed": distributed,
            "mean_specificity": float(alpha_t.mean()),
            "mean_forget_margin": float(records["margin"].mean()) if suppression else None,
            "seconds": elapsed,
        },
        base_model_name_or_path=getattr(model.config, "_name_or_path", None) or None,
    )


def _attr_args(stats: dict[str, Any]) -> dict[str, Any]:
    a = stats["attribution"]
    return {
        "forget_sums": a["forget"], "forget_count": a["forget_count"],
        "retain_sums": a["retain"], "retain_count": a["retain_count"],
    }
