"""MASC (Margin Self-Correction): ``config.py`` (:class:`MASCConfig`), ``loss.py`` (restricted margin, hinges,
violation rates, Hoeffding bound), ``trainer.py`` (:class:`MASCTrainer` and its probes) and ``stopping.py``
(:class:`MarginStoppingCallback`, the margin stopping rule). The trainer registers the method here, with its own
stop as its strength selection."""

from ...registry import register_class as _register_class
from .config import MASCConfig
from .stopping import MarginStoppingCallback
from .trainer import MASCTrainer

_register_class(MASCTrainer, artifact_kind="unlearned_model", trainer=True, selection="own_stop")

__all__ = ["MASCConfig", "MASCTrainer", "MarginStoppingCallback"]
