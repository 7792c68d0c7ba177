"""Configuration of the ATWU (Alternating Token-Weighted Unlearning) trainer."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..unlearning_config import UnlearningConfig

ATWU_FORGET_LOSSES = ("satga", "npo", "simnpo")
# `beta` of the (weighted) NPO / SimNPO forget losses when the config leaves it at None
ATWU_DEFAULT_BETA = {"npo": 0.1, "simnpo": 4.5}


@dataclass
class ATWUConfig(UnlearningConfig):
    r"""
    Configuration class for the [`ATWUTrainer`].

    ATWU learns, while it unlearns, which forget answer tokens carry the information to remove. A linear scorer
    `g_t = sigmoid(<w, h_t> + b)` on the model's detached last-layer hidden states weights each forget token, and
    two updates alternate:

    - *model step* (every optimizer step): `gamma * L_forget(theta; sg(g)) + alpha * retain`, the forget loss
      weighted by the (detached) scores;
    - *scorer step* (every `scorer_every` model steps, model frozen, own Adam optimizer with `scorer_lr`):
      `L_forget(g; sg(theta)) + entropy_weight * H(g) + budget_weight * (mean_t STE(1[g_t > 0.5]) - budget)^2
      + scorer_l2 * ||w||^2`.

    Tokens that the model can forget without fighting the retain objective (forget-specific ones) end up with high
    scores; tokens shared with the retain data (structure, common words) with low ones.

    Parameters:
        > Parameters that control the forget loss

        forget_loss (`str`, *optional*, defaults to `"satga"`):
            `"satga"`: SATGA+, saturated gradient ascent with the score in the saturation exponent
            ([`~hf_unlearn.losses.satga_plus_loss`]); `"npo"`: token-weighted NPO against the frozen initial model
            ([`~hf_unlearn.losses.weighted_npo_loss`], uses `beta`, default `0.1`); `"simnpo"`: token-weighted
            SimNPO ([`~hf_unlearn.losses.weighted_simnpo_loss`], uses `beta`, default `4.5`, and `delta`).
        saturation_beta (`float`, *optional*, defaults to `0.2`):
            SATGA+ saturation strength `beta > 0`: a selected token (`g = 1`) is weighted `sg(p_t)^beta`.
        saturation_c (`float`, *optional*, defaults to `20.0`):
            SATGA+ score contrast `c >= 0`: the saturation exponent is `beta * (1 + c * (1 - g_t))`, so a rejected
            token (`g = 0`) saturates with exponent `beta * (1 + c)`; `0` ignores the scores.

        > Parameters that control the scorer

        budget (`float`, *optional*, defaults to `0.2`):
            Target fraction of forget answer tokens selected (`g_t > 0.5`), in `(0, 1)`. A fresh scorer starts with
            every score equal to `budget` (`b = log(budget / (1 - budget))`, `w = 0`).
        budget_weight (`float`, *optional*, defaults to `50.0`):
            Weight of the budget penalty `(mean_t STE(1[g_t > 0.5]) - budget)^2` in the scorer step.
        entropy_weight (`float`, *optional*, defaults to `0.01`):
            Weight of the mean binary entropy of the scores (pushes them to 0 or 1) in the scorer step.
        scorer_l2 (`float`, *optional*, defaults to `0.0`):
            Weight of `||w||^2` in the scorer step.
        scorer_lr (`float`, *optional*, defaults to `1e-2`):
            Learning rate of the scorer's Adam optimizer.
        scorer_every (`int`, *optional*, defaults to `1`):
            One scorer step every `scorer_every` model (optimizer) steps, `>= 1`; it runs just before that model
            step, on its first micro-batch.

    > [!NOTE]
    > `gamma` (forget weight) and `alpha` (retain weight) default to `1.0`; `beta` is used only by the NPO and
    > SimNPO forget losses. Everything else is as in [`UnlearningConfig`] (`learning_rate` `1e-5`, 10 epochs).
    """

    forget_loss: str = field(
        default="satga",
        metadata={"help": "Forget loss: 'satga' (SATGA+), 'npo' or 'simnpo' (token-weighted).", "choices": list(ATWU_FORGET_LOSSES)},
    )
    saturation_beta: float = field(default=0.2, metadata={"help": "SATGA+ saturation strength beta (> 0)."})
    saturation_c: float = field(default=20.0, metadata={"help": "SATGA+ score contrast c (>= 0)."})
    budget: float = field(default=0.2, metadata={"help": "Target fraction of selected forget tokens, in (0, 1)."})
    budget_weight: float = field(default=50.0, metadata={"help": "Weight of the token budget penalty."})
    entropy_weight: float = field(default=0.01, metadata={"help": "Weight of the score entropy regulariser."})
    scorer_l2: float = field(default=0.0, metadata={"help": "Weight of the L2 penalty on the scorer's w."})
    scorer_lr: float = field(default=1e-2, metadata={"help": "Learning rate of the scorer's Adam optimizer."})
    scorer_every: int = field(default=1, metadata={"help": "One scorer step every this many model steps (>= 1)."})

    def __post_init__(self) -> None:
        if self.forget_loss not in ATWU_FORGET_LOSSES:
            raise ValueError(f"forget_loss must be one of {list(ATWU_FORGET_LOSSES)}, got {self.forget_loss!r}.")
        if not 0.0 < self.budget < 1.0:
            raise ValueError(f"budget must lie in (0, 1) (a fraction of forget tokens), got {self.budget}.")
        if isinstance(self.scorer_every, bool) or int(self.scorer_every) != self.scorer_every or self.scorer_every < 1:
            raise ValueError(f"scorer_every must be an integer >= 1, got {self.scorer_every}.")
        self.scorer_every = int(self.scorer_every)
        if not self.scorer_lr > 0:
            raise ValueError(f"scorer_lr must be > 0, got {self.scorer_lr}.")
        for name in ("budget_weight", "entropy_weight", "scorer_l2", "saturation_c"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}.")
        if not self.saturation_beta > 0:
            raise ValueError(f"saturation_beta must be > 0, got {self.saturation_beta}.")
        if self.beta is None and self.forget_loss in ATWU_DEFAULT_BETA:
            self.beta = ATWU_DEFAULT_BETA[self.forget_loss]
        super().__post_init__()
