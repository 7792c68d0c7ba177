"""Configs of the baseline trainers. GradAscent, GradDiff, NPO and SimNPO are presets of
:class:`~hf_unlearn.methods.base.UnlearningConfig` (this is the one place where their defaults differ from it);
WGA, SatImp, CE-U, UNDIAL, DPO and IdkDPO have configs of their own on :class:`ForgetRetainConfig`, with the
defaults of open-unlearning's trainer configs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..base.config import FORGET_LOSSES, RETAIN_LOSSES, BaseUnlearningConfig, UnlearningConfig

__all__ = ["CEUConfig", "UnlearnDPOConfig", "ForgetRetainConfig", "GradAscentConfig", "GradDiffConfig", "IdkDPOConfig",
           "NPOConfig", "PreferenceConfig", "SatImpConfig", "SimNPOConfig", "UNDIALConfig", "WGAConfig"]


# ----- presets of the baseline trainers: the only place where their defaults differ ----------------------------


@dataclass
class GradAscentConfig(UnlearningConfig):
    r"""[`UnlearningConfig`] preset of [`GradAscentTrainer`]: `retain_loss` defaults to `"none"` (gradient ascent on
    the forget NLL alone); `forget_loss` is `"grad_ascent"`."""

    retain_loss: str = field(
        default="none",
        metadata={"help": "Retain term: 'none' (pure gradient ascent), 'nll' or 'kl'.", "choices": list(RETAIN_LOSSES)},
    )


@dataclass
class GradDiffConfig(UnlearningConfig):
    r"""[`UnlearningConfig`] preset of [`GradDiffTrainer`]: the defaults of [`UnlearningConfig`] unchanged
    (`forget_loss="grad_ascent"`, `retain_loss="nll"`, `forget_weight=retain_weight=1`)."""


@dataclass
class NPOConfig(UnlearningConfig):
    r"""[`UnlearningConfig`] preset of [`NPOTrainer`]: `forget_loss` defaults to `"npo"` (with `beta=0.1`,
    `forget_weight=retain_weight=1` and the retain NLL, as in [`UnlearningConfig`])."""

    forget_loss: str = field(
        default="npo", metadata={"help": "Forget term: 'grad_ascent', 'npo' or 'simnpo'.", "choices": list(FORGET_LOSSES)}
    )


@dataclass
class SimNPOConfig(UnlearningConfig):
    r"""[`UnlearningConfig`] preset of [`SimNPOTrainer`], open-unlearning's TOFU setting: `forget_loss` defaults to
    `"simnpo"`, `beta` to `4.5` and `forget_weight` to `0.125` (with `delta=0`, `retain_weight=1` and the retain
    NLL)."""

    forget_loss: str = field(
        default="simnpo",
        metadata={"help": "Forget term: 'grad_ascent', 'npo' or 'simnpo'.", "choices": list(FORGET_LOSSES)},
    )
    beta: float = field(default=4.5, metadata={"help": "Inverse temperature of SimNPO (> 0)."})
    forget_weight: float = field(default=0.125, metadata={"help": "Weight of the forget term (> 0)."})


# ----- the token-level and preference baselines: configs of their own (fields beside BaseUnlearningConfig's) -----


def _check_finite(config, *names: str, positive: bool = False) -> None:
    for name in names:
        value = getattr(config, name)
        ok = (0 < value < math.inf) if positive else (0 <= value < math.inf)
        if isinstance(value, bool) or not ok:
            raise ValueError(f"`{name}` must be a finite number {'>' if positive else '>='} 0, got {value!r}.")


@dataclass
class ForgetRetainConfig(BaseUnlearningConfig):
    r"""
    The objective `forget_weight * forget_term + retain_weight * retain_term` of the token-level and preference
    baselines (WGA, SatImp, CE-U, UNDIAL, DPO, IdkDPO): their configs subclass it and set its defaults. Everything in
    [`BaseUnlearningConfig`] applies.

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

    def __post_init__(self):
        if self.retain_loss not in RETAIN_LOSSES:
            raise ValueError(f"`retain_loss` must be one of {list(RETAIN_LOSSES)}, got {self.retain_loss!r}.")
        _check_finite(self, "forget_weight", "retain_weight")
        super().__post_init__()


@dataclass
class WGAConfig(ForgetRetainConfig):
    r"""
    Configuration of [`WGATrainer`] (Weighted Gradient Ascent), with open-unlearning's defaults
    (`configs/trainer/WGA.yaml`): `beta=1`, `forget_weight=retain_weight=1`, retain NLL, learning rate `1e-5`,
    5 epochs.

    Parameters:
        beta (`float`, *optional*, defaults to `1.0`):
            Exponent of the detached token probability that weights each forget token's ascent, `>= 0`.
    """

    num_train_epochs: float = field(default=5.0, metadata={"help": "Total number of training epochs to perform."})
    beta: float = field(default=1.0, metadata={"help": "WGA: exponent of the detached token probability (>= 0)."})

    def __post_init__(self):
        _check_finite(self, "beta")
        super().__post_init__()


@dataclass
class SatImpConfig(ForgetRetainConfig):
    r"""
    Configuration of [`SatImpTrainer`], with the authors' defaults: `beta1=5`, `beta2=1`, `forget_weight=1`,
    `retain_weight=0.1` (open-unlearning's `SatImp` class and its method README; its `configs/trainer/SatImp.yaml`
    swaps the two weights, `gamma=0.1`, `alpha=1`), retain NLL, learning rate `1e-5`, 5 epochs.

    Parameters:
        beta1 (`float`, *optional*, defaults to `5.0`):
            Saturation exponent on the detached token probability `p`, `>= 0`.
        beta2 (`float`, *optional*, defaults to `1.0`):
            Importance exponent on `1 - p`, `>= 0`.
    """

    num_train_epochs: float = field(default=5.0, metadata={"help": "Total number of training epochs to perform."})
    retain_weight: float = field(default=0.1, metadata={"help": "Weight of the retain term (>= 0; 0: no retain set)."})
    beta1: float = field(default=5.0, metadata={"help": "SatImp: saturation exponent on the token probability p (>= 0)."})
    beta2: float = field(default=1.0, metadata={"help": "SatImp: importance exponent on 1 - p (>= 0)."})

    def __post_init__(self):
        _check_finite(self, "beta1", "beta2")
        super().__post_init__()


@dataclass
class CEUConfig(ForgetRetainConfig):
    r"""
    Configuration of [`CEUTrainer`] (Cross-Entropy Unlearning), with open-unlearning's defaults
    (`configs/trainer/CEU.yaml`): the forget term only (`retain_weight=0`), the first answer token skipped,
    learning rate `1e-5`, 10 epochs. A retain term can be added with `retain_weight > 0`.

    Parameters:
        skip_first_answer_tokens (`int`, *optional*, defaults to `1`):
            Number of leading answer tokens of each forget answer left out of the loss, `>= 0`
            (open-unlearning's `ignore_first_n_answer_tokens`).
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
    r"""
    Configuration of [`UNDIALTrainer`] (self-distillation with adjusted logits), with open-unlearning's defaults
    (`configs/trainer/UNDIAL.yaml`): `beta=10`, the forget term only (`retain_weight=0`, as in the paper), learning
    rate `1e-4`, 10 epochs.

    Parameters:
        beta (`float`, *optional*, defaults to `10.0`):
            How far the true token's logit is lowered in the frozen model's distribution, `> 0`.
    """

    learning_rate: float = field(default=1e-4, metadata={"help": "The initial learning rate for AdamW."})
    retain_weight: float = field(default=0.0, metadata={"help": "Weight of the retain term (>= 0; 0: no retain set)."})
    beta: float = field(default=10.0, metadata={"help": "UNDIAL: how far the true token's logit is lowered (> 0)."})

    def __post_init__(self):
        _check_finite(self, "beta", positive=True)
        super().__post_init__()


@dataclass
class PreferenceConfig(ForgetRetainConfig):
    r"""
    The DPO objective's fields, shared by [`UnlearnDPOConfig`] and [`IdkDPOConfig`], with open-unlearning's defaults
    (`configs/trainer/DPO.yaml`, `configs/experiment/unlearn/tofu/idk.yaml`): `beta=0.1`,
    `forget_weight=retain_weight=1`, retain NLL, learning rate `1e-5`, 10 epochs.

    Parameters:
        beta (`float`, *optional*, defaults to `0.1`):
            Inverse temperature of DPO, `> 0`.
    """

    beta: float = field(default=0.1, metadata={"help": "DPO inverse temperature (> 0)."})

    def __post_init__(self):
        _check_finite(self, "beta", positive=True)
        super().__post_init__()


@dataclass
class UnlearnDPOConfig(PreferenceConfig):
    r"""
    Configuration of [`UnlearnDPOTrainer`]: DPO with a given alternate answer of each forget row preferred over its
    answer. Defaults as [`PreferenceConfig`].

    Parameters:
        alternate_column (`str`, *optional*, defaults to `"alternate_answer"`):
            Column of the forget rows that holds the preferred answer: a string, or a list of strings of which one
            is drawn per row with `seed` (e.g. TOFU's `perturbed_answer`). A forget set without it is refused
            before any work.
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
    r"""
    Configuration of [`IdkDPOTrainer`]: DPO with an "I don't know" answer preferred over each forget answer.
    Defaults as [`PreferenceConfig`].

    Parameters:
        idk_answers_file (`str` or `None`, *optional*, defaults to `None`):
            Text file of refusal answers, one per line (blank lines ignored); `None`: the list shipped with the
            package (`hf_unlearn/data/idk_answers.txt`). Each forget row gets one, drawn with `seed`.
    """

    idk_answers_file: str | None = field(
        default=None,
        metadata={"help": "Refusal answers, one per line (default: the list shipped with hf_unlearn)."},
    )
