"""MASC (Margin Self-Correction), with its margin stopping rule (its strength selection)."""

from ...registry import register_method
from .config import MASCConfig
from .stopping import MarginStoppingCallback
from .trainer import MASCTrainer

register_method("masc", config_cls=MASCConfig, trainer_cls=MASCTrainer)

__all__ = ["MASCConfig", "MASCTrainer", "MarginStoppingCallback"]
