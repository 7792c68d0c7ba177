"""PDU (Primal-Dual Unlearning)."""

from ...registry import register_method
from .config import PDUConfig
from .trainer import DualVariableCallback, PDUTrainer

register_method("pdu", config_cls=PDUConfig, trainer_cls=PDUTrainer)

__all__ = ["DualVariableCallback", "PDUConfig", "PDUTrainer"]
