"""The checks :class:`~hf_unlearn.methods.base.trainer.UnlearningTrainer` runs on its inputs before any work."""

from __future__ import annotations

import copy
import os
import warnings
from pathlib import Path
from typing import Any

from datasets import Dataset

from ...data import model_max_positions, overlapping_examples
from ...safe_output import check_output_dir
from .checkpoints import RUN_REQUEST_NAME, _checkpoint_dirs
from .config import BaseUnlearningConfig
from .pairing import _identity_keys
from .reference import _local_dir

__all__ = ["check_disjoint", "check_output_folder", "limit_max_length", "model_dirs"]


def _holds_request_only(folder: Path) -> bool:
    """Whether ``folder`` holds nothing but ``logs/run_request.json`` (written there just before the run)."""
    logs = folder / "logs"
    try:
        return ([p.name for p in folder.iterdir()] == ["logs"] and not logs.is_symlink()
                and [p.name for p in logs.iterdir()] == [RUN_REQUEST_NAME])
    except OSError:
        return False


def model_dirs(model: Any) -> tuple[str, ...]:
    """Local folders the model was read from (refused as output folders)."""
    candidates = [model] if isinstance(model, (str, os.PathLike)) else [
        getattr(model, "name_or_path", None), getattr(getattr(model, "config", None), "_name_or_path", None)
    ]
    return tuple(dict.fromkeys(d for d in map(_local_dir, candidates) if d is not None))


def check_output_folder(args: Any, input_dirs: tuple[str, ...]) -> None:
    """Refuse an output folder overlapping a model folder, non-empty without ``overwrite`` (checkpoints or only
    ``logs/run_request.json`` count as empty), or not writable."""
    out = Path(args.output_dir)
    overwrite = bool(getattr(args, "overwrite", False)) or bool(_checkpoint_dirs(out)) or _holds_request_only(out)
    check_output_dir(out, input_dirs, overwrite=overwrite)


def limit_max_length(args: BaseUnlearningConfig, model_config: Any) -> BaseUnlearningConfig:
    """``args`` with ``max_length`` lowered to the model's maximum positions (a copy when changed)."""
    limit = model_max_positions(model_config) if model_config is not None else None
    if limit is None or (args.max_length is not None and args.max_length <= limit):
        return args
    args = copy.copy(args)
    args.max_length = limit
    return args


def check_disjoint(forget: Dataset, retain: Dataset, allow_overlap: bool, stacklevel: int) -> None:
    """Refuse (``ValueError``) forget rows that also occur in the retain set, or warn with ``allow_overlap``."""
    keys = _identity_keys(forget)
    if keys is None or keys != _identity_keys(retain):
        return
    shared = overlapping_examples(forget, retain, keys=keys)
    if shared and not allow_overlap:
        raise ValueError(
            f"{shared} of the {len(forget)} forget examples also occur in the retain set: the objective "
            "would push their likelihood down and up at once. Remove them, or set `allow_overlap=True`."
        )
    if shared:
        warnings.warn(f"{shared} forget examples also occur in the retain set (allow_overlap=True).",
                      stacklevel=stacklevel + 1)
