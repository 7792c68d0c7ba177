"""Configuration of the unlearning trainers: a `trl.SFTConfig` with the unlearning hyperparameters added."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from trl import SFTConfig

RETAIN_LOSSES = ("nll", "kl")


def _bf16_available() -> bool:
    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


@dataclass
class UnlearningConfig(SFTConfig):
    r"""
    Configuration class for [`UnlearningTrainer`] and its subclasses (GradAscent, GradDiff, NPO, SimNPO, ...).

    Everything in [`~trl.SFTConfig`] (and so [`~transformers.TrainingArguments`]) applies; the parameters below are
    the ones unlearning adds. The training set of the trainer is the *forget* set; the *retain* set is passed to the
    trainer as `retain_dataset` and each forget example is paired with one retain example per step.

    Parameters:
        > Parameters that control the objective

        beta (`float`, *optional*):
            Inverse temperature of NPO and SimNPO, must be `> 0`. When `None`, the trainer's own default is used:
            `0.1` for NPO (Zhang et al. 2024), `4.5` for SimNPO (open-unlearning's TOFU setting).
        delta (`float`, *optional*, defaults to `0.0`):
            SimNPO reward margin (the paper's `gamma`), outside `beta`:
            `-(2/beta) * logsigmoid(-beta * log p(y|x) / |y| - delta)`.
        gamma (`float`, *optional*):
            Weight of the forget term. When `None`, the trainer's default (`1.0`; `0.125` for SimNPO).
        alpha (`float`, *optional*):
            Weight of the retain term. When `None`, the trainer's default (`1.0`). With `alpha=0` the retain set is
            not needed (pure NPO / SimNPO).
        retain_loss (`str`, *optional*, defaults to `"nll"`):
            Retain term: `"nll"` (negative log-likelihood of the retain answers) or `"kl"` (per-token
            `KL(pi_ref || pi_theta)` on the retain answers, which needs the frozen reference model).

        > Parameters that control the data

        allow_overlap (`bool`, *optional*, defaults to `False`):
            Forget and retain sets sharing examples is an error by default; with `True` it is a warning with the
            number of shared examples.

    > [!NOTE]
    > These parameters have default values different from [`~trl.SFTConfig`]:
    > - `learning_rate`: Defaults to `1e-5` instead of `2e-5` (TOFU's unlearning rate).
    > - `num_train_epochs`: Defaults to `10` instead of `3` (TOFU's unlearning budget: fixed epochs, no early stop).
    > - `weight_decay`: Defaults to `0.01` instead of `0.0`.
    > - `bf16`: Defaults to `True` only when a bf16-capable GPU is present (instead of always), since CPU bf16
    >   autocast is slow and coarsens the log-likelihood differences the unlearning losses act on.
    """

    # Parameters whose default values are overridden from SFTConfig
    learning_rate: float = field(default=1e-5, metadata={"help": "The initial learning rate for AdamW."})
    num_train_epochs: float = field(default=10.0, metadata={"help": "Total number of training epochs to perform."})
    weight_decay: float = field(default=0.01, metadata={"help": "Weight decay for AdamW."})
    bf16: bool | None = field(
        default=None,
        metadata={"help": "Whether to use bf16 mixed precision. Defaults to True only on a bf16-capable GPU."},
    )

    # Parameters that control the objective
    beta: float | None = field(
        default=None,
        metadata={"help": "Inverse temperature of NPO/SimNPO (> 0). Default: the trainer's own (NPO 0.1, SimNPO 4.5)."},
    )
    delta: float = field(default=0.0, metadata={"help": "SimNPO reward margin (outside beta)."})
    gamma: float | None = field(
        default=None, metadata={"help": "Weight of the forget term. Default: the trainer's own (1.0; SimNPO 0.125)."}
    )
    alpha: float | None = field(
        default=None, metadata={"help": "Weight of the retain term. Default: the trainer's own (1.0)."}
    )
    retain_loss: str = field(
        default="nll",
        metadata={"help": "Retain term: 'nll' or 'kl' (KL(pi_ref || pi_theta) per token).", "choices": list(RETAIN_LOSSES)},
    )

    # Parameters that control the data
    allow_overlap: bool = field(
        default=False,
        metadata={"help": "Allow forget and retain sets to share examples (warn instead of raising)."},
    )

    def __post_init__(self):
        if self.bf16 is None:
            self.bf16 = (not self.fp16) and _bf16_available()
        if self.beta is not None and not self.beta > 0:
            raise ValueError(f"`beta` must be > 0, got {self.beta}.")
        for name in ("gamma", "alpha"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"`{name}` must be >= 0, got {value}.")
        if self.retain_loss not in RETAIN_LOSSES:
            raise ValueError(f"`retain_loss` must be one of {list(RETAIN_LOSSES)}, got {self.retain_loss!r}.")
        super().__post_init__()
