"""ATWU (Alternating Token-Weighted Unlearning): config, trainer and the learned token weighter. Loss formulas:
:mod:`hf_unlearn.losses.atwu`."""

from .config import ATWUConfig
from .trainer import ATWUTrainer
from .weighter import ATWUTokenWeighter

__all__ = ["ATWUConfig", "ATWUTokenWeighter", "ATWUTrainer"]
