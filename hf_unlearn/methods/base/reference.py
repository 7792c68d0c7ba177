"""The frozen reference model of an unlearning run: the initial model, reloaded from its folder or copied.

Objectives with a reference (NPO's forget term, the KL retain term, MASC's ``pi_0``, ...) score batches under it
(:meth:`~hf_unlearn.methods.base.trainer.UnlearningTrainer.reference_scores`). :class:`ReferenceModelMixin` builds
it for :class:`~hf_unlearn.methods.base.trainer.UnlearningTrainer`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from trl.trainer.utils import create_model_from_path

from ...model_copy import independent_copy

__all__ = ["RELOAD_WITHOUT_DEVICE_MAP", "ReferenceModelMixin"]

#: Launch types under which the reference is reloaded without ``device_map="auto"`` (TRL's default on a GPU):
#: spread over every GPU before DDP, DeepSpeed or FSDP wraps it, it would not be this process's model.
RELOAD_WITHOUT_DEVICE_MAP = ("MULTI_GPU", "DEEPSPEED", "FSDP")


def _local_dir(path: Any) -> str | None:
    """``path`` as a string when it names an existing local folder, else ``None``."""
    if isinstance(path, (str, os.PathLike)) and str(path) and Path(path).expanduser().is_dir():
        return str(path)
    return None


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """Whether the two models hold exactly the same tensors under the same names (values, shapes, dtypes)."""
    sa, sb = a.state_dict(), b.state_dict()
    if sa.keys() != sb.keys():
        return False
    return all(sa[k].dtype == sb[k].dtype and torch.equal(sa[k].cpu(), sb[k].cpu()) for k in sa)


class ReferenceModelMixin:
    """The reference-model part of :class:`~hf_unlearn.methods.base.trainer.UnlearningTrainer` (a ``Trainer``:
    it reads ``self.model``, ``self.args`` and ``self.accelerator``)."""

    def _create_reference_model(self, model_id: str | None, ref_model: Any = None) -> torch.nn.Module:
        """Frozen eval-mode reference (the initial model), prepared by accelerate like the policy.

        ``ref_model`` (the trainer's ``ref_model=``) is used as given. Otherwise the reference is reloaded from
        the model's path when one is known (``model_id``, or the live model's ``config._name_or_path`` when that
        is a local folder), as TRL's ``DPOTrainer`` does; a reload whose weights differ from the live model's (a
        model changed in memory since it was loaded) is dropped for an independent copy of the live model. A
        partitioned model (ZeRO-3 / FSDP, :func:`hf_unlearn.partitioning.is_partitioned`) is never copied: without
        a path to reload from it is refused with a ``ValueError`` naming ``ref_model=``."""
        from ...partitioning import is_partitioned

        live = self.accelerator.unwrap_model(self.model)
        ref = ref_model
        if ref is None:
            path = model_id or _local_dir(getattr(getattr(live, "config", None), "_name_or_path", None))
            ref = self._reload_reference(path, live, check=model_id is None) if path else None
        if ref is None:
            if is_partitioned(live):
                raise ValueError(
                    f"{type(self).__name__} needs a frozen reference model, and the model's weights are partitioned "
                    "across processes (DeepSpeed ZeRO-3 / FSDP), so they cannot be copied: load the model from a "
                    "folder (its reference is reloaded from there) or pass ref_model= (the initial model, loaded "
                    "separately)."
                )
            # SFTTrainer patched `forward` on the instance; a plain deep copy would still run the original's weights
            ref = independent_copy(live)
        ref.eval()
        ref.requires_grad_(False)
        if self.is_deepspeed_enabled:
            from trl.models import prepare_deepspeed

            return prepare_deepspeed(ref, self.accelerator)
        if self.is_fsdp_enabled:
            from trl.models import prepare_fsdp

            return prepare_fsdp(ref, self.accelerator)
        return self.accelerator.prepare_model(ref, evaluation_mode=True)

    def _reload_reference(self, path: str, live: Any, check: bool) -> torch.nn.Module | None:
        """The model reloaded from ``path`` (in the live model's dtype), or ``None`` when ``check`` and its weights
        are not exactly the live model's, or when a reload that was not asked for fails."""
        from ...partitioning import is_partitioned

        kwargs = dict(self.args.model_init_kwargs or {})
        kwargs.setdefault("dtype", live.dtype)
        if self.args.distributed_state.distributed_type in RELOAD_WITHOUT_DEVICE_MAP or self.is_fsdp_enabled:
            kwargs["device_map"] = None  # each process loads it whole; DDP / DeepSpeed / FSDP place or shard it
        try:
            ref = create_model_from_path(path, **kwargs)
        except Exception:
            if not check:
                raise
            return None
        if check and not is_partitioned(live) and not _same_weights(ref, live):
            return None
        return ref
