"""PDU (Primal-Dual Unlearning): ``config.py`` (:class:`PDUConfig`), ``loss.py`` (the logit-margin flattening
forget loss, the Lagrangian, the dual update) and ``trainer.py`` (:class:`PDUTrainer` and the dual variable's
:class:`DualVariableCallback`)."""

from ...registry import register_method
from .config import PDUConfig
from .trainer import DualVariableCallback, PDUTrainer

register_method("pdu", config_cls=PDUConfig, trainer_cls=PDUTrainer)

__all__ = ["DualVariableCallback", "PDUConfig", "PDUTrainer"]
