"""MASC (Margin Self-Correction): ``config.py`` (:class:`MASCConfig`), ``loss.py`` (restricted margin, hinges,
violation rates, Hoeffding bound), ``trainer.py`` (:class:`MASCTrainer` and its probes) and ``stopping.py``
(:class:`MarginStoppingCallback`, the margin stopping rule, which is also its strength selection)."""

from ...registry import register_method
from .config import MASCConfig
from .stopping import MarginStoppingCallback
from .trainer import MASCTrainer

register_method("masc", config_cls=MASCConfig, trainer_cls=MASCTrainer)

__all__ = ["MASCConfig", "MASCTrainer", "MarginStoppingCallback"]
