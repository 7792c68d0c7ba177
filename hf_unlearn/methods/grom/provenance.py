"""Provenance of a GROM edit: a fingerprint of the base weights it was solved against.

``P`` is solved for one base model: its keys, targets and margins all come from that model's forward passes.
Added to another model's weights, the same ``P`` is meaningless (and plain PEFT would load it silently as long as
the module names and shapes fit). The fingerprint records, for every edited module, its name, shape, dtype and two
SHA-256 digests of its weight: of the float32 values (exact identity) and of the values rounded to bfloat16 (the
same base loaded in a lower precision). :func:`check_base` refuses a model that matches neither.

:func:`weight_fingerprint` (one tensor) and :func:`base_fingerprint` / :func:`check_base` (named modules of a
model) are public so that other artifacts can identify their base by its weights in the same way;
:func:`file_sha256` is the digest of a saved file that a GROM adapter records for its own files.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import torch

FINGERPRINT_VERSION = 1


class BaseModelMismatchError(ValueError):
    """A GROM adapter loaded onto a base model other than the one it was solved against."""


def _digest(t: torch.Tensor) -> str:
    arr = t.contiguous().numpy()
    return hashlib.sha256(memoryview(arr).cast("B")).hexdigest()


def file_sha256(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    """Hex SHA-256 digest of the bytes of the file at ``path`` (read in chunks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk_size), b""):
            digest.update(block)
    return digest.hexdigest()


def weight_fingerprint(weight: torch.Tensor) -> dict[str, Any]:
    """``{"shape", "dtype", "sha256", "sha256_bf16"}`` of one weight (SHA-256 of its float32 bytes, and of its
    bfloat16-rounded bytes)."""
    w = weight.detach().to("cpu")
    return {
        "shape": list(w.shape),
        "dtype": str(w.dtype).removeprefix("torch."),
        "sha256": _digest(w.to(torch.float32)),
        "sha256_bf16": _digest(w.to(torch.bfloat16).view(torch.int16)),
    }


def base_fingerprint(model: Any, module_names: list[str]) -> dict[str, Any]:
    """Fingerprint of the weights of ``module_names`` in ``model`` (the edited modules, before the edit)."""
    modules = dict(model.named_modules())
    missing = [n for n in module_names if n not in modules]
    if missing:
        raise ValueError(f"Cannot fingerprint modules {missing}: not in {type(model).__name__}.")
    return {
        "version": FINGERPRINT_VERSION,
        "algorithm": "sha256 of the float32 (and bfloat16-rounded) weight bytes of each edited module",
        "modules": {n: weight_fingerprint(modules[n].weight) for n in module_names},
    }


def _unwrap(model: Any) -> Any:
    """The plain transformers model under a ``PeftModel`` (whose module names carry a ``base_model.model.``
    prefix)."""
    if hasattr(model, "peft_config") and hasattr(model, "get_base_model"):
        return model.get_base_model()
    return model


def check_base(fingerprint: dict[str, Any] | None, model: Any, what: str = "This GROM adapter") -> None:
    """Refuse (:class:`BaseModelMismatchError`) a ``model`` whose edited modules are not the fingerprinted ones.

    A module matches when its name and shape are the recorded ones and its weight has the recorded float32
    digest, or the recorded bfloat16 digest (the same base held in bf16/fp16). ``fingerprint=None`` (an adapter
    written before fingerprints) is refused too: nothing says which base it belongs to.
    """
    if not fingerprint or "modules" not in fingerprint:
        raise BaseModelMismatchError(
            f"{what} records no base-model fingerprint, so hf-unlearn cannot check that it belongs to this base; "
            "refit it with this base (fit_grom) and save it again."
        )
    model = _unwrap(model)
    modules = dict(model.named_modules())
    problems = []
    for name, want in fingerprint["modules"].items():
        module = modules.get(name)
        weight = getattr(module, "weight", None) if module is not None else None
        if weight is None:
            problems.append(f"{name}: missing")
            continue
        if list(weight.shape) != list(want["shape"]):
            problems.append(f"{name}: shape {list(weight.shape)} != {want['shape']}")
            continue
        got = weight_fingerprint(weight)
        if got["sha256"] != want["sha256"] and got["sha256_bf16"] != want["sha256_bf16"]:
            problems.append(f"{name}: weights differ (sha256 {got['sha256'][:12]} != {want['sha256'][:12]})")
    if problems:
        shown = "; ".join(problems[:4]) + (f"; and {len(problems) - 4} more" if len(problems) > 4 else "")
        raise BaseModelMismatchError(
            f"{what} was solved against a different base model ({shown}). A GROM edit P is only valid for the "
            "weights it was solved with; load it onto that base (adapter base_model_name_or_path), or refit "
            "fit_grom on this one. Applying it here would silently change the model."
        )
