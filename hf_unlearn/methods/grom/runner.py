"""GROM's side of the method contract: its runner (fit, merge), its selector (the exact strength path) and the
retain rows it reads (its sample), which :mod:`hf_unlearn.registry` names for the core."""

from __future__ import annotations

from typing import Any

from ...result import Unlearned, num_params

__all__ = ["retain_rows_read", "run_grom", "select_grom"]


def _merged_result(model: Any, edit: Any, settings: dict[str, Any], info: dict[str, Any]) -> Unlearned:
    """The merged model of ``edit`` on ``model``; the adapter's size is its LoRA factors (rank <= forget keys)."""
    delta_params = sum(f.lora_A.numel() + f.lora_B.numel() for f in edit.lora_factors().values())
    merged = edit.to_peft(model).merge_and_unload()
    merged.eval()
    info = {"selected_layers": list(edit.selected_layers), "truncation_errors": edit.truncation_errors(), **info}
    return Unlearned(method="grom", model=merged, artifact=edit, settings=dict(settings),
                     trainable_params=delta_params, total_params=num_params(model), info=info)


def run_grom(model: Any, tokenizer: Any, forget: Any, retain: Any, output_dir: Any,
             settings: dict[str, Any]) -> Unlearned:
    """Fit the edit with ``settings`` (fields of :class:`~hf_unlearn.methods.grom.GROMConfig`) and merge it."""
    from . import GROMConfig, fit_grom

    edit = fit_grom(model, tokenizer, forget, retain, GROMConfig(progress=False, **settings))
    return _merged_result(model, edit, settings, {"retain_rows_read": edit.stats["num_retain_rows_read"]})


def select_grom(run: Any, model: Any, tokenizer: Any, forget: Any, retain: Any, output_dir: Any,
                settings: dict[str, Any], criterion: Any) -> Unlearned:
    """One fit, then the exact strength path (:func:`~hf_unlearn.methods.grom.fit_grom_path`) and its
    :meth:`~hf_unlearn.methods.grom.GROMPath.select` under ``criterion``; the chosen edit is merged as
    :func:`run_grom` merges. ``run`` (the plain run) is not needed: the path is the fit."""
    from . import GROMConfig, fit_grom_path

    path = fit_grom_path(model, tokenizer, forget, retain, GROMConfig(**{"progress": False, **settings}))
    edit = path.select(criterion, model, tokenizer)
    chosen = path.points[path.record.index]
    chosen_settings = {**settings, "retain_weight": chosen["retain_weight"], "ridge": chosen["ridge"],
                       "target_scale": chosen["scale"]}
    info = {"retain_rows_read": edit.stats.get("num_retain_rows_read"), "selection": path.record.to_dict()}
    return _merged_result(model, edit, chosen_settings, info)


def retain_rows_read(config: Any, retain: list[Any]) -> list[Any]:
    """The retain rows GROM reads: its seeded sample of ``config.retain_sample`` rows (it cannot leave one out)."""
    from . import retain_subsample

    return [retain[i] for i in retain_subsample(len(retain), config.retain_sample, config.seed)]
