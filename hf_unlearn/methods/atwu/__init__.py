"""ATWU (Alternating Token-Weighted Unlearning): ``config.py`` (:class:`ATWUConfig`), ``loss.py`` (SATGA+,
token-weighted NPO/SimNPO, budget and entropy terms), ``trainer.py`` (:class:`ATWUTrainer`) and ``weighter.py``
(the learned :class:`ATWUTokenWeighter`)."""

from ...registry import register_method
from .config import ATWUConfig
from .trainer import ATWUTrainer
from .weighter import ATWUTokenWeighter

register_method("atwu", config_cls=ATWUConfig, trainer_cls=ATWUTrainer)

__all__ = ["ATWUConfig", "ATWUTokenWeighter", "ATWUTrainer"]
