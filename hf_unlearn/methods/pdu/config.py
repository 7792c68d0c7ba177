"""Configuration of the PDU (Primal-Dual Unlearning) trainer."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..base.config import BaseUnlearningConfig

PDU_RETAIN_LOSSES = ("nll", "kl")


@dataclass
class PDUConfig(BaseUnlearningConfig):
    r"""Configuration class for the [`PDUTrainer`].

    PDU unlearns under the constraint `L_retain <= eps` by primal-dual descent on the Lagrangian

    `loss = forget_weight * L_forget + w * (L_retain - eps)`,   `w <- max(0, w + dual_step_size * (L_retain - eps))`

    with `L_forget = mean_t (max_v z_t(v) - mean_v z_t(v))^2` over the forget answer tokens
    ([`~hf_unlearn.methods.pdu.loss.pdu_forget_loss`]). Defaults: open-unlearning's `PDU.yaml`.

    Parameters:
        retain_loss_eps (`float`, *required*):
            The bound `eps` (nats per token for the NLL), e.g. the retain NLL of the model before unlearning.
        dual_step_size (`float`, *optional*, defaults to `1.0`):
            Step of the dual ascent on `w`, `>= 0` (`0` keeps `w = retain_weight` fixed).
        dual_warmup_epochs (`float`, *optional*, defaults to `5.0`):
            `w` stays at `retain_weight` during the first `dual_warmup_epochs` epochs.
        retain_weight (`float`, defaults to `1.0`): Starting value of the dual variable `w`, `>= 0`.
        forget_weight (`float`, defaults to `1.0`): Fixed weight of the forget term, `>= 0`.
        retain_loss (`str`, *optional*, defaults to `"nll"`):
            The constrained retain loss: `"nll"` or `"kl"` (per-token `KL(pi_ref || pi_theta)`).
    """

    retain_loss_eps: float | None = field(
        default=None, metadata={"help": "Required: the bound eps of the constraint L_retain <= eps."}
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

    numeric_ranges = {"retain_loss_eps": "(-inf, inf)", "dual_step_size": ">= 0", "dual_warmup_epochs": ">= 0", "retain_weight": ">= 0",
                      "forget_weight": ">= 0"}

    def __post_init__(self):
        if self.retain_loss_eps is None:
            raise ValueError(
                "PDU needs `retain_loss_eps`, the bound eps of its constraint L_retain <= eps (there is no default: "
                "it depends on the model and data; e.g. the retain NLL of the model before unlearning, or a little "
                "above). Pass retain_loss_eps=... (--retain_loss_eps on the command line)."
            )
        super().__post_init__()
