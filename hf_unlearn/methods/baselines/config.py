"""Config presets of the baseline trainers (GradAscent, GradDiff, NPO, SimNPO): the one place where a baseline's
defaults differ from :class:`~hf_unlearn.methods.base.UnlearningConfig`'s. ``UnlearningConfig`` and
``BaseUnlearningConfig`` are re-exported here with them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..base.config import FORGET_LOSSES, RETAIN_LOSSES, BaseUnlearningConfig, UnlearningConfig

__all__ = ["BaseUnlearningConfig", "GradAscentConfig", "GradDiffConfig", "NPOConfig", "SimNPOConfig",
           "UnlearningConfig"]


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
    forget_weight: float = field(default=0.125, metadata={"help": "Weight of the forget term (>= 0)."})
