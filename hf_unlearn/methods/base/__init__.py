"""The base every gradient unlearning method shares: :class:`UnlearningTrainer` (a TRL ``SFTTrainer``), its
configs, the forget/retain pairing, the guards, the checkpoint staging and the shared loss pieces.

``config.py`` (:class:`BaseUnlearningConfig`, :class:`UnlearningConfig`), ``trainer.py``
(:class:`UnlearningTrainer`: the loss hook, scoring, the retain term, training), built from the mixins of
``inputs.py`` (the checks before any work), ``reference.py`` (the frozen reference model), ``metrics.py``
(logged values), ``guards.py`` (:class:`RetainDivergenceGuard`, non-finite checks and their errors),
``checkpoints.py`` (:func:`stage_checkpoint`, run fingerprints) and ``saving.py`` (the final model, its card,
``push_to_hub``); ``pairing.py`` (:class:`PairedForgetRetainDataset`, :class:`PairedCollator`,
:func:`to_trl_format`), ``losses.py`` (sequence log-probabilities, NLL, KL retain term, :class:`ScoredBatch`,
:class:`LossDenominators`).
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
