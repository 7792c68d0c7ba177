"""MASC (Margin Self-Correction): ``config.py`` (:class:`MASCConfig`), ``loss.py`` (restricted margin, hinges,
violation rates, Hoeffding bound) and ``trainer.py`` (:class:`MASCTrainer` and its margin stopping rule). The
trainer registers the method here."""

from ...registry import register_class as _register_class
from .config import MASCConfig
from .trainer import MarginStoppingCallback, MASCTrainer

_register_class(MASCTrainer, artifact_kind="unlearned_model", trainer=True)

__all__ = ["MASCConfig", "MASCTrainer", "MarginStoppingCallback"]
