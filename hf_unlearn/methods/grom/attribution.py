"""Which modules GROM edits: target-module discovery and logit-lens layer attribution,

    S_l = F_l - R_l,   F_l = mean_{t in forget} <J_t^T u_{y_t}, o_{l,t}>,   R_l = same over retain tokens,

the mean direct contribution of module output ``o_{l,t}`` to the gold-token logit (``J_t`` the final norm's
Jacobian, ``u_{y_t}`` the gold token's unembedding row); ``layers="auto"`` picks the contiguous band of
``num_layers`` layers with the highest mean score.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

_LAYER_RE = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


@dataclass
class TargetModule:
    """An edited (or candidate) linear module, its layer index (``None`` for the LM head)."""

    name: str
    module: nn.Linear
    layer: int | None
    is_lm_head: bool


def layer_index(name: str) -> int | None:
    """The first integer path component of a module name (``model.layers.3.mlp.down_proj`` -> 3)."""
    m = _LAYER_RE.search(name)
    return int(m.group(1)) if m else None


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)


def lm_head_is_tied(model: Any) -> bool:
    """Whether ``model``'s LM head shares its weight with the input embeddings (or its config says so)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if head is None or embed is None:
        return False
    if head.weight is embed.weight or head.weight.data_ptr() == embed.weight.data_ptr():
        return True
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return bool(getattr(text, "tie_word_embeddings", False))


def find_target_modules(model: Any, targets: Sequence[str], allow_tied_head: bool = False) -> list[TargetModule]:
    """All modules matching ``targets``: ``nn.Linear`` residual writers or the LM head, else a ValueError."""
    hidden = getattr(model.config, "hidden_size", None) or getattr(model.config, "n_embd", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    found: list[TargetModule] = []
    for target in targets:
        hits = [(n, m) for n, m in model.named_modules() if _matches(n, target)]
        if not hits:
            leaves = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
            raise ValueError(f"target_modules entry {target!r} matches no module; the linear modules are {leaves}.")
        for name, module in hits:
            if type(module).__name__ == "Conv1D":
                raise ValueError(f"{name} is a transformers Conv1D (GPT-2 style); GROM edits nn.Linear modules only.")
            if not isinstance(module, nn.Linear):
                raise ValueError(f"{name} is a {type(module).__name__}, not an nn.Linear: GROM edits linear modules.")
            is_head = module is head
            if not is_head and module.out_features != hidden:
                raise ValueError(f"{name} maps {module.in_features} -> {module.out_features} features, not into the "
                                 f"residual stream (hidden_size={hidden}); edit e.g. 'down_proj' or 'lm_head'.")
            if is_head and not allow_tied_head and lm_head_is_tied(model):
                raise ValueError(f"{name} is tied to the input embeddings: pass GROMConfig(untie_lm_head=True) to edit "
                                 "a separate copy of the LM head.")
            layer = None if is_head else layer_index(name)
            if not is_head and layer is None:
                raise ValueError(f"Cannot tell the layer index of {name}; pass a module inside a numbered block.")
            if all(t.name != name for t in found):
                found.append(TargetModule(name, module, layer, is_head))
    return found


def select_targets(
    model: Any, config: Any
) -> tuple[list[TargetModule], list[TargetModule], list[TargetModule], list[int], int]:
    """The modules ``config`` edits in ``model``, checked without running it: ``(all targets, layered modules to
    edit or search, LM heads, candidate layers of layers='auto' (else []), band width)``."""
    targets = find_target_modules(model, config.target_modules, allow_tied_head=config.untie_lm_head)
    layered = [t for t in targets if not t.is_lm_head]
    heads = [t for t in targets if t.is_lm_head]
    available = sorted({t.layer for t in layered})
    band = config.band_width(len(available))
    candidates: list[int] = []
    if config.layers != "auto":
        missing = [i for i in config.layers if i not in available]
        if layered and missing:
            raise ValueError(f"layers {missing} have no {config.target_modules} module; available layers: {available}")
        layered = [t for t in layered if t.layer in config.layers]
    elif layered:
        candidates = config.candidates(available)
        layered = [t for t in layered if t.layer in candidates]
    elif config.candidate_layers is not None:
        raise ValueError(f"candidate_layers={config.candidate_layers} but {config.target_modules} has no layered module.")
    return targets, layered, heads, candidates, band


def attribution_scores(
    forget_sums: dict[int, float], forget_count: int, retain_sums: dict[int, float], retain_count: int
) -> dict[int, dict[str, float]]:
    """``{layer: {"score": F_l - R_l, "forget": F_l, "retain": R_l}}`` from summed contributions and token counts."""
    out = {}
    for layer in sorted(forget_sums):
        f = forget_sums[layer] / max(forget_count, 1)
        r = retain_sums.get(layer, 0.0) / max(retain_count, 1)
        out[layer] = {"score": f - r, "forget": f, "retain": r}
    return out


def select_band(scores: dict[int, float], num_layers: int) -> list[int]:
    """The run of ``num_layers`` consecutive layers with the highest mean score (the earliest on ties)."""
    layers = sorted(scores)
    if num_layers >= len(layers):
        return layers
    best, best_mean = layers[:num_layers], float("-inf")
    for start in range(len(layers) - num_layers + 1):
        band = layers[start : start + num_layers]
        if band[-1] - band[0] != num_layers - 1:
            continue
        mean = sum(scores[i] for i in band) / num_layers
        if mean > best_mean:
            best, best_mean = band, mean
    return best


def direct_contributions(outputs: torch.Tensor, lens_rows: torch.Tensor) -> torch.Tensor:
    """Per-token ``<J_t^T u_{y_t}, o_t>`` (``[n]``) from module outputs and logit-lens rows."""
    return (outputs.float() * lens_rows.float()).sum(-1)
