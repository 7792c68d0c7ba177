"""The baselines. ``config.py`` (their configs), ``loss.py`` (GradAscent, GradDiff, NPO, SimNPO and DPO as pure
functions), ``token_loss.py`` (WGA, SatImp, CE-U, UNDIAL as pure functions), ``trainer.py`` (GradAscent, GradDiff,
NPO and SimNPO: thin presets of the shared trainer that train
:func:`~hf_unlearn.methods.baselines.loss.baseline_loss`), ``token_trainer.py`` (WGA, SatImp, CE-U, UNDIAL) and
``dpo.py`` (DPO and IdkDPO, a preferred answer per forget row). Each trainer registers its method here."""
# ruff: noqa: F401, I001  (a plain list of re-exports)

from ...registry import register_class as _register_class
from .config import (
    CEUConfig, DPOConfig, ForgetRetainConfig, GradAscentConfig, GradDiffConfig, IdkDPOConfig, NPOConfig,
    PreferenceConfig, SatImpConfig, SimNPOConfig, UNDIALConfig, WGAConfig,
)
from .loss import baseline_loss, dpo_loss, grad_ascent_loss, grad_diff_loss, npo_loss, simnpo_loss
from .token_loss import ceu_loss, satimp_loss, undial_loss, wga_loss
from .trainer import (
    BaselineTrainer, GradAscentTrainer, GradDiffTrainer, NPOTrainer, SimNPOTrainer, baseline_objective,
)
from .token_trainer import CEUTrainer, ForgetRetainTrainer, SatImpTrainer, UNDIALTrainer, WGATrainer
from .dpo import DPOTrainer, IdkDPOTrainer, PreferenceTrainer, load_idk_answers

for _trainer in (GradAscentTrainer, GradDiffTrainer, NPOTrainer, SimNPOTrainer, WGATrainer, SatImpTrainer,
                 CEUTrainer, UNDIALTrainer, DPOTrainer, IdkDPOTrainer):
    _register_class(_trainer, artifact_kind="unlearned_model", trainer=True)
del _trainer

__all__ = [
    "BaselineTrainer", "CEUConfig", "CEUTrainer", "DPOConfig", "DPOTrainer", "ForgetRetainConfig", "ForgetRetainTrainer",
    "GradAscentConfig", "GradAscentTrainer", "GradDiffConfig", "GradDiffTrainer", "IdkDPOConfig", "IdkDPOTrainer",
    "NPOConfig", "NPOTrainer", "PreferenceConfig", "PreferenceTrainer", "SatImpConfig", "SatImpTrainer",
    "SimNPOConfig", "SimNPOTrainer", "UNDIALConfig", "UNDIALTrainer", "WGAConfig", "WGATrainer", "baseline_loss",
    "baseline_objective", "ceu_loss", "dpo_loss", "grad_ascent_loss", "grad_diff_loss", "load_idk_answers",
    "npo_loss", "satimp_loss", "simnpo_loss", "undial_loss", "wga_loss",
]
