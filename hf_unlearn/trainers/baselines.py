"""Baseline unlearning trainers: GradAscent, GradDiff, NPO and SimNPO on the shared :class:`UnlearningTrainer`.

Each trainer only wires a pure loss of :mod:`hf_unlearn.losses` to the batch. The total loss is always
``gamma * forget_term + alpha * retain_term`` (open-unlearning's convention), where the retain term is the retain
NLL or ``KL(pi_ref || pi_theta)`` (``UnlearningConfig.retain_loss``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ..losses import grad_ascent_loss, grad_diff_loss, npo_loss, simnpo_loss
from .unlearning_config import UnlearningConfig
from .unlearning_trainer import LossDenominators, UnlearningTrainer


class GradAscentTrainer(UnlearningTrainer):
    """Gradient ascent on the forget set: ``gamma * (-NLL_forget)`` (:func:`~hf_unlearn.losses.grad_ascent_loss`).
    Uses no retain set."""

    _name = "GradAscent"
    _tag_names = [*UnlearningTrainer._tag_names, "grad-ascent"]

    @classmethod
    def needs_retain(cls, args: UnlearningConfig) -> bool:
        return False

    def compute_unlearning_loss(self, model: Any, inputs: dict[str, Any], denominators: LossDenominators) -> torch.Tensor:
        forget = self.score(model, inputs)
        self.log_metric("forget_nll", forget.mean_nll)
        return self.args.gamma * grad_ascent_loss(forget.token_log_probs, forget.mask, denominators.forget_tokens)


class GradDiffTrainer(UnlearningTrainer):
    """Gradient difference: ``gamma * (-NLL_forget) + alpha * retain`` (:func:`~hf_unlearn.losses.grad_diff_loss`),
    retain = NLL (default) or ``KL(pi_ref || pi_theta)`` with ``retain_loss="kl"``."""

    _name = "GradDiff"
    _tag_names = [*UnlearningTrainer._tag_names, "grad-diff"]

    def compute_unlearning_loss(self, model: Any, inputs: dict[str, Any], denominators: LossDenominators) -> torch.Tensor:
        forget = self.score(model, inputs)
        self.log_metric("forget_nll", forget.mean_nll)
        retain = self.retain_term(model, inputs, denominators)
        return grad_diff_loss(
            forget.token_log_probs, forget.mask, retain, self.args.gamma, self.args.alpha, denominators.forget_tokens
        )


class NPOTrainer(UnlearningTrainer):
    """Negative Preference Optimization (Zhang et al. 2024) with a retain term:
    ``gamma * L_NPO + alpha * retain`` (:func:`~hf_unlearn.losses.npo_loss`), against the frozen initial model
    (or, with a PEFT adapter, the model with the adapter disabled). Defaults: ``beta=0.1``, ``gamma=alpha=1``;
    ``alpha=0`` gives plain NPO without a retain set."""

    _name = "NPO"
    _tag_names = [*UnlearningTrainer._tag_names, "npo"]
    default_hyperparameters: ClassVar[dict[str, float]] = {"beta": 0.1, "gamma": 1.0, "alpha": 1.0}

    @classmethod
    def needs_reference_model(cls, args: UnlearningConfig) -> bool:
        return True

    def compute_unlearning_loss(self, model: Any, inputs: dict[str, Any], denominators: LossDenominators) -> torch.Tensor:
        forget = self.score(model, inputs)
        ref = self.reference_scores(inputs)
        log_ratio = forget.sequence_log_probs - ref.sequence_log_probs
        self.log_metric("forget_nll", forget.mean_nll)
        self.log_metric("log_ratio", log_ratio.mean())
        loss = self.args.gamma * npo_loss(
            forget.sequence_log_probs, ref.sequence_log_probs, self.args.beta, denominators.forget_sequences
        )
        if self.args.alpha > 0:
            loss = loss + self.args.alpha * self.retain_term(model, inputs, denominators)
        return loss


class SimNPOTrainer(UnlearningTrainer):
    """SimNPO (Fan et al. 2024), reference-free and length-normalised:
    ``gamma * L_SimNPO + alpha * retain`` (:func:`~hf_unlearn.losses.simnpo_loss`). Defaults follow
    open-unlearning's TOFU setting: ``beta=4.5``, ``delta=0``, ``gamma=0.125``, ``alpha=1``."""

    _name = "SimNPO"
    _tag_names = [*UnlearningTrainer._tag_names, "simnpo"]
    default_hyperparameters: ClassVar[dict[str, float]] = {"beta": 4.5, "gamma": 0.125, "alpha": 1.0}

    def compute_unlearning_loss(self, model: Any, inputs: dict[str, Any], denominators: LossDenominators) -> torch.Tensor:
        forget = self.score(model, inputs)
        self.log_metric("forget_nll", forget.mean_nll)
        loss = self.args.gamma * simnpo_loss(
            forget.sequence_log_probs, forget.lengths, self.args.beta, self.args.delta, denominators.forget_sequences
        )
        if self.args.alpha > 0:
            loss = loss + self.args.alpha * self.retain_term(model, inputs, denominators)
        return loss
