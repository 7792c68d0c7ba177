"""The base every gradient unlearning method shares: :class:`UnlearningTrainer` (a TRL ``SFTTrainer``), its
configs, and the pure pieces beside it."""
# ruff: noqa: F401, I001  (a plain list of re-exports)

from .config import BaseUnlearningConfig, UnlearningConfig
from .losses import kl_retain_loss, nll_loss, sequence_log_probs
from .guards import NonFiniteLossError, NonFiniteWeightsError, TrainingDivergedError
from .checkpoints import ResumeMismatchError
from .trainer import UnlearningTrainer

__all__ = [
    "BaseUnlearningConfig", "NonFiniteLossError", "NonFiniteWeightsError", "ResumeMismatchError",
    "TrainingDivergedError", "UnlearningConfig", "UnlearningTrainer", "kl_retain_loss", "nll_loss",
    "sequence_log_probs",
]
