"""RMU (Representation Misdirection for Unlearning): ``config.py`` (:class:`RMUConfig`), ``loss.py`` (the control
vector, the masked hidden-state MSE, :func:`~hf_unlearn.methods.rmu.loss.rmu_loss`) and ``trainer.py``
(:class:`RMUTrainer`)."""

from ...registry import register_method
from .config import RMUConfig
from .trainer import RMUTrainer

register_method("rmu", config_cls=RMUConfig, trainer_cls=RMUTrainer)

__all__ = ["RMUConfig", "RMUTrainer"]
