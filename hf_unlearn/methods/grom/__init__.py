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

from ...registry import register_class as _register_class
from .attribution import attribution_scores, find_target_modules, lm_head_is_tied, select_band
from .config import GROMConfig
from .model import (
    GROMEdit,
    check_grom_inputs,
    fit_grom,
    load_grom_adapter,
    model_max_positions,
    retain_subsample,
    untie_lm_head,
)
from .path import GROMPath, fit_grom_path, grom_path_from_edit
from .peft_export import AdapterIntegrityError, LoraFactors, adapter_digest, lora_factors
from .provenance import BaseModelMismatchError, base_fingerprint, check_base, file_sha256, weight_fingerprint
from .solve import GROMSolution, grom_objective, normal_matrix, solve_grom, woodbury_drop
from .targets import specificity_weights

_register_class(GROMEdit, artifact_kind="grom_adapter", entry_point="hf_unlearn.methods.grom:fit_grom",
                config_class=GROMConfig)

__all__ = [
    "AdapterIntegrityError", "BaseModelMismatchError", "GROMConfig", "GROMEdit", "GROMSolution", "LoraFactors",
    "adapter_digest", "attribution_scores", "base_fingerprint", "check_base", "check_grom_inputs", "file_sha256",
    "find_target_modules", "fit_grom", "grom_objective", "lm_head_is_tied", "load_grom_adapter", "lora_factors",
    "model_max_positions", "normal_matrix", "retain_subsample", "select_band", "solve_grom", "specificity_weights",
    "untie_lm_head", "weight_fingerprint", "woodbury_drop", "GROMPath", "fit_grom_path", "grom_path_from_edit",
]
