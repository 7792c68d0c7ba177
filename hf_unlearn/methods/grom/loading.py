"""Reading a saved GROM adapter back for :meth:`~hf_unlearn.methods.grom.GROMEdit.from_pretrained`, with the check
that the audit's ``P`` is the adapter's ``B A``."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch

from ...integrity import AdapterIntegrityError
from .peft_export import ADAPTER_CONFIG, ADAPTER_WEIGHTS, GROM_AUDIT, GROM_METADATA, unpack_lower
from .solve import GROMSolution, delta_from_cholesky


def _read_metadata(folder: Path, source: Any) -> dict[str, Any]:
    """``grom_metadata.json`` of ``folder`` as a dict with ``config`` and ``modules``, or a ValueError."""
    meta_path = folder / GROM_METADATA
    if not meta_path.is_file():
        raise ValueError(f"{source} is not a GROM adapter (no {GROM_METADATA}).")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{meta_path} is not valid JSON ({err}). Restore the file from the saved adapter.") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{meta_path} must hold a JSON object, got {type(meta).__name__}; the GROM metadata is damaged.")
    missing = [k for k in ("config", "modules") if not isinstance(meta.get(k), dict)]
    if missing:
        raise ValueError(f"{meta_path} has no {missing} entry (or not an object); restore the file.")
    return meta


def _load_safetensors(path: Path, what: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if not path.is_file():
        raise ValueError(f"{what}: {path.name} is missing; the adapter folder is incomplete.")
    try:
        return load_file(str(path))
    except Exception as err:  # safetensors raises its own error types for a damaged header
        raise ValueError(f"{what}: {path.name} cannot be read as safetensors ({err}); restore the saved file.") from None


def _lora_scaling(folder: Path, what: str) -> Any:
    """``scaling(module)``: ``lora_alpha / r`` of that module (``/ sqrt(r)`` with ``use_rslora``)."""
    import re

    path = folder / ADAPTER_CONFIG
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
        rank, alpha = float(cfg["r"]), float(cfg["lora_alpha"])
        ranks = {str(k): float(v) for k, v in (cfg.get("rank_pattern") or {}).items()}
        alphas = {str(k): float(v) for k, v in (cfg.get("alpha_pattern") or {}).items()}
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError, AttributeError) as err:
        raise ValueError(f"{what}: {ADAPTER_CONFIG} is missing or has no numeric r / lora_alpha "
                         f"({type(err).__name__}).") from None

    def pick(pattern: dict[str, float], default: float, name: str) -> float:
        return next((v for k, v in pattern.items() if re.match(rf"(.*\.)?({k})$", name)), default)

    def scaling(name: str) -> float:
        r, a = pick(ranks, rank, name), pick(alphas, alpha, name)
        if not (r > 0 and math.isfinite(a)):
            raise ValueError(f"{what}: {ADAPTER_CONFIG} has r={r}, lora_alpha={a} for {name}; restore the saved file.")
        return a / (math.sqrt(r) if cfg.get("use_rslora") else r)

    scaling(".")  # the defaults are valid
    return scaling


#: Slack beyond the recorded truncation error of the check that the audit's ``P`` is ``B A`` (float32 factors).
FACTOR_CHECK_RTOL = 1e-4


def _check_factors_match(
    delta: torch.Tensor, product: torch.Tensor, info: Any, name: str, what: str, audit_name: str
) -> None:
    """Refuse an audit ``P`` unless ``||s B A - P||_F <= (e + FACTOR_CHECK_RTOL) ||P||_F``."""
    recorded = info.get("relative_frobenius_error", 0.0) if isinstance(info, dict) else 0.0
    recorded = float(recorded) if isinstance(recorded, (int, float)) and math.isfinite(recorded) else 0.0
    p = delta.to(torch.float64)
    if tuple(p.shape) != tuple(product.shape):
        raise AdapterIntegrityError(f"{what}: module {name!r} has P of shape {list(p.shape)} in {audit_name} but B A "
                                    f"of shape {list(product.shape)} in {ADAPTER_WEIGHTS}.")
    scale = float(p.norm())
    err = float((product - p).norm())
    if not err <= (recorded + FACTOR_CHECK_RTOL) * scale + 1e-30:
        rel = err / scale if scale > 0 else float("inf")
        raise AdapterIntegrityError(
            f"{what}: for module {name!r} the audit's P ({audit_name}) and the adapter's B A ({ADAPTER_WEIGHTS}) differ "
            f"by a relative Frobenius error of {rel:.3g} (allowed: {recorded:.3g} + {FACTOR_CHECK_RTOL:g}); restore both."
        )


_HUB_FILES = ["adapter_config.json", ADAPTER_WEIGHTS, GROM_METADATA, GROM_AUDIT, "README.md", "unlearning_report.json"]


def _resolve_folder(
    path_or_repo_id: str | os.PathLike, revision: str | None, token: Any, cache_dir: Any, local_files_only: bool
) -> Path:
    path = Path(path_or_repo_id).expanduser()
    if path.is_dir():
        return path
    if isinstance(path_or_repo_id, os.PathLike) or str(path_or_repo_id).startswith((".", "/", "~")):
        raise ValueError(f"GROM adapter folder {path_or_repo_id} does not exist.")
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(
        str(path_or_repo_id), revision=revision, token=token, cache_dir=cache_dir,
        local_files_only=local_files_only, allow_patterns=_HUB_FILES,
    ))


def _read_audit(audit_path: Path | None, audit_name: str | None, allow_missing: bool, what: str
                ) -> dict[str, torch.Tensor]:
    """The audit state the metadata names (``{}`` when none); a missing file is refused unless ``allow_missing``."""
    if audit_path is None:
        return {}
    if audit_path.is_file():
        return _load_safetensors(audit_path, what)
    if not allow_missing:
        raise AdapterIntegrityError(f"{what}: {audit_name} is missing; restore it, or pass allow_missing_audit=True "
                                    "to load the edit without it (no influence()).")
    return {}


def _restore_modules(
    modules: dict[str, Any], state: dict[str, torch.Tensor], scaling: Any, audit: dict[str, torch.Tensor],
    what: str, audit_name: str | None,
) -> tuple[dict[str, torch.Tensor], dict[str, GROMSolution], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``(deltas, solutions, forget keys, targets)`` of every module the metadata lists: ``P = s B A`` without an
    audit, else ``P = c_f D X_f^T A^{-1}`` recomputed from the audit and checked against ``s B A``."""
    deltas, solutions, keys, targets = {}, {}, {}, {}
    for name, info in modules.items():
        a_key, b_key = f"base_model.model.{name}.lora_A.weight", f"base_model.model.{name}.lora_B.weight"
        if a_key not in state or b_key not in state:
            raise ValueError(f"{what}: {ADAPTER_WEIGHTS} has no LoRA factors for module {name!r} (keys {a_key} / "
                             f"{b_key}).")
        product = scaling(name) * (state[b_key].double() @ state[a_key].double())
        if not audit:
            deltas[name] = product.float()
            continue
        parts = {part: f"{part}/{name}" for part in ("chol_lower", "forget_scale", "forget_keys", "targets")}
        absent = [k for k in parts.values() if k not in audit]
        if absent:
            raise ValueError(f"{what}: {audit_name} has no {absent} for module {name!r}; the audit is incomplete.")
        try:
            chol = unpack_lower(audit[parts["chol_lower"]].to(torch.float64))
            forget_scale = float(audit[parts["forget_scale"]][0])
            delta = delta_from_cholesky(chol, audit[parts["forget_keys"]], audit[parts["targets"]], forget_scale)
        except (ValueError, RuntimeError, IndexError) as err:
            raise AdapterIntegrityError(f"{what}: the audit state of module {name!r} in {audit_name} does not fit "
                                        f"together ({err}).") from None
        _check_factors_match(delta, product, info, name, what, audit_name)
        sol = GROMSolution(delta=delta, chol=chol, forget_scale=forget_scale)
        solutions[name], keys[name], targets[name] = sol, audit[parts["forget_keys"]], audit[parts["targets"]]
        deltas[name] = sol.delta.float()
    return deltas, solutions, keys, targets
