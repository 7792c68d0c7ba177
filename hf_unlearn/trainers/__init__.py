"""TRL trainer subclasses for unlearning: the shared base, the baselines, and the seed methods."""
# ruff: noqa: F401, I001  (a plain list of re-exports; method modules append their own import lines below)

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
from .atwu_config import ATWUConfig
from .atwu_trainer import ATWUTrainer
from .token_scorer import ATWUTokenScorer
from .masc_config import MASCConfig
from .masc_trainer import MASCTrainer, MarginStoppingCallback
