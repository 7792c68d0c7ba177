"""GROM's fit as the registry runs it (:class:`GROMFit`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ...registry import MethodFit
from ...result import Unlearned, num_params
from .edit import GROMEdit

__all__ = ["GROMFit"]


def _merged_result(model: Any, edit: Any, settings: dict[str, Any], info: dict[str, Any]) -> Unlearned:
    """The merged model of ``edit`` on ``model``; the trainable size is its LoRA factors."""
    delta_params = sum(f.lora_A.numel() + f.lora_B.numel() for f in edit.lora_factors().values())
    merged = edit.to_peft(model).merge_and_unload()
    merged.eval()
    info = {"selected_layers": list(edit.selected_layers), "truncation_errors": edit.truncation_errors(), **info}
    return Unlearned(method="grom", model=merged, artifact=edit, settings=settings, trainable_params=delta_params,
                     total_params=num_params(model), info=info)


class GROMFit(MethodFit):
    """GROM as a registered method: the edit, saved as a PEFT LoRA adapter."""

    artifact_cls = GROMEdit
    artifact_kind = "grom_adapter"

    def __call__(self, model: Any, tokenizer: Any, forget: Any, retain: Any, config: Any) -> Unlearned:
        """Fit the edit with ``config`` (:class:`~hf_unlearn.methods.grom.GROMConfig`) and merge it."""
        from .fit import fit_grom

        edit = fit_grom(model, tokenizer, forget, retain, dataclasses.replace(config, progress=False))
        return _merged_result(model, edit, {}, {"retain_rows_read": edit.stats["num_retain_rows_read"]})

    def select(self, model: Any, tokenizer: Any, forget: Any, retain: Any, config: Any, criterion: Any) -> Unlearned:
        """:func:`~hf_unlearn.methods.grom.fit_grom_path`, then merge the edit ``criterion`` selects on it."""
        from .strength_path import fit_grom_path

        path = fit_grom_path(model, tokenizer, forget, retain, dataclasses.replace(config, progress=False))
        edit = path.select(criterion, model, tokenizer)
        chosen = path.points[path.record.index]
        settings = {"retain_weight": chosen["retain_weight"], "ridge": chosen["ridge"], "target_scale": chosen["scale"]}
        info = {"retain_rows_read": edit.stats.get("num_retain_rows_read"), "selection": path.record.to_dict()}
        return _merged_result(model, edit, settings, info)

    def retain_rows_read(self, config: Any, retain: list[Any]) -> list[Any]:
        """GROM's seeded sample of ``config.retain_sample`` retain rows."""
        from .inputs import retain_subsample

        return [retain[i] for i in retain_subsample(len(retain), config.retain_sample, config.seed)]
