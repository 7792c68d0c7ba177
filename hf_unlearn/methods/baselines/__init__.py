"""The baselines GradAscent, GradDiff, NPO and SimNPO: ``config.py`` (their config presets), ``loss.py`` (their
objectives as pure functions) and ``trainer.py`` (thin presets of the shared trainer that train
:func:`~hf_unlearn.methods.baselines.loss.baseline_loss`). Each trainer registers its method here."""
# ruff: noqa: F401, I001  (a plain list of re-exports)

from ...registry import register_class as _register_class
from .config import GradAscentConfig, GradDiffConfig, NPOConfig, SimNPOConfig
from .loss import baseline_loss, grad_ascent_loss, grad_diff_loss, npo_loss, simnpo_loss
from .trainer import GradAscentTrainer, GradDiffTrainer, NPOTrainer, SimNPOTrainer, baseline_objective

for _trainer in (GradAscentTrainer, GradDiffTrainer, NPOTrainer, SimNPOTrainer):
    _register_class(_trainer, artifact_kind="unlearned_model", trainer=True)
del _trainer

__all__ = [
    "GradAscentConfig", "GradAscentTrainer", "GradDiffConfig", "GradDiffTrainer", "NPOConfig", "NPOTrainer",
    "SimNPOConfig", "SimNPOTrainer", "baseline_loss", "baseline_objective", "grad_ascent_loss", "grad_diff_loss",
    "npo_loss", "simnpo_loss",
]
