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

from ...artifact_kinds import ArtifactKind as _ArtifactKind
from ...artifact_kinds import register_artifact_kind as _register_artifact_kind
from ...registry import register_method
from .config import GROMConfig
from .edit import GROMEdit, load_grom_adapter
from .fit import fit_grom
from .peft_export import GROM_METADATA as _GROM_METADATA
from .peft_export import adapter_digest
from .peft_export import grom_integrity_entry as _grom_integrity_entry
from .runner import GROMFit
from .strength_path import GROMPath, fit_grom_path

register_method("grom", config_cls=GROMConfig, fit=GROMFit())


def _folder_is_grom(folder):
    return (folder / "adapter_config.json").is_file() and (folder / _GROM_METADATA).is_file()


_register_artifact_kind(_ArtifactKind(
    "grom_adapter", "grom_adapter.md", "grom", lambda: (GROMEdit,), "peft",
    base_model=lambda edit: edit.base_model_name_or_path, settings=lambda edit: dict(edit.config.saved_dict()),
    folder_matches=_folder_is_grom, integrity=_grom_integrity_entry,
))

__all__ = ["GROMConfig", "GROMEdit", "GROMFit", "GROMPath", "adapter_digest", "fit_grom", "fit_grom_path",
           "load_grom_adapter"]
