"""MASC (Margin Self-Correction): config, trainer and its margin stopping rule. Loss formulas:
:mod:`hf_unlearn.losses.masc`."""

from .config import MASCConfig
from .trainer import MarginStoppingCallback, MASCTrainer

__all__ = ["MASCConfig", "MASCTrainer", "MarginStoppingCallback"]
