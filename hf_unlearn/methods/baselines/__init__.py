"""The baselines. ``config.py`` (their configs), ``loss.py`` (GradAscent, GradDiff, NPO, SimNPO and DPO as pure
functions), ``token_loss.py`` (WGA, SatImp, CE-U, UNDIAL as pure functions), ``trainer.py`` (GradAscent, GradDiff,
NPO and SimNPO: thin presets of the shared trainer that train
:func:`~hf_unlearn.methods.baselines.loss.baseline_loss`), ``token_trainer.py`` (WGA, SatImp, CE-U, UNDIAL) and
``dpo.py`` (DPO and IdkDPO, a preferred answer per forget row). Each trainer registers its method here."""
# ruff: noqa: F401, I001  (a plain list of re-exports)

from ...registry import register_class as _register_class
from .config import (
    CEUConfig, ForgetRetainConfig, GradAscentConfig, GradDiffConfig, IdkDPOConfig, NPOConfig, PreferenceConfig,
    SatImpConfig, SimNPOConfig, UNDIALConfig, UnlearnDPOConfig, WGAConfig,
)
from .loss import baseline_loss, dpo_loss, grad_ascent_loss, grad_diff_loss, npo_loss, simnpo_loss
from .token_loss import ceu_loss, satimp_loss, undial_loss, wga_loss
from .trainer import (
    BaselineTrainer, GradAscentTrainer, GradDiffTrainer, NPOTrainer, SimNPOTrainer, baseline_objective,
)
from .token_trainer import CEUTrainer, ForgetRetainTrainer, SatImpTrainer, UNDIALTrainer, WGATrainer
from .dpo import IdkDPOTrainer, PreferenceTrainer, UnlearnDPOTrainer, load_idk_answers

for _trainer in (GradAscentTrainer, GradDiffTrainer, NPOTrainer, SimNPOTrainer, WGATrainer, SatImpTrainer,
                 CEUTrainer, UNDIALTrainer, UnlearnDPOTrainer, IdkDPOTrainer):
    _register_class(_trainer, artifact_kind="unlearned_model", trainer=True)
del _trainer

# What a user imports: each baseline's config and trainer, and the losses as pure functions.
__all__ = [
    "BaselineTrainer", "CEUConfig", "CEUTrainer", "GradAscentConfig", "GradAscentTrainer", "GradDiffConfig",
    "GradDiffTrainer", "IdkDPOConfig", "IdkDPOTrainer", "NPOConfig", "NPOTrainer", "SatImpConfig", "SatImpTrainer",
    "SimNPOConfig", "SimNPOTrainer", "UNDIALConfig", "UNDIALTrainer", "UnlearnDPOConfig", "UnlearnDPOTrainer",
    "WGAConfig", "WGATrainer", "ceu_loss", "dpo_loss", "grad_ascent_loss", "grad_diff_loss", "npo_loss",
    "satimp_loss", "simnpo_loss", "undial_loss", "wga_loss",
]
