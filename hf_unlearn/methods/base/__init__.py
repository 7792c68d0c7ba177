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

from .config import FORGET_LOSSES, RETAIN_LOSSES, BaseUnlearningConfig, UnlearningConfig
from .losses import LossDenominators, ScoredBatch, answer_mask, kl_retain_loss, nll_loss, sequence_log_probs
from .pairing import (
    MODEL_COLUMNS,
    RETAIN_PREFIX,
    PairedCollator,
    PairedForgetRetainDataset,
    PairingEpochCallback,
    to_trl_format,
)
from .guards import (
    NonFiniteLossError,
    NonFiniteWeightsError,
    RetainDivergenceGuard,
    TrainingDivergedError,
    fraction_of_vanishing_updates,
    non_finite_parameters,
)
from .checkpoints import (
    FINGERPRINT_NAME,
    RUN_ENTRIES,
    TRAINER_STATE_NAME,
    ResumeMismatchError,
    fingerprint_differences,
    stage_checkpoint,
)
from .trainer import UnlearningTrainer

__all__ = [
    "FINGERPRINT_NAME", "FORGET_LOSSES", "MODEL_COLUMNS", "RETAIN_LOSSES", "RETAIN_PREFIX", "RUN_ENTRIES",
    "TRAINER_STATE_NAME", "BaseUnlearningConfig", "LossDenominators", "NonFiniteLossError", "NonFiniteWeightsError",
    "PairedCollator", "PairedForgetRetainDataset", "PairingEpochCallback", "ResumeMismatchError",
    "RetainDivergenceGuard", "ScoredBatch", "TrainingDivergedError", "UnlearningConfig", "UnlearningTrainer",
    "answer_mask", "fingerprint_differences", "fraction_of_vanishing_updates", "kl_retain_loss", "nll_loss",
    "non_finite_parameters", "sequence_log_probs", "stage_checkpoint", "to_trl_format",
]
