"""TRL trainer subclasses for unlearning: the shared base, the baselines, and the seed methods.

Layout: ``unlearning_config.py`` / ``unlearning_trainer.py`` (the base every method shares), ``baselines.py``
(GradAscent, GradDiff, NPO, SimNPO), and one folder per seed method (``masc/``, ``atwu/``) holding its config
and trainer. Each method's loss formulas live in :mod:`hf_unlearn.losses` (``losses/<family>.py``).
"""
# ruff: noqa: F401, I001  (a plain list of re-exports)

from .unlearning_config import UnlearningConfig
from .unlearning_trainer import (
    LossDenominators,
    NonFiniteLossError,
    PairedCollator,
    PairedForgetRetainDataset,
    ScoredBatch,
    UnlearningTrainer,
    to_trl_format,
)
from .baselines import GradAscentTrainer, GradDiffTrainer, NPOTrainer, SimNPOTrainer
from .atwu import ATWUConfig, ATWUTokenWeighter, ATWUTrainer
from .masc import MarginStoppingCallback, MASCConfig, MASCTrainer
