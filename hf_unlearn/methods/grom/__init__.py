"""GROM: closed-form one-shot unlearning edit of MLP down-projections / the LM head, exported as a PEFT
LoRA adapter, with exact per-example influence by the Woodbury identity (``docs/methods/grom.md``).
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

_register_artifact_kind(_ArtifactKind(
    "grom_adapter", "grom_adapter.md", "grom", lambda: (GROMEdit,), "peft",
    base_model=lambda edit: edit.base_model_name_or_path, settings=lambda edit: dict(edit.config.saved_dict()),
    folder_matches=lambda folder: (folder / "adapter_config.json").is_file() and (folder / _GROM_METADATA).is_file(),
    integrity=_grom_integrity_entry,
))

__all__ = ["GROMConfig", "GROMEdit", "GROMFit", "GROMPath", "adapter_digest", "fit_grom", "fit_grom_path",
           "load_grom_adapter"]
