"""The frozen reference model of an unlearning run: the initial model, reloaded from its folder or copied."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from trl.trainer.utils import create_model_from_path

from ...model_copy import independent_copy

#: Launch types under which the reference is reloaded without ``device_map="auto"`` (each process's own copy).
RELOAD_WITHOUT_DEVICE_MAP = ("MULTI_GPU", "DEEPSPEED", "FSDP")


def _local_dir(path: Any) -> str | None:
    """``path`` as a string when it names an existing local folder, else ``None``."""
    if isinstance(path, (str, os.PathLike)) and str(path) and Path(path).expanduser().is_dir():
        return str(path)
    return None


def reload_reference(
    path: str, live: Any, check: bool, model_init_kwargs: dict[str, Any] | None, whole: bool
) -> torch.nn.Module | None:
    """The model reloaded from ``path`` in the live model's dtype (``whole``: without a ``device_map``); with
    ``check``, ``None`` when it fails or its weights are not exactly the live model's."""
    from ...partitioning import is_partitioned

    kwargs = dict(model_init_kwargs or {})
    kwargs.setdefault("dtype", live.dtype)
    if whole:
        kwargs["device_map"] = None
    try:
        ref = create_model_from_path(path, **kwargs)
    except Exception:
        if not check:
            raise
        return None
    if check and not is_partitioned(live):  # exactly the same tensors under the same names
        sa, sb = ref.state_dict(), live.state_dict()
        if sa.keys() != sb.keys() or not all(sa[k].dtype == sb[k].dtype and torch.equal(sa[k].cpu(), sb[k].cpu())
                                             for k in sa):
            return None
    return ref


def frozen_reference(
    live: torch.nn.Module, model_id: str | None, ref_model: Any,
    reload: Callable[[str, Any, bool], torch.nn.Module | None], owner: str,
) -> torch.nn.Module:
    """The frozen eval-mode initial model: ``ref_model``; else reloaded from ``model_id`` or the live model's
    local folder (then checked equal to it); else a copy of ``live``. A partitioned model (ZeRO-3 / FSDP) is
    never copied: without a path it is refused (``ValueError``)."""
    from ...partitioning import is_partitioned

    ref = ref_model
    if ref is None:
        path = model_id or _local_dir(getattr(getattr(live, "config", None), "_name_or_path", None))
        ref = reload(path, live, model_id is None) if path else None
    if ref is None:
        if is_partitioned(live):
            raise ValueError(
                f"{owner} needs a frozen reference model, and the model's weights are partitioned across processes "
                "(DeepSpeed ZeRO-3 / FSDP), so they cannot be copied: load the model from a folder (its reference "
                "is reloaded from there) or pass ref_model= (the initial model, loaded separately)."
            )
        # SFTTrainer patched `forward` on the instance; a plain deep copy would still run the original's weights
        ref = independent_copy(live)
    ref.eval()
    ref.requires_grad_(False)
    return ref
