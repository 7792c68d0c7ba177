"""RMU (Representation Misdirection for Unlearning): ``config.py`` (:class:`RMUConfig`), ``loss.py`` (the control
vector, the masked hidden-state MSE, :func:`rmu_loss`) and ``trainer.py`` (:class:`RMUTrainer`). The trainer
registers the method here."""
# ruff: noqa: F401, I001  (a plain list of re-exports)

from ...registry import register_class as _register_class
from .config import RMUConfig
from .loss import activation_mse, rmu_control_vector, rmu_loss
from .trainer import CONTROL_VECTOR_NAME, RMUTrainer

_register_class(RMUTrainer, artifact_kind="unlearned_model", trainer=True)

__all__ = ["RMUConfig", "RMUTrainer", "activation_mse", "rmu_control_vector", "rmu_loss"]
