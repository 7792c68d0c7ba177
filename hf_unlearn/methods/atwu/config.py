"""Configuration of the ATWU (Alternating Token-Weighted Unlearning) trainer."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..base.config import RETAIN_LOSSES, BaseUnlearningConfig, refuse_no_forget_term
from .loss import SATGA_FORMS, SATGA_SELECTIONS
from .weighter import SCORER_POSITIONS

ATWU_FORGET_LOSSES = ("satga", "npo", "simnpo")


@dataclass
class ATWUConfig(BaseUnlearningConfig):
    r"""
    Configuration class for the [`ATWUTrainer`].

    A linear weighter `g_t = sigmoid(<w, (h_t - mu) / sigma> + b)` on the detached last-layer hidden state of each
    forget answer token (`scorer_position`, standardised by running statistics) weights each forget token; two
    updates alternate:

    - *model step* (every optimizer step): `forget_weight * L_forget(theta; sg(g)) + retain_weight * retain`;
    - *weighter step* (every `scorer_every` model steps, model frozen, own Adam with `scorer_lr`):
      `scorer_forget_weight * L_forget(g; sg(theta)) + retain_conflict_weight * mean_t g_t c_t
      + entropy_weight * H(g) + budget_weight * (mean_t STE(1[g_b,t > 0.5]) - budget)^2 + scorer_l2 * ||w||^2`,
      `c_t` the retain conflict of token `t` ([`~hf_unlearn.methods.atwu.loss.retain_conflict`], normalised to a
      mean magnitude of 1), `g_b = sigmoid(sg(<w, h>) + b)` (the budget moves only the bias).

    `scorer_warmup_steps` weighter steps run before the first model step. Deviations from the paper and where the
    defaults come from: docs/methods/atwu.md.

    Parameters:
        forget_loss (`str`, *optional*, defaults to `"satga"`):
            `"satga"`: SATGA+ ([`~hf_unlearn.methods.atwu.loss.satga_plus_loss`]); `"npo"`: token-weighted NPO
            against the frozen initial model (`npo_beta`); `"simnpo"`: token-weighted SimNPO (`simnpo_beta`,
            `simnpo_delta`).
        satga_form (`str`, *optional*, defaults to `"gated"`):
            `"gated"`: `-sum g_t sg(p_t)^(beta (1 + c (1 - g_t))) l_t / sum g_t`; `"exponent_only"`:
            `-mean_t sg(p_t)^(beta (1 + c (1 - g_t))) l_t`.
        saturation_beta (`float`, defaults to `0.2`): SATGA+ saturation strength `beta > 0`.
        saturation_c (`float`, defaults to `5.0`): SATGA+ score contrast `c >= 0`.
        saturation_c_warmup_steps (`int`, *optional*, defaults to `0`):
            `W`: `c_s = saturation_c * min(1, (s + 1) / W)` at model step `s`; `0` keeps `c` constant.
        satga_selection (`str`, *optional*, defaults to `"soft"`):
            Score in the SATGA+ exponent: `"soft"`, `g_t`; `"hard"`, `STE(1[g_t > 0.5])`.
        npo_beta (`float`, defaults to `0.1`): Inverse temperature of the weighted NPO loss, `> 0`.
        simnpo_beta (`float`, defaults to `4.5`): Inverse temperature of the weighted SimNPO loss, `> 0`.
        simnpo_delta (`float`, defaults to `0.0`): Reward margin of the weighted SimNPO loss.
        forget_weight (`float`, defaults to `1.0`): Weight of the forget term in the model step, `> 0`.
        retain_loss (`str`, *optional*, defaults to `"nll"`):
            `"nll"`, `"kl"` (`KL(pi_ref || pi_theta)` per token) or `"none"`.
        retain_weight (`float`, *optional*, defaults to `1.0`):
            Weight of the retain term, `>= 0` (`0` or `retain_loss="none"`: no retain set needed).
        budget (`float`, *optional*, defaults to `0.2`):
            Target fraction of forget answer tokens selected (`g_t > 0.5`), in `(0, 1)`; a fresh weighter scores
            every token `budget`.
        budget_weight (`float`, defaults to `50.0`): Weight of the budget penalty in the weighter step.
        entropy_weight (`float`, *optional*, defaults to `0.01`):
            Weight of the mean binary entropy of the scores in the weighter step.
        scorer_l2 (`float`, defaults to `0.0`): Weight of `||w||^2` in the weighter step.
        scorer_lr (`float`, defaults to `1e-2`): Learning rate of the weighter's Adam optimizer.
        scorer_every (`int`, *optional*, defaults to `1`):
            One weighter step every `scorer_every` model steps, `>= 1`, on that step's first micro-batch.
        scorer_standardize (`bool`, *optional*, defaults to `True`):
            Standardise the weighter's inputs by running mean and variance; `False` only centres them.
        scorer_warmup_steps (`int`, *optional*, defaults to `0`):
            Weighter-only steps before the first model step, on the first forget batches (no retain conflict).
        scorer_position (`str`, *optional*, defaults to `"token"`):
            `"token"`: token `t` scored on its own state `h_t` (the paper's); `"predicting"`: on `h_{t-1}`.
        scorer_forget_weight (`float`, *optional*, defaults to `0.0`):
            Weight of `L_forget(g)` in the weighter step, `>= 0`. At 0 the retain conflict alone orders the tokens
            (the forget loss favours the tokens with the highest loss, not the forget-specific ones); without a
            retain set, set it above 0 or the weighter learns only its threshold.
        retain_conflict_weight (`float`, *optional*, defaults to `1.0`):
            Weight of `mean_t g_t c_t` in the weighter step, `>= 0`; `0` skips the retain forward it needs.
    """

    forget_loss: str = field(
        default="satga",
        metadata={"help": "Forget loss: 'satga' (SATGA+), 'npo' or 'simnpo' (token-weighted).",
                  "choices": list(ATWU_FORGET_LOSSES)},
    )
    satga_form: str = field(
        default="gated",
        metadata={"help": "SATGA+ form: 'gated' (score weights the token and its saturation) or 'exponent_only'.",
                  "choices": list(SATGA_FORMS)},
    )
    saturation_beta: float = field(default=0.2, metadata={"help": "SATGA+ saturation strength beta (> 0)."})
    saturation_c: float = field(default=5.0, metadata={"help": "SATGA+ score contrast c (>= 0)."})
    npo_beta: float = field(default=0.1, metadata={"help": "Inverse temperature of the weighted NPO loss (> 0)."})
    simnpo_beta: float = field(default=4.5, metadata={"help": "Inverse temperature of the weighted SimNPO loss (> 0)."})
    simnpo_delta: float = field(default=0.0, metadata={"help": "Reward margin of the weighted SimNPO loss."})
    forget_weight: float = field(default=1.0, metadata={"help": "Weight of the forget term (> 0)."})
    retain_loss: str = field(
        default="nll",
        metadata={"help": "Retain term: 'nll', 'kl' (KL(pi_ref || pi_theta)) or 'none'.", "choices": list(RETAIN_LOSSES)},
    )
    retain_weight: float = field(default=1.0, metadata={"help": "Weight of the retain term (>= 0)."})
    budget: float = field(default=0.2, metadata={"help": "Target fraction of selected forget tokens, in (0, 1)."})
    budget_weight: float = field(default=50.0, metadata={"help": "Weight of the token budget penalty."})
    entropy_weight: float = field(default=0.01, metadata={"help": "Weight of the score entropy regulariser."})
    scorer_l2: float = field(default=0.0, metadata={"help": "Weight of the L2 penalty on the weighter's w."})
    scorer_lr: float = field(default=1e-2, metadata={"help": "Learning rate of the weighter's Adam optimizer."})
    scorer_every: int = field(default=1, metadata={"help": "One weighter step every this many model steps (>= 1)."})
    scorer_standardize: bool = field(
        default=True, metadata={"help": "Standardise the weighter's inputs by running mean and variance (else centre)."}
    )
    scorer_warmup_steps: int = field(
        default=0, metadata={"help": "Weighter-only steps before the first model step (>= 0)."}
    )
    scorer_position: str = field(
        default="token",
        metadata={"help": "Hidden state that scores a token: 'token' (its own, the paper's) or 'predicting' (the one "
                          "that predicts it).", "choices": list(SCORER_POSITIONS)},
    )
    scorer_forget_weight: float = field(
        default=0.0, metadata={"help": "Weight of the forget loss L_forget(g) in the weighter step (>= 0)."}
    )
    retain_conflict_weight: float = field(
        default=1.0,
        metadata={"help": "Weight of the retain-conflict term in the weighter step (>= 0; 0: no retain forward)."},
    )
    saturation_c_warmup_steps: int = field(
        default=0, metadata={"help": "Ramp c linearly up to saturation_c over this many model steps (0: constant)."}
    )
    satga_selection: str = field(
        default="soft",
        metadata={"help": "Score in the SATGA+ exponent: 'soft' (g) or 'hard' (STE(1[g > 0.5])).",
                  "choices": list(SATGA_SELECTIONS)},
    )

    numeric_ranges = {
        **dict.fromkeys(("scorer_lr", "saturation_beta", "npo_beta", "simnpo_beta"), "> 0"),
        **dict.fromkeys(("budget_weight", "entropy_weight", "scorer_l2", "saturation_c", "forget_weight",
                         "retain_weight", "retain_conflict_weight", "scorer_forget_weight"), ">= 0"),
    }

    def __post_init__(self) -> None:
        if not 0.0 < self.budget < 1.0:
            raise ValueError(f"budget must lie in (0, 1) (a fraction of forget tokens), got {self.budget}.")
        if isinstance(self.scorer_every, bool) or int(self.scorer_every) != self.scorer_every or self.scorer_every < 1:
            raise ValueError(f"scorer_every must be an integer >= 1, got {self.scorer_every}.")
        self.scorer_every = int(self.scorer_every)
        for name in ("scorer_warmup_steps", "saturation_c_warmup_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) != value or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value}.")
            setattr(self, name, int(value))
        refuse_no_forget_term(self.forget_weight, self.retain_weight)
        super().__post_init__()  # also every float finite (NaN / inf weights, rates and betas refused)
