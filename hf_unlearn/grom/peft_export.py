"""Export of a GROM edit as a PEFT LoRA adapter.

A LoRA layer computes ``W x + (lora_alpha / r) B A x``. With ``lora_alpha = r`` the scaling is 1, so
factors with ``B @ A == P`` reproduce the edit ``W + P`` exactly. ``P = (w_f/s) D X_f^T A^{-1}`` has rank
at most ``min(s, d_in, d_out)``; its thin SVD ``P = U S V^T`` (float64) gives ``B = U_k S_k^{1/2}``,
``A = S_k^{1/2} V_k^T`` with ``k`` the numerical rank, or ``k = max_rank`` when that is smaller, in which
case the relative Frobenius error ``||P - B A||_F / ||P||_F = sqrt(sum_{j>k} S_j^2 / sum_j S_j^2)`` is
reported. All modules share one LoRA rank ``r`` (the largest ``k``); smaller factors are zero-padded,
which leaves ``B @ A`` unchanged.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ADAPTER_WEIGHTS = "adapter_model.safetensors"
GROM_METADATA = "grom_metadata.json"


@dataclass
class LoraFactors:
    """``lora_A`` (``[k, d_in]``), ``lora_B`` (``[d_out, k]``), the rank ``k``, the relative Frobenius error
    ``||P - B A||_F / ||P||_F`` (float64 round-off when not truncated) and whether ``max_rank`` cut the rank."""

    lora_A: torch.Tensor
    lora_B: torch.Tensor
    rank: int
    relative_error: float
    truncated: bool


def lora_factors(delta: torch.Tensor, max_rank: int | None = None, rtol: float = 1e-10) -> LoraFactors:
    """Rank-``k`` factors of ``P`` from its float64 SVD (``k`` = numerical rank, capped by ``max_rank``)."""
    p = delta.to(torch.float64)
    u, s, vh = torch.linalg.svd(p, full_matrices=False)
    total = float((s**2).sum())
    rank = int((s > rtol * s[0]).sum()) if s.numel() and s[0] > 0 else 0
    rank = max(rank, 1)
    truncated = max_rank is not None and rank > max_rank
    if truncated:
        rank = max_rank
    tail = float((s[rank:] ** 2).sum())
    err = (tail / total) ** 0.5 if total > 0 else 0.0
    root = s[:rank].sqrt()
    return LoraFactors(
        lora_A=root[:, None] * vh[:rank], lora_B=u[:, :rank] * root[None, :], rank=rank, relative_error=err, truncated=truncated
    )


def lora_config(module_names: list[str], rank: int, base_model_name_or_path: str | None = None) -> Any:
    """``LoraConfig`` targeting exactly ``module_names`` with ``r = lora_alpha = rank`` (scaling 1), no dropout."""
    from peft import LoraConfig

    return LoraConfig(
        r=rank,
        lora_alpha=rank,
        target_modules=list(module_names),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_model_name_or_path,
        inference_mode=True,
    )


def adapter_state_dict(factors: dict[str, LoraFactors], rank: int, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """PEFT's saved-adapter key layout: ``base_model.model.<module>.lora_{A,B}.weight``, zero-padded to ``rank``."""
    out = {}
    for name, f in factors.items():
        a = torch.zeros(rank, f.lora_A.shape[1], dtype=torch.float64)
        b = torch.zeros(f.lora_B.shape[0], rank, dtype=torch.float64)
        a[: f.rank] = f.lora_A.cpu()
        b[:, : f.rank] = f.lora_B.cpu()
        out[f"base_model.model.{name}.lora_A.weight"] = a.to(dtype).contiguous()
        out[f"base_model.model.{name}.lora_B.weight"] = b.to(dtype).contiguous()
    return out


def save_adapter(
    path: str | os.PathLike, config: Any, state_dict: dict[str, torch.Tensor], metadata: dict[str, Any]
) -> Path:
    """Write ``adapter_config.json``, ``adapter_model.safetensors`` and ``grom_metadata.json`` into ``path``."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(path))
    save_file(state_dict, str(path / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    (path / GROM_METADATA).write_text(json.dumps(metadata, indent=2, default=str))
    return path


def to_peft_model(model: Any, config: Any, state_dict: dict[str, torch.Tensor]) -> Any:
    """Wrap ``model`` (in place, as ``get_peft_model`` does) in a ``PeftModel`` carrying the factors."""
    from peft import get_peft_model, set_peft_model_state_dict

    peft_model = get_peft_model(model, config)
    device = next(model.parameters()).device
    result = set_peft_model_state_dict(peft_model, {k: v.to(device) for k, v in state_dict.items()})
    unexpected = getattr(result, "unexpected_keys", None) or []
    if unexpected:
        raise RuntimeError(f"PEFT did not accept the GROM factors: unexpected keys {unexpected[:4]}")
    peft_model.eval()
    return peft_model
