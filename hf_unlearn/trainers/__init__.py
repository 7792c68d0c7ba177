"""TRL trainer subclasses for unlearning: the shared base, the baselines, and the seed methods.

Layout: ``unlearning_config.py`` (``BaseUnlearningConfig`` shared by every method; ``UnlearningConfig`` with the
``forget_loss`` / ``retain_loss`` choices of the baselines, and its presets ``GradAscentConfig``, ``GradDiffConfig``,
``NPOConfig``, ``SimNPOConfig``), ``unlearning_trainer.py`` (the base trainer every method shares, with the safety
rails: output checks, atomic saves, finite-weight checks, divergence guard, exact resume), ``baselines.py``
(GradAscent, GradDiff, NPO, SimNPO as thin presets), and one folder per seed method (``masc/``, ``atwu/``) holding
its config and trainer. Each method's loss formulas live in :mod:`hf_unlearn.losses` (``losses/<family>.py``).
"""
# ruff: noqa: F401, I001  (a plain list of re-exports)

from .unlearning_config import (
    BaseUnlearningConfig,
    GradAscentConfig,
    GradDiffConfig,
    NPOConfig,
    SimNPOConfig,
    UnlearningConfig,
)
from .unlearning_trainer import (
    LossDenominators,
    NonFiniteLossError,
    NonFiniteWeightsError,
    PairedCollator,
    PairedForgetRetainDataset,
    RetainDivergenceGuard,
    ScoredBatch,
    TrainingDivergedError,
    UnlearningTrainer,
    to_trl_format,
)
from .baselines import GradAscentTrainer, GradDiffTrainer, NPOTrainer, SimNPOTrainer
from .atwu import ATWUConfig, ATWUTokenWeighter, ATWUTrainer
from .masc import MarginStoppingCallback, MASCConfig, MASCTrainer
from ..registry import register_class as _register_class

# Each trainer registers its method from its class attributes (_method, _title, _paper, _cli_help).
for _trainer in (MASCTrainer, ATWUTrainer, GradAscentTrainer, GradDiffTrainer, NPOTrainer, SimNPOTrainer):
    _register_class(_trainer, artifact_kind="unlearned_model", trainer=True)
del _trainer

__all__ = [
    "ATWUConfig", "ATWUTokenWeighter", "ATWUTrainer", "BaseUnlearningConfig", "GradAscentConfig", "GradAscentTrainer",
    "GradDiffConfig", "GradDiffTrainer", "LossDenominators", "MASCConfig", "MASCTrainer", "MarginStoppingCallback",
    "NPOConfig", "NPOTrainer", "NonFiniteLossError", "NonFiniteWeightsError", "PairedCollator",
    "PairedForgetRetainDataset", "RetainDivergenceGuard", "ScoredBatch", "SimNPOConfig", "SimNPOTrainer",
    "TrainingDivergedError", "UnlearningConfig", "UnlearningTrainer", "to_trl_format",
]
