"""PDU (Primal-Dual Unlearning): ``config.py`` (:class:`PDUConfig`), ``loss.py`` (the logit-margin flattening
forget loss, the Lagrangian, the dual update) and ``trainer.py`` (:class:`PDUTrainer` and the dual variable's
:class:`DualVariableCallback`). The trainer registers the method here."""
# ruff: noqa: F401, I001  (a plain list of re-exports)

from ...registry import register_class as _register_class
from .config import PDUConfig
from .loss import dual_update, pdu_forget_loss, pdu_loss
from .trainer import DualVariableCallback, PDUTrainer

_register_class(PDUTrainer, artifact_kind="unlearned_model", trainer=True)

__all__ = ["DualVariableCallback", "PDUConfig", "PDUTrainer", "dual_update", "pdu_forget_loss", "pdu_loss"]
