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

    ATWU learns, while it unlearns, which forget answer tokens carry the information to remove. A linear weighter
    `g_t = sigmoid(<w, (h_t - mu) / sigma> + b)` on the model's detached last-layer hidden state of each forget
    answer token (its own, `h_t`, as the paper's `sigmoid(<w, h_theta(x_t)>)`; `scorer_position`), standardised by
    their running mean `mu` and standard deviation `sigma` (`scorer_standardize`), weights each forget token, and
    two updates alternate:

    - *model step* (every optimizer step): `forget_weight * L_forget(theta; sg(g)) + retain_weight * retain`, the forget loss
      weighted by the (detached) scores;
    - *weighter step* (every `scorer_every` model steps, model frozen, own Adam optimizer with `scorer_lr`):
      `L_forget(g; sg(theta)) + retain_conflict_weight * mean_t g_t c_t + entropy_weight * H(g)
      + budget_weight * (mean_t STE(1[g_b,t > 0.5]) - budget)^2 + scorer_l2 * ||w||^2`, with `c_t` the retain
      conflict of token `t` (what gradient ascent on it costs the batch's retain answers through the output layer,
      [`~hf_unlearn.methods.atwu.loss.retain_conflict`], normalised to a mean magnitude of 1) and
      `g_b = sigmoid(sg(<w, h>) + b)`: the budget moves only the bias, the threshold, and the per-token terms
      alone set the order of the tokens (a budget penalty through `w` moved all scores together at about 1000
      times the forget term's per-token differences).

    Tokens that the model can forget without fighting the retain objective (forget-specific ones) end up with high
    scores; tokens shared with the retain data (structure, common words) with low ones: the retain conflict is the
    signal that tells them apart, the first-order gradient of the retain loss after a model step weighted by `g`.
    Deviations from the paper, named: the conflict is taken through the output layer only (per-token gradients of
    the whole model would cost one backward pass per token); the budget acts through the bias alone.

    Before the first model step, `scorer_warmup_steps` weighter steps (model frozen) on the first forget training batches let the scores
    order the tokens before they weight any update.

    Where the defaults come from: ATWU has no published code, so no default is an author's. The scorer defaults
    were measured on the tiny test model (the small Llama that memorises the synthetic TOFU set; forget10, 30
    steps at lr 5e-4, batch 4; the weighter reading the predicting state, without the retain conflict): token-score
    AUROC against forget-specific tokens, mean of seeds 0-2, with
    standardised inputs 0.824, centred-only 0.790, plus 5 warm-up steps 0.774, hard selection 0.701, a 10-step
    `c` schedule 0.784. The others (budget, weights, learning rates) are the method's design values, not tuned.

    Parameters:
        > Parameters that control the forget loss

        forget_loss (`str`, *optional*, defaults to `"satga"`):
            `"satga"`: SATGA+, score-gated saturated gradient ascent ([`~hf_unlearn.methods.atwu.loss.satga_plus_loss`]);
            `"npo"`: token-weighted NPO against the frozen initial model ([`~hf_unlearn.methods.atwu.loss.weighted_npo_loss`],
            uses `npo_beta`); `"simnpo"`: token-weighted SimNPO ([`~hf_unlearn.methods.atwu.loss.weighted_simnpo_loss`], uses
            `simnpo_beta` and `simnpo_delta`).
        satga_form (`str`, *optional*, defaults to `"gated"`):
            Form of SATGA+: `"gated"`, `-sum g_t sg(p_t)^(beta (1 + c (1 - g_t))) l_t / sum g_t` (the score weights
            each token and sets its saturation, normalised by the selected score mass); `"exponent_only"`, the
            earlier `-mean_t sg(p_t)^(beta (1 + c (1 - g_t))) l_t` (the score only in the exponent).
        saturation_beta (`float`, *optional*, defaults to `0.2`):
            SATGA+ saturation strength `beta > 0`: a selected token (`g = 1`) is weighted `sg(p_t)^beta`.
        saturation_c (`float`, *optional*, defaults to `50.0`):
            SATGA+ score contrast `c >= 0`: the saturation exponent is `beta * (1 + c * (1 - g_t))`. The earlier
            `"exponent_only"` form used `20`; with the gate, `50` keeps the weighter's ordering signal (the exponent
            term) strong enough: on the tiny test run (30 steps, centred scorer inputs) the token-score
            AUROC against forget-specific tokens is 0.790 (mean of seeds 0-2) against 0.771 for `"exponent_only"`
            at `c = 20` and 0.713 for `"gated"` at `c = 20` (measured).
        saturation_c_warmup_steps (`int`, *optional*, defaults to `0`):
            The `c` schedule: `c` ramps linearly from `c / W` at model step 0 to `saturation_c` at step `W - 1`
            (`c_s = saturation_c * min(1, (s + 1) / W)`, `W` this value), so that the score shapes the saturation
            only once the weighter has learnt something; `0` keeps `c` constant (measured: a 10-step ramp gave
            AUROC 0.784 against 0.824 constant on the tiny test run).
        satga_selection (`str`, *optional*, defaults to `"soft"`):
            Score in the SATGA+ exponent: `"soft"`, `g_t`; `"hard"`, the selection `STE(1[g_t > 0.5])`
            ([`~hf_unlearn.methods.atwu.loss.satga_plus_exponent`]): selected tokens saturate with `beta`, rejected ones with
            `beta * (1 + c)` (measured: AUROC 0.701 against 0.824 soft on the tiny test run).
        npo_beta (`float`, *optional*, defaults to `0.1`):
            Inverse temperature of the weighted NPO forget loss (`forget_loss="npo"`), `> 0`.
        simnpo_beta (`float`, *optional*, defaults to `4.5`):
            Inverse temperature of the weighted SimNPO forget loss (`forget_loss="simnpo"`), `> 0`.
        simnpo_delta (`float`, *optional*, defaults to `0.0`):
            Reward margin of the weighted SimNPO forget loss.
        forget_weight (`float`, *optional*, defaults to `1.0`):
            Weight of the forget term in the model step, `> 0`.

        > Parameters that control the retain term

        retain_loss (`str`, *optional*, defaults to `"nll"`):
            `"nll"`, `"kl"` (`KL(pi_ref || pi_theta)` per token) or `"none"`.
        retain_weight (`float`, *optional*, defaults to `1.0`):
            Weight of the retain term, `>= 0` (`0` or `retain_loss="none"`: no retain set needed).

        > Parameters that control the weighter

        budget (`float`, *optional*, defaults to `0.2`):
            Target fraction of forget answer tokens selected (`g_t > 0.5`), in `(0, 1)`. A fresh weighter starts
            with every score equal to `budget` (`b = log(budget / (1 - budget))`, `w = 0`).
        budget_weight (`float`, *optional*, defaults to `50.0`):
            Weight of the budget penalty `(mean_t STE(1[g_t > 0.5]) - budget)^2` in the weighter step.
        entropy_weight (`float`, *optional*, defaults to `0.01`):
            Weight of the mean binary entropy of the scores (pushes them to 0 or 1) in the weighter step.
        scorer_l2 (`float`, *optional*, defaults to `0.0`):
            Weight of `||w||^2` in the weighter step.
        scorer_lr (`float`, *optional*, defaults to `1e-2`):
            Learning rate of the weighter's Adam optimizer.
        scorer_every (`int`, *optional*, defaults to `1`):
            One weighter step every `scorer_every` model (optimizer) steps, `>= 1`; it runs just before that model
            step, on its first micro-batch.
        scorer_standardize (`bool`, *optional*, defaults to `True`):
            Standardise the weighter's inputs by the running mean and variance of the scored hidden states
            (saved with the weighter); `False` only centres them (the earlier weighter). A pretrained model's
            hidden states have a few dimensions of very large magnitude, which a centred-only linear scorer
            trained by one Adam learning rate cannot weigh against the others (measured: AUROC 0.824
            standardised against 0.790 centred on the tiny test run). A weighter given to the trainer (`scorer=`)
            keeps its own setting.
        scorer_warmup_steps (`int`, *optional*, defaults to `0`):
            Weighter-only steps (model frozen) before the first model step, on the first forget training
            batches in order (cycled), `>= 0`; they see no retain rows, so no retain conflict.
        scorer_position (`str`, *optional*, defaults to `"token"`):
            The hidden state that scores answer token `t`: `"token"`, its own representation `h_t` (the paper's);
            `"predicting"`, the state `h_{t-1}` that predicts it (where its loss is computed; the earlier reading).
            Measured on the tiny test model with the retain conflict (40 steps, seeds 0-1,
            `benchmarks/fidelity_tiny.py`): token AUROC against the answers' name/date/place spans 0.64 (`"token"`)
            and 0.69 (`"predicting"`), against forget-specific tokens 0.91 and 0.89.
        retain_conflict_weight (`float`, *optional*, defaults to `1.0`):
            Weight of the retain-conflict term `mean_t g_t c_t` in the weighter step, `>= 0`. Each weighter step
            then runs one forward of the batch's retain part without gradient; `0` skips it and leaves the scorer
            without the retain signal (measured as above: AUROC against forget-specific tokens 0.91 with it, 0.63
            without).

    > [!NOTE]
    > Everything else is as in [`BaseUnlearningConfig`] (`learning_rate` `1e-5`, 10 epochs).
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
    saturation_c: float = field(default=50.0, metadata={"help": "SATGA+ score contrast c (>= 0)."})
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

    def __post_init__(self) -> None:
        if self.forget_loss not in ATWU_FORGET_LOSSES:
            raise ValueError(f"forget_loss must be one of {list(ATWU_FORGET_LOSSES)}, got {self.forget_loss!r}.")
        if self.satga_form not in SATGA_FORMS:
            raise ValueError(f"satga_form must be one of {list(SATGA_FORMS)}, got {self.satga_form!r}.")
        if self.retain_loss not in RETAIN_LOSSES:
            raise ValueError(f"retain_loss must be one of {list(RETAIN_LOSSES)}, got {self.retain_loss!r}.")
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
        if self.scorer_position not in SCORER_POSITIONS:
            raise ValueError(f"scorer_position must be one of {list(SCORER_POSITIONS)}, got {self.scorer_position!r}.")
        if self.satga_selection not in SATGA_SELECTIONS:
            raise ValueError(f"satga_selection must be one of {list(SATGA_SELECTIONS)}, got {self.satga_selection!r}.")
        if not self.scorer_lr > 0:
            raise ValueError(f"scorer_lr must be > 0, got {self.scorer_lr}.")
        for name in ("budget_weight", "entropy_weight", "scorer_l2", "saturation_c", "forget_weight", "retain_weight",
                     "retain_conflict_weight"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}.")
        for name in ("saturation_beta", "npo_beta", "simnpo_beta"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}.")
        refuse_no_forget_term(self.forget_weight, self.retain_weight)
        super().__post_init__()  # also every float finite (NaN / inf weights, rates and betas refused)
