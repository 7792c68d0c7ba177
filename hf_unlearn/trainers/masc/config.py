"""Configuration of the MASC (Margin Self-Correction) trainer."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..unlearning_config import UnlearningConfig


@dataclass
class MASCConfig(UnlearningConfig):
    r"""
    Configuration class for the [`MASCTrainer`].

    MASC pushes down the *restricted margin* of every forget answer token,
    `m_t = beta * z(y_t | c_t) - logsumexp_{v in S_k(c_t)} beta * z(v | c_t)` (`z` the logits, `S_k` the model's
    current top-`k` tokens other than the target, chosen without gradient), with a hinge `max(0, m_t - tau)` that
    switches off once a position is corrected, plus `kl_weight * KL(pi_0 || pi_theta)` on retain answer tokens against
    the frozen starting model. Training stops by itself at the first check where the fraction of held-out forget
    answer positions with `m_t > tau` (the violation rate) is at most `stop_tolerance`.

    The threshold is given either as `margin_threshold` (`tau`) or as `margin_probability` (`rho`). The margin is the
    log-odds of the target under the softmax restricted to `{y_t} U S_k`, `m_t = log(p_r / (1 - p_r))`, so
    `m_t > tau` exactly when `p_r > rho` with `tau = log(rho / (1 - rho))` (equivalently `rho = sigmoid(tau)`).
    With neither given, `tau = 0` (`rho = 0.5`: the target is no longer more likely than its `k` rivals together).

    Parameters:
        > Parameters that control the margin

        top_k (`int`, *optional*, defaults to `10`):
            Number of rival tokens `k` in `S_k`; must be in `[1, vocab_size - 1]`.
        margin_beta (`float`, *optional*, defaults to `1.0`):
            Inverse temperature `beta` applied to the logits inside the margin.
        margin_threshold (`float`, *optional*):
            Threshold `tau`: a position violates (and is trained) while `m_t > tau`. Mutually exclusive with
            `margin_probability`.
        margin_probability (`float`, *optional*):
            Threshold as a restricted probability `rho` in `(0, 1)`; `tau = log(rho / (1 - rho))`.

        > Parameters that control the loss

        kl_weight (`float`, *optional*, defaults to `1.0`):
            Weight `lambda` of `KL(pi_0 || pi_theta)` on retain answer tokens (`0` disables the retain term).

        > Parameters that control the stopping rule

        stop_tolerance (`float`, *optional*, defaults to `0.05`):
            `alpha` in `(0, 1)`: training stops at the first check where the held-out violation rate is `<= alpha`.
        validation_fraction (`float`, *optional*, defaults to `0.1`):
            Fraction of the forget set held out (never trained on) to measure the violation rate; at least one
            example is held out and at least one is kept for training.
        check_every (`int`, *optional*, defaults to `5`):
            Measure the held-out violation rate every `check_every` optimizer steps.
        min_validation_positions (`int`, *optional*, defaults to `20`):
            The held-out slice must have at least `max(min_validation_positions, ceil(1 / alpha))` answer positions,
            enough to resolve a rate of `alpha`.
        max_steps (`int`, *optional*, defaults to `200`):
            Step budget guarding against a rule that never fires (a warning says when it is hit). `-1` falls back to
            `num_train_epochs`.

    > [!NOTE]
    > Default values in this class that differ from [`UnlearningConfig`]: `max_steps` is `200` (a budget, not a
    > schedule) and `learning_rate` is `1e-4`.
    """

    top_k: int = field(default=10, metadata={"help": "Number k of rival tokens in the restricted margin."})
    margin_beta: float = field(default=1.0, metadata={"help": "Inverse temperature beta inside the margin."})
    margin_threshold: float | None = field(
        default=None, metadata={"help": "Margin threshold tau (exclusive with margin_probability); default 0."}
    )
    margin_probability: float | None = field(
        default=None, metadata={"help": "Threshold as restricted probability rho; tau = log(rho / (1 - rho))."}
    )
    kl_weight: float = field(default=1.0, metadata={"help": "Weight lambda of KL(pi_0 || pi_theta) on retain tokens."})
    stop_tolerance: float = field(
        default=0.05, metadata={"help": "alpha: stop when the held-out violation rate is <= alpha."}
    )
    validation_fraction: float = field(
        default=0.1, metadata={"help": "Fraction of the forget set held out for the stopping rule."}
    )
    check_every: int = field(default=5, metadata={"help": "Check the stopping rule every this many steps."})
    min_validation_positions: int = field(
        default=20, metadata={"help": "Minimum number of held-out answer positions to measure a rate."}
    )
    max_steps: int = field(default=200, metadata={"help": "Step budget (guard against never stopping)."})
    learning_rate: float = field(default=1e-4, metadata={"help": "Initial learning rate of the optimizer."})

    def __post_init__(self) -> None:
        if int(self.top_k) < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}.")
        if self.margin_beta <= 0:
            raise ValueError(f"margin_beta must be > 0, got {self.margin_beta}.")
        if self.margin_threshold is not None and self.margin_probability is not None:
            raise ValueError("Give the threshold either as margin_threshold (tau) or margin_probability (rho), not both.")
        if self.margin_probability is not None and not 0.0 < self.margin_probability < 1.0:
            raise ValueError(f"margin_probability (rho) must lie in (0, 1), got {self.margin_probability}.")
        if self.margin_threshold is not None and not math.isfinite(self.margin_threshold):
            raise ValueError(f"margin_threshold (tau) must be finite, got {self.margin_threshold}.")
        if not 0.0 < self.stop_tolerance < 1.0:
            raise ValueError(f"stop_tolerance (alpha) must lie in (0, 1), got {self.stop_tolerance}.")
        if not 0.0 < self.validation_fraction < 1.0:
            raise ValueError(f"validation_fraction must lie in (0, 1), got {self.validation_fraction}.")
        if self.check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {self.check_every}.")
        if self.kl_weight < 0:
            raise ValueError(f"kl_weight must be >= 0, got {self.kl_weight}.")
        if self.min_validation_positions < 1:
            raise ValueError(f"min_validation_positions must be >= 1, got {self.min_validation_positions}.")
        if self.max_steps == 0 or self.max_steps < -1:
            raise ValueError(f"max_steps (the step budget) must be positive or -1, got {self.max_steps}.")
        super().__post_init__()

    @property
    def tau(self) -> float:
        """The margin threshold `tau`, from `margin_threshold` or `margin_probability` (default 0)."""
        if self.margin_threshold is not None:
            return float(self.margin_threshold)
        if self.margin_probability is not None:
            return math.log(self.margin_probability / (1.0 - self.margin_probability))
        return 0.0

    @property
    def rho(self) -> float:
        """The restricted-probability form of the threshold, `sigmoid(tau)`."""
        return 1.0 / (1.0 + math.exp(-self.tau))

    @property
    def min_validation_size(self) -> int:
        """Answer positions the held-out slice needs: `max(min_validation_positions, ceil(1 / alpha))`."""
        return max(int(self.min_validation_positions), math.ceil(1.0 / self.stop_tolerance - 1e-9))
