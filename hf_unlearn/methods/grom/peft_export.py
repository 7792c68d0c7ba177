"""Export of a GROM edit as a PEFT LoRA adapter: with ``lora_alpha = r`` per module a LoRA layer computes
``W x + B A x``, so factors with ``B A = P`` reproduce ``W + P``; ``grom_metadata.json`` records the SHA-256 of the
other files."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...integrity import check_recorded_files, digest_record, integrity_entry, manifest_digest

ADAPTER_WEIGHTS = "adapter_model.safetensors"
GROM_METADATA = "grom_metadata.json"
GROM_AUDIT = "grom_audit.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_FILES = (ADAPTER_CONFIG, ADAPTER_WEIGHTS, GROM_METADATA, GROM_AUDIT)


def adapter_digest(folder: str | os.PathLike) -> str:
    """The SHA-256 of a saved adapter's ``grom_metadata.json`` (which records those of its other files): pin it when
    loading (``expected_sha256=``)."""
    return manifest_digest(folder, GROM_METADATA)


def grom_integrity_entry(folder: str | os.PathLike) -> dict[str, str] | None:
    """The :func:`integrity_entry` of a saved GROM adapter (its ``grom_metadata.json``)."""
    return integrity_entry(folder, GROM_METADATA)


def record_integrity(card: Any, folder: Path) -> dict[str, str] | None:
    """Put the :func:`grom_integrity_entry` of ``folder`` into ``card``'s front matter (``hf_unlearn_integrity``)."""
    entry = grom_integrity_entry(folder)
    if entry is not None:
        card.data.hf_unlearn_integrity = entry
    return entry


def verify_integrity(folder: Path, metadata: dict[str, Any], what: str,
                     required: tuple[str, ...] = (ADAPTER_CONFIG, ADAPTER_WEIGHTS)) -> None:
    """Refuse files that differ from the digests ``metadata["integrity"]`` records."""
    check_recorded_files(folder, metadata.get("integrity"), what, GROM_METADATA, required=required,
                         fix="Its weights are not the fitted GROM edit; restore the saved file or refit with fit_grom.")


@dataclass
class LoraFactors:
    """``lora_A`` ``[k, d_in]``, ``lora_B`` ``[d_out, k]``, ``||P - B A||_F / ||P||_F``, truncated or not."""

    lora_A: torch.Tensor
    lora_B: torch.Tensor
    rank: int
    relative_error: float
    truncated: bool


def factor_budget(d_out: int, d_in: int) -> int:
    """``floor(d_in d_out / (d_in + d_out))`` (at least 1): the largest rank whose factors are no larger than ``P``."""
    return max(1, (d_in * d_out) // (d_in + d_out))


def product_svd(left: torch.Tensor, right: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Thin SVD ``U S V^T`` of ``P = left @ right`` without forming ``P``: ``P = Q_l (R_l R_r^T) Q_r^T`` from the QRs
    ``left = Q_l R_l``, ``right^T = Q_r R_r`` and the SVD of the small core. Float64."""
    q_l, r_l = torch.linalg.qr(left.to(torch.float64))
    q_r, r_r = torch.linalg.qr(right.to(torch.float64).T)
    u, s, vh = torch.linalg.svd(r_l @ r_r.T, full_matrices=False)
    return q_l @ u, s, vh @ q_r.T


def lora_factors(
    delta: torch.Tensor | None = None, max_rank: int | None = None, rtol: float = 1e-10, *,
    low_rank: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> LoraFactors:
    """Rank-``k`` factors ``B A`` of ``P`` (float64), ``k <= c = min(factor_budget, max_rank)``: exact from
    ``low_rank=(left, right)`` of ``s <= c`` columns (``B = left R^T``, ``A = Q^T``, ``right^T = Q R``), else
    ``B = U_k S_k^{1/2}``, ``A = S_k^{1/2} V_k^T`` from the thin SVD (error ``sqrt(sum_{j>k} S_j^2 / sum_j S_j^2)``).
    """
    if low_rank is not None:
        left, right = low_rank
        d_out, d_in, s = left.shape[0], right.shape[1], left.shape[1]
    elif delta is not None:
        (d_out, d_in), s = delta.shape, None
    else:
        raise ValueError("lora_factors needs the dense delta or its low-rank form.")
    cap = min(factor_budget(d_out, d_in), max_rank or d_in * d_out)
    if s is not None and s <= cap:
        q, r = torch.linalg.qr(right.to(torch.float64).T)
        return LoraFactors(lora_A=q.T, lora_B=left.to(torch.float64) @ r.T, rank=s, relative_error=0.0,
                           truncated=False)
    if s is not None and s < min(d_in, d_out):
        u, sv, vh = product_svd(left, right)
    elif delta is not None:
        u, sv, vh = torch.linalg.svd(delta.to(torch.float64), full_matrices=False)
    else:
        u, sv, vh = torch.linalg.svd((left.to(torch.float64) @ right.to(torch.float64)), full_matrices=False)
    total = float((sv**2).sum())
    rank = max(int((sv > rtol * sv[0]).sum()) if sv.numel() and sv[0] > 0 else 0, 1)
    truncated = rank > cap
    rank = min(rank, cap)
    err = (float((sv[rank:] ** 2).sum()) / total) ** 0.5 if total > 0 else 0.0
    root = sv[:rank].sqrt()
    return LoraFactors(lora_A=root[:, None] * vh[:rank], lora_B=u[:, :rank] * root[None, :], rank=rank,
                       relative_error=err, truncated=truncated)


def lora_config(ranks: dict[str, int], base_model_name_or_path: str | None = None) -> Any:
    """``LoraConfig`` of exactly the modules of ``ranks``, each at rank and ``lora_alpha`` ``k``."""
    import re

    from peft import LoraConfig

    top = max(ranks.values())
    pattern = {re.escape(name): k for name, k in ranks.items()}
    return LoraConfig(
        r=top, lora_alpha=top, rank_pattern=dict(pattern), alpha_pattern=dict(pattern), target_modules=list(ranks),
        lora_dropout=0.0, bias="none", task_type="CAUSAL_LM", base_model_name_or_path=base_model_name_or_path,
        inference_mode=True,
    )


def adapter_state_dict(factors: dict[str, LoraFactors], dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """PEFT's saved-adapter keys: ``base_model.model.<module>.lora_{A,B}.weight``."""
    out = {}
    for name, f in factors.items():
        out[f"base_model.model.{name}.lora_A.weight"] = f.lora_A.to("cpu", dtype).contiguous()
        out[f"base_model.model.{name}.lora_B.weight"] = f.lora_B.to("cpu", dtype).contiguous()
    return out


def pack_lower(chol: torch.Tensor) -> torch.Tensor:
    """The lower triangle of the square ``chol`` row by row (``d (d + 1) / 2`` numbers)."""
    return torch.cat([chol[i, : i + 1] for i in range(chol.shape[0])])


def unpack_lower(packed: torch.Tensor) -> torch.Tensor:
    """The lower-triangular matrix :func:`pack_lower` packed."""
    d = int(round(((8 * packed.numel() + 1) ** 0.5 - 1) / 2))
    if d * (d + 1) // 2 != packed.numel():
        raise ValueError(f"{packed.numel()} numbers are not the lower triangle of a square matrix.")
    out = packed.new_zeros(d, d)
    start = 0
    for i in range(d):
        out[i, : i + 1] = packed[start:start + i + 1]
        start += i + 1
    return out


def _check_finite(tensors: dict[str, torch.Tensor], what: str) -> None:
    bad = [k for k, v in tensors.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise ValueError(f"Refusing to save a GROM {what} with non-finite values in {bad[:4]}; nothing was written.")


def save_adapter(
    path: str | os.PathLike, config: Any, state_dict: dict[str, torch.Tensor], metadata: dict[str, Any],
    audit: dict[str, torch.Tensor] | None = None, overwrite: bool = False,
) -> Path:
    """Write the adapter files, ``grom_metadata.json`` (with their digests) and ``audit`` into ``path``, all or
    nothing; non-finite tensors, and a folder holding adapter files unless ``overwrite``, are refused."""
    import shutil
    import tempfile

    from safetensors.torch import save_file

    from ...safe_output import OutputDirError, atomic_directory, atomic_write_json, output_lock

    _check_finite(state_dict, "adapter")
    if audit is not None:
        _check_finite(audit, "audit state")

    def write(folder: Path) -> None:
        config.save_pretrained(str(folder))
        save_file(state_dict, str(folder / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        written = [ADAPTER_CONFIG, ADAPTER_WEIGHTS]
        if audit is not None:
            save_file({k: v.contiguous() for k, v in audit.items()}, str(folder / GROM_AUDIT), metadata={"format": "pt"})
            written.append(GROM_AUDIT)
        atomic_write_json(folder / GROM_METADATA, {**metadata, "integrity": digest_record(folder, written)})

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputDirError(f"Output path {path} exists and is not a folder.")
    if not path.exists() or not any(path.iterdir()):
        with atomic_directory(path, overwrite=True) as tmp:
            write(tmp)
        return path
    clash = sorted(n for n in ADAPTER_FILES if (path / n).exists())
    if clash and not overwrite:
        raise OutputDirError(f"{path} already holds an adapter ({', '.join(clash)}); pass overwrite=True to replace it.")
    with output_lock(path):  # no other process writes into the folder while the files are renamed in
        tmp = Path(tempfile.mkdtemp(prefix=".grom-adapter.tmp-", dir=path))
        try:
            write(tmp)
            written = {p.name for p in tmp.iterdir()}
            for name in ADAPTER_FILES:
                if name not in written and (path / name).exists():
                    (path / name).unlink()
            for name in sorted(written):
                os.replace(tmp / name, path / name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def to_peft_model(model: Any, config: Any, state_dict: dict[str, torch.Tensor]) -> Any:
    """Wrap ``model`` in place in a ``PeftModel`` carrying the factors."""
    from peft import get_peft_model, set_peft_model_state_dict

    peft_model = get_peft_model(model, config)
    device = next(model.parameters()).device
    result = set_peft_model_state_dict(peft_model, {k: v.to(device) for k, v in state_dict.items()})
    unexpected = getattr(result, "unexpected_keys", None) or []
    if unexpected:
        raise RuntimeError(f"PEFT did not accept the GROM factors: unexpected keys {unexpected[:4]}")
    peft_model.eval()
    return peft_model
