"""ATWU (Alternating Token-Weighted Unlearning): ``config.py`` (:class:`ATWUConfig`), ``loss.py`` (SATGA+,
token-weighted NPO/SimNPO, budget and entropy terms), ``trainer.py`` (:class:`ATWUTrainer`) and ``weighter.py``
(the learned :class:`ATWUTokenWeighter`). The trainer registers the method here."""

from ...registry import register_class as _register_class
from .config import ATWUConfig
from .trainer import ATWUTrainer
from .weighter import ATWUTokenWeighter

_register_class(ATWUTrainer, artifact_kind="unlearned_model", trainer=True,
                metrics="hf_unlearn.methods.atwu.weighter:token_auroc_metrics")

__all__ = ["ATWUConfig", "ATWUTokenWeighter", "ATWUTrainer"]
