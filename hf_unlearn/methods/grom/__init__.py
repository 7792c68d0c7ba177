"""GROM: closed-form one-shot unlearning edit of MLP down-projections / the LM head, exported as a PEFT
LoRA adapter, with exact per-example influence by the Woodbury identity.

    from hf_unlearn.methods.grom import GROMConfig, fit_grom
    edit = fit_grom(model, tokenizer, forget_rows, retain_rows, GROMConfig(target_modules="down_proj"))
    peft_model = edit.to_peft(model)      # LoRA with B @ A == P
    edit.save_pretrained("grom-adapter")  # PeftModel.from_pretrained(base, "grom-adapter")
    edit = GROMEdit.from_pretrained("grom-adapter", model=base)   # refuses edited files / another base
    digest = adapter_digest("grom-adapter")                       # pin it: from_pretrained(..., expected_sha256=digest)
    peft_model = load_grom_adapter(base, "grom-adapter")          # checked PeftModel.from_pretrained
    edit.push_to_hub("me/grom-adapter")                           # one commit
"""

# ruff: noqa: F401  (names beside __all__ are imported here for the tests of the internals)

from ...artifact_kinds import ArtifactKind as _ArtifactKind
from ...artifact_kinds import register_artifact_kind as _register_artifact_kind
from ...integrity import AdapterIntegrityError, BaseModelMismatchError
from ...registry import register_class as _register_class
from .attribution import attribution_scores, find_target_modules, lm_head_is_tied, select_band
from .config import GROMConfig
from .edit import GROMEdit, check_base, load_grom_adapter, untie_lm_head
from .fit import fit_grom
from .inputs import check_grom_inputs, model_max_positions, retain_subsample
from .peft_export import GROM_METADATA as _GROM_METADATA
from .peft_export import LoraFactors, adapter_digest, lora_factors
from .peft_export import grom_integrity_entry as _grom_integrity_entry
from .solve import GROMSolution, grom_objective, normal_matrix, solve_grom, woodbury_drop
from .strength_path import GROMPath, fit_grom_path, grom_path_from_edit
from .targets import specificity_weights

_register_class(GROMEdit, artifact_kind="grom_adapter", entry_point="hf_unlearn.methods.grom.runner:run_grom",
                config_class=GROMConfig, selection="hf_unlearn.methods.grom.runner:select_grom",
                retain_rows_read="hf_unlearn.methods.grom.runner:retain_rows_read")


def _folder_is_grom(folder):
    return (folder / "adapter_config.json").is_file() and (folder / _GROM_METADATA).is_file()


_register_artifact_kind(_ArtifactKind(
    "grom_adapter", "grom_adapter.md", "grom", lambda: (GROMEdit,), "peft",
    base_model=lambda edit: edit.base_model_name_or_path, settings=lambda edit: dict(edit.config.saved_dict()),
    folder_matches=_folder_is_grom, integrity=_grom_integrity_entry,
))

# What a user imports: the config, the fit, the edit and its strength path, loading a saved adapter with its checks,
# and the closed-form solve with its objective. The other names imported above are for the tests of the internals.
__all__ = [
    "AdapterIntegrityError", "BaseModelMismatchError", "GROMConfig", "GROMEdit", "GROMPath", "adapter_digest",
    "fit_grom", "fit_grom_path", "grom_objective", "load_grom_adapter", "solve_grom",
]
