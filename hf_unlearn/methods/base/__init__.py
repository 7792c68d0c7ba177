"""The base every gradient unlearning method shares: :class:`UnlearningTrainer` (a TRL ``SFTTrainer``, in
``trainer.py``), its configs (``config.py``), and pure pieces beside it: the forget/retain pairing (``pairing.py``),
the loss pieces (``losses.py``), the input checks (``inputs.py``), the reference model (``reference.py``), the
guards and their errors (``guards.py``), the checkpoint staging and run fingerprint (``checkpoints.py``) and the
logged values (``metrics.py``).
"""
# ruff: noqa: F401, I001  (a plain list of re-exports)

from .config import BaseUnlearningConfig, UnlearningConfig
from .losses import kl_retain_loss, nll_loss, sequence_log_probs
from .guards import NonFiniteLossError, NonFiniteWeightsError, TrainingDivergedError
from .checkpoints import ResumeMismatchError
from .trainer import UnlearningTrainer

# What a user imports to write a method on this base: the configs, the trainer, the shared loss pieces, and the
# errors a run raises.
__all__ = [
    "BaseUnlearningConfig", "NonFiniteLossError", "NonFiniteWeightsError", "ResumeMismatchError",
    "TrainingDivergedError", "UnlearningConfig", "UnlearningTrainer", "kl_retain_loss", "nll_loss",
    "sequence_log_probs",
]
