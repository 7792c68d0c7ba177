"""GROM: closed-form one-shot unlearning edit of MLP down-projections / the LM head, exported as a PEFT
LoRA adapter, with exact per-example influence by the Woodbury identity.

    from hf_unlearn.grom import GROMConfig, fit_grom
    edit = fit_grom(model, tokenizer, forget_rows, retain_rows, GROMConfig(target_modules="down_proj"))
    peft_model = edit.to_peft(model)      # LoRA with B @ A == P
    edit.save_pretrained("grom-adapter")  # PeftModel.from_pretrained(base, "grom-adapter")
"""

from .attribution import attribution_scores, find_target_modules, select_band
from .config import GROMConfig
from .model import GROMEdit, fit_grom
from .peft_export import LoraFactors, lora_factors
from .solve import GROMSolution, grom_objective, normal_matrix, solve_grom, woodbury_drop
from .targets import specificity_weights

__all__ = [
    "GROMConfig", "GROMEdit", "GROMSolution", "LoraFactors", "attribution_scores", "find_target_modules",
    "fit_grom", "grom_objective", "lora_factors", "normal_matrix", "select_band", "solve_grom",
    "specificity_weights", "woodbury_drop",
]
