"""RMU (Representation Misdirection for Unlearning)."""

from ...registry import register_method
from .config import RMUConfig
from .trainer import RMUTrainer

register_method("rmu", config_cls=RMUConfig, trainer_cls=RMUTrainer)

__all__ = ["RMUConfig", "RMUTrainer"]
