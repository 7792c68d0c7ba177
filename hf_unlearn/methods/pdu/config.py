"""Configuration of the PDU (Primal-Dual Unlearning) trainer."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..base.config import BaseUnlearningConfig

__all__ = ["PDU_RETAIN_LOSSES", "PDUConfig"]

PDU_RETAIN_LOSSES = ("nll", "kl")


@dataclass
class PDUConfig(BaseUnlearningConfig):
    r"""
    Configuration class for the [`PDUTrainer`].

    PDU unlearns under a constraint on the retain loss, `L_retain <= eps`, by primal-dual descent on the Lagrangian

    `loss = forget_weight * L_forget + w * (L_retain - eps)`,   `w <- max(0, w + dual_step_size * (L_retain - eps))`

    where `L_forget = mean_t (max_v z_t(v) - mean_v z_t(v))^2` over the forget answer tokens (the logits pushed
    towards uniform, [`~hf_unlearn.methods.pdu.loss.pdu_forget_loss`]) and `w`, the retain weight, is the dual
    variable: it grows while the retain loss exceeds `eps` and shrinks towards 0 while it is below. The defaults
    are open-unlearning's `configs/trainer/PDU.yaml`.

    Parameters:
        retain_loss_eps (`float`, *required*):
            The bound `eps` of the constraint `L_retain <= eps` (nats per token for the NLL). There is no default
            (open-unlearning's `retain_loss_eps: ???`): it depends on the model and the data, e.g. the retain NLL
            of the model before unlearning or a little above it. A config without it is refused.
        dual_step_size (`float`, *optional*, defaults to `1.0`):
            Step of the dual ascent on `w`, `>= 0` (`0` keeps `w = retain_weight` fixed).
        dual_warmup_epochs (`float`, *optional*, defaults to `5.0`):
            `w` stays at `retain_weight` for the steps of the first `dual_warmup_epochs` epochs, then moves after
            every optimizer step (open-unlearning's `PDU.yaml`: 5; its `PDU` class defaults to 0). A run shorter
            than the warm-up (`max_steps` below it) never moves `w`.
        retain_weight (`float`, *optional*, defaults to `1.0`):
            Starting value of the dual variable `w` (open-unlearning's `alpha`), `>= 0`.
        forget_weight (`float`, *optional*, defaults to `1.0`):
            Fixed weight of the forget term (open-unlearning's `gamma`), `>= 0`.
        retain_loss (`str`, *optional*, defaults to `"nll"`):
            The constrained retain loss: `"nll"` (the retain answers' NLL) or `"kl"` (per-token
            `KL(pi_ref || pi_theta)` against the frozen starting model), as open-unlearning's GradDiff retain term.

    > [!NOTE]
    > Everything else is as in [`BaseUnlearningConfig`] (`learning_rate` `1e-5`, 10 epochs).
    """

    retain_loss_eps: float | None = field(
        default=None,
        metadata={"help": "Required: the bound eps of the constraint L_retain <= eps (e.g. the retain NLL of the "
                          "model before unlearning, or a little above)."},
    )
    dual_step_size: float = field(default=1.0, metadata={"help": "Step of the dual ascent on the retain weight (>= 0)."})
    dual_warmup_epochs: float = field(
        default=5.0, metadata={"help": "Epochs before the retain weight (the dual variable) starts to move (>= 0)."}
    )
    retain_weight: float = field(
        default=1.0, metadata={"help": "Starting value of the dual variable, the retain weight (>= 0)."}
    )
    forget_weight: float = field(default=1.0, metadata={"help": "Fixed weight of the forget term (>= 0)."})
    retain_loss: str = field(
        default="nll",
        metadata={"help": "Constrained retain loss: 'nll' or 'kl' (KL(pi_ref || pi_theta) per token).",
                  "choices": list(PDU_RETAIN_LOSSES)},
    )

    def __post_init__(self):
        if self.retain_loss_eps is None:
            raise ValueError(
                "PDU needs `retain_loss_eps`, the bound eps of its constraint L_retain <= eps (there is no default: "
                "it depends on the model and data; e.g. the retain NLL of the model before unlearning, or a little "
                "above). Pass retain_loss_eps=... (--retain_loss_eps on the command line)."
            )
        if isinstance(self.retain_loss_eps, bool) or not math.isfinite(self.retain_loss_eps):
            raise ValueError(f"`retain_loss_eps` must be a finite number, got {self.retain_loss_eps!r}.")
        for name in ("dual_step_size", "dual_warmup_epochs", "retain_weight", "forget_weight"):
            if not 0 <= getattr(self, name) < math.inf:
                raise ValueError(f"`{name}` must be a finite number >= 0, got {getattr(self, name)}.")
        if self.retain_loss not in PDU_RETAIN_LOSSES:
            raise ValueError(f"`retain_loss` must be one of {list(PDU_RETAIN_LOSSES)}, got {self.retain_loss!r}.")
        super().__post_init__()
