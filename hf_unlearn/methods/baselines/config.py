"""Configs of the baseline trainers. GradAscent, GradDiff, NPO and SimNPO are presets of
:class:`~hf_unlearn.methods.base.UnlearningConfig`; WGA, SatImp, CE-U, UNDIAL, DPO and IdkDPO have configs of their
own on :class:`ForgetRetainConfig`, with the defaults of open-unlearning's trainer configs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..base.config import FORGET_LOSSES, RETAIN_LOSSES, BaseUnlearningConfig, UnlearningConfig


@dataclass
class GradAscentConfig(UnlearningConfig):
    r"""[`UnlearningConfig`] preset of [`GradAscentTrainer`]: `retain_loss` defaults to `"none"`."""

    retain_loss: str = field(
        default="none",
        metadata={"help": "Retain term: 'none' (pure gradient ascent), 'nll' or 'kl'.", "choices": list(RETAIN_LOSSES)},
    )


@dataclass
class GradDiffConfig(UnlearningConfig):
    r"""[`UnlearningConfig`] preset of [`GradDiffTrainer`], its defaults unchanged."""


@dataclass
class NPOConfig(UnlearningConfig):
    r"""[`UnlearningConfig`] preset of [`NPOTrainer`]: `forget_loss` defaults to `"npo"`."""

    forget_loss: str = field(
        default="npo", metadata={"help": "Forget term: 'grad_ascent', 'npo' or 'simnpo'.", "choices": list(FORGET_LOSSES)}
    )


@dataclass
class SimNPOConfig(UnlearningConfig):
    r"""[`UnlearningConfig`] preset of [`SimNPOTrainer`], open-unlearning's TOFU setting: `forget_loss="simnpo"`,
    `beta=4.5`, `forget_weight=0.125`."""

    forget_loss: str = field(
        default="simnpo",
        metadata={"help": "Forget term: 'grad_ascent', 'npo' or 'simnpo'.", "choices": list(FORGET_LOSSES)},
    )
    beta: float = field(default=4.5, metadata={"help": "Inverse temperature of SimNPO (> 0)."})
    forget_weight: float = field(default=0.125, metadata={"help": "Weight of the forget term (> 0)."})


@dataclass
class ForgetRetainConfig(BaseUnlearningConfig):
    r"""The objective `forget_weight * forget_term + retain_weight * retain_term` of the token-level and preference
    baselines (WGA, SatImp, CE-U, UNDIAL, DPO, IdkDPO), whose configs subclass it.

    Parameters:
        forget_weight (`float`, *optional*, defaults to `1.0`):
            Weight of the forget term, `>= 0` (open-unlearning's `gamma`).
        retain_weight (`float`, *optional*, defaults to `1.0`):
            Weight of the retain term, `>= 0` (open-unlearning's `alpha`); `0` trains without a retain set.
        retain_loss (`str`, *optional*, defaults to `"nll"`):
            Retain term: `"none"`, `"nll"` (retain answers' NLL) or `"kl"` (per-token `KL(pi_ref || pi_theta)`).
    """

    forget_weight: float = field(default=1.0, metadata={"help": "Weight of the forget term (>= 0)."})
    retain_weight: float = field(default=1.0, metadata={"help": "Weight of the retain term (>= 0; 0: no retain set)."})
    retain_loss: str = field(
        default="nll",
        metadata={"help": "Retain term: 'none', 'nll' or 'kl' (KL(pi_ref || pi_theta) per token).",
                  "choices": list(RETAIN_LOSSES)},
    )

    numeric_ranges = {"forget_weight": ">= 0", "retain_weight": ">= 0"}


@dataclass
class WGAConfig(ForgetRetainConfig):
    r"""Configuration of [`WGATrainer`] (Weighted Gradient Ascent), open-unlearning's `WGA.yaml` defaults (5 epochs).

    Parameters:
        beta (`float`, *optional*, defaults to `1.0`):
            Exponent of the detached token probability that weights each forget token's ascent, `>= 0`.
    """

    num_train_epochs: float = field(default=5.0, metadata={"help": "Total number of training epochs to perform."})
    beta: float = field(default=1.0, metadata={"help": "WGA: exponent of the detached token probability (>= 0)."})

    numeric_ranges = {"beta": ">= 0"}


@dataclass
class SatImpConfig(ForgetRetainConfig):
    r"""Configuration of [`SatImpTrainer`], with the authors' defaults (`retain_weight=0.1`, 5 epochs).

    Parameters:
        beta1 (`float`, defaults to `5.0`): Saturation exponent on the detached token probability `p`, `>= 0`.
        beta2 (`float`, defaults to `1.0`): Importance exponent on `1 - p`, `>= 0`.
    """

    num_train_epochs: float = field(default=5.0, metadata={"help": "Total number of training epochs to perform."})
    retain_weight: float = field(default=0.1, metadata={"help": "Weight of the retain term (>= 0; 0: no retain set)."})
    beta1: float = field(default=5.0, metadata={"help": "SatImp: saturation exponent on the token probability p (>= 0)."})
    beta2: float = field(default=1.0, metadata={"help": "SatImp: importance exponent on 1 - p (>= 0)."})

    numeric_ranges = {"beta1": ">= 0", "beta2": ">= 0"}


@dataclass
class CEUConfig(ForgetRetainConfig):
    r"""Configuration of [`CEUTrainer`] (Cross-Entropy Unlearning), open-unlearning's `CEU.yaml` defaults: the forget
    term only (`retain_weight=0`).

    Parameters:
        skip_first_answer_tokens (`int`, *optional*, defaults to `1`):
            Leading answer tokens of each forget answer left out of the loss, `>= 0`.
    """

    retain_weight: float = field(default=0.0, metadata={"help": "Weight of the retain term (>= 0; 0: no retain set)."})
    skip_first_answer_tokens: int = field(
        default=1, metadata={"help": "CE-U: leading answer tokens of each forget answer left out of the loss (>= 0)."})

    def __post_init__(self):
        value = self.skip_first_answer_tokens
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"`skip_first_answer_tokens` must be an integer >= 0, got {value!r}.")
        super().__post_init__()


@dataclass
class UNDIALConfig(ForgetRetainConfig):
    r"""Configuration of [`UNDIALTrainer`] (self-distillation with adjusted logits), open-unlearning's `UNDIAL.yaml`
    defaults: the forget term only, learning rate `1e-4`.

    Parameters:
        beta (`float`, *optional*, defaults to `10.0`):
            How far the true token's logit is lowered in the frozen model's distribution, `> 0`.
    """

    learning_rate: float = field(default=1e-4, metadata={"help": "The initial learning rate for AdamW."})
    retain_weight: float = field(default=0.0, metadata={"help": "Weight of the retain term (>= 0; 0: no retain set)."})
    beta: float = field(default=10.0, metadata={"help": "UNDIAL: how far the true token's logit is lowered (> 0)."})

    numeric_ranges = {"beta": "> 0"}


@dataclass
class PreferenceConfig(ForgetRetainConfig):
    r"""The DPO objective's fields, shared by [`UnlearnDPOConfig`] and [`IdkDPOConfig`] (open-unlearning's defaults).

    Parameters:
        beta (`float`, defaults to `0.1`): Inverse temperature of DPO, `> 0`.
    """

    beta: float = field(default=0.1, metadata={"help": "DPO inverse temperature (> 0)."})

    numeric_ranges = {"beta": "> 0"}


@dataclass
class UnlearnDPOConfig(PreferenceConfig):
    r"""Configuration of [`UnlearnDPOTrainer`]: DPO preferring a given alternate answer of each forget row.

    Parameters:
        alternate_column (`str`, *optional*, defaults to `"alternate_answer"`):
            Column of the forget rows that holds the preferred answer: a string, or a list of strings of which one
            is drawn per row with `seed`. A forget set without it is refused before any work.
    """

    alternate_column: str = field(
        default="alternate_answer",
        metadata={"help": "Column of the forget rows with the preferred answer (a string or a list of strings)."},
    )

    def __post_init__(self):
        if not isinstance(self.alternate_column, str) or not self.alternate_column.strip():
            raise ValueError(f"`alternate_column` must name a column, got {self.alternate_column!r}.")
        super().__post_init__()


@dataclass
class IdkDPOConfig(PreferenceConfig):
    r"""Configuration of [`IdkDPOTrainer`]: DPO preferring an "I don't know" answer over each forget answer.

    Parameters:
        idk_answers_file (`str` or `None`, *optional*, defaults to `None`):
            Text file of refusal answers, one per line; `None`: the list shipped with the package. Each forget
            row gets one, drawn with `seed`.
    """

    idk_answers_file: str | None = field(
        default=None,
        metadata={"help": "Refusal answers, one per line (default: the list shipped with hf_unlearn)."},
    )
