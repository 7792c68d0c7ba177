"""Baseline unlearning trainers: :class:`BaselineTrainer` and its presets GradAscent, GradDiff, NPO and SimNPO.

:class:`BaselineTrainer` trains ``forget_weight * forget_term + retain_weight * retain_term``
(:func:`baseline_objective`), the forget term chosen by ``forget_loss`` and the retain term by ``retain_loss`` of
its :class:`~hf_unlearn.methods.base.UnlearningConfig`. A preset sets ``config_class`` (its defaults,
:mod:`hf_unlearn.methods.baselines.config`) and ``preset`` (the config values that define the method).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ..base.config import UnlearningConfig
from ..base.losses import LossDenominators
from ..base.trainer import UnlearningTrainer
from .config import GradAscentConfig, GradDiffConfig, NPOConfig, SimNPOConfig
from .loss import baseline_loss

__all__ = ["BaselineTrainer", "GradAscentTrainer", "GradDiffTrainer", "NPOTrainer", "SimNPOTrainer",
           "baseline_objective"]

BASELINE_FORGET_LOSSES = ("grad_ascent", "npo", "simnpo")


def baseline_objective(
    trainer: UnlearningTrainer, model: Any, inputs: dict[str, Any], denominators: LossDenominators
) -> torch.Tensor:
    """The baseline objective of ``trainer.args`` (an :class:`~hf_unlearn.methods.base.UnlearningConfig`) on one
    micro-batch: :func:`~hf_unlearn.methods.baselines.loss.baseline_loss`, i.e.
    ``forget_weight * forget_term + retain_weight * retain_term`` with the forget term
    :func:`~hf_unlearn.methods.baselines.loss.grad_ascent_loss`, :func:`~hf_unlearn.methods.baselines.loss.npo_loss`
    (against the frozen reference) or :func:`~hf_unlearn.methods.baselines.loss.simnpo_loss` (``forget_loss``), and
    the retain term of :meth:`UnlearningTrainer.retain_term` (``retain_loss``; left out when ``"none"`` or
    ``retain_weight == 0``). Logs ``forget_nll`` (and ``log_ratio`` for NPO)."""
    args = trainer.args
    kind = getattr(args, "forget_loss", None)
    if kind not in BASELINE_FORGET_LOSSES:
        raise NotImplementedError(
            f"{type(trainer).__name__} must implement `compute_unlearning_loss` (forget_loss={kind!r} is not a "
            "baseline objective)."
        )
    forget = trainer.score(model, inputs)
    trainer.log_metric("forget_nll", forget.mean_nll)
    ref_log_probs = None
    if kind == "npo":
        ref_log_probs = trainer.reference_scores(inputs).sequence_log_probs
        trainer.log_metric("log_ratio", (forget.sequence_log_probs - ref_log_probs).mean())
    retain = trainer.retain_term(model, inputs, denominators) if trainer.needs_retain(args) else None
    return baseline_loss(
        kind, forget.token_log_probs, forget.mask, retain, ref_log_probs=ref_log_probs, beta=args.beta,
        delta=args.delta, forget_weight=args.forget_weight, retain_weight=args.retain_weight,
        num_forget_tokens=denominators.forget_tokens,
        num_forget_sequences=denominators.forget_sequences,
    )


class BaselineTrainer(UnlearningTrainer):
    """The trainer of the baseline objective: the shared :class:`UnlearningTrainer` with
    :func:`baseline_objective` as its loss hook, ``forget_weight * forget_term + retain_weight * retain_term``, the
    forget term chosen by ``forget_loss`` and the retain term by ``retain_loss`` of its
    :class:`~hf_unlearn.methods.base.UnlearningConfig`. The presets below fix ``forget_loss`` (and GradAscent
    ``retain_loss``) and their defaults."""

    config_class = UnlearningConfig
    preset: ClassVar[dict[str, Any]] = {}

    @classmethod
    def needs_reference_model(cls, args: UnlearningConfig) -> bool:
        """NPO's forget term and the KL retain term read the frozen reference."""
        return getattr(args, "forget_loss", None) == "npo" or super().needs_reference_model(args)

    def compute_unlearning_loss(
        self, model: Any, inputs: dict[str, Any], denominators: LossDenominators
    ) -> torch.Tensor:
        return baseline_objective(self, model, inputs, denominators)


class GradAscentTrainer(BaselineTrainer):
    """Gradient ascent on the forget set: ``forget_weight * (-NLL_forget)`` (:func:`~hf_unlearn.methods.baselines.loss.grad_ascent_loss`).
    Uses no retain set ([`GradAscentConfig`]: ``forget_loss="grad_ascent"``, ``retain_loss="none"``)."""

    _name = "GradAscent"
    _method = "grad_ascent"
    _title = "Gradient Ascent"
    _paper: ClassVar[dict[str, str]] = {
        "title": "Knowledge Unlearning for Mitigating Privacy Risks in Language Models", "id": "2210.01504"}
    _cli_help = "gradient ascent on the forget NLL"
    _tag_names = [*UnlearningTrainer._tag_names, "grad-ascent"]
    config_class = GradAscentConfig
    preset: ClassVar[dict[str, Any]] = {"forget_loss": "grad_ascent", "retain_loss": "none"}


class GradDiffTrainer(BaselineTrainer):
    """Gradient difference: ``forget_weight * (-NLL_forget) + retain_weight * retain`` (Liu et al. 2022; TOFU's ``grad_diff``),
    retain = NLL (default) or ``KL(pi_ref || pi_theta)`` with ``retain_loss="kl"`` ([`GradDiffConfig`])."""

    _name = "GradDiff"
    _method = "grad_diff"
    _title = "Gradient Difference"
    _paper: ClassVar[dict[str, str]] = {"title": "TOFU: A Task of Fictitious Unlearning for LLMs", "id": "2401.06121"}
    _cli_help = "gradient ascent on forget + descent on retain NLL"
    _tag_names = [*UnlearningTrainer._tag_names, "grad-diff"]
    config_class = GradDiffConfig
    preset: ClassVar[dict[str, Any]] = {"forget_loss": "grad_ascent"}

    @classmethod
    def check_hyperparameters(cls, args: UnlearningConfig) -> None:
        if args.retain_loss == "none":
            raise ValueError("GradDiffTrainer needs a retain term (retain_loss 'nll' or 'kl'); use GradAscentTrainer.")


class NPOTrainer(BaselineTrainer):
    """Negative Preference Optimization (Zhang et al. 2024) with a retain term:
    ``forget_weight * L_NPO + retain_weight * retain`` (:func:`~hf_unlearn.methods.baselines.loss.npo_loss`), against the frozen initial model
    (or, with a PEFT adapter, the model with the adapter disabled). Defaults ([`NPOConfig`]): ``beta=0.1``,
    ``forget_weight=retain_weight=1``; ``retain_weight=0`` gives plain NPO without a retain set."""

    _name = "NPO"
    _method = "npo"
    _title = "NPO (Negative Preference Optimization)"
    _paper: ClassVar[dict[str, str]] = {
        "title": "Negative Preference Optimization: From Catastrophic Collapse to Effective Unlearning",
        "id": "2404.05868"}
    _cli_help = "negative preference optimization (with retain NLL)"
    _tag_names = [*UnlearningTrainer._tag_names, "npo"]
    config_class = NPOConfig
    preset: ClassVar[dict[str, Any]] = {"forget_loss": "npo"}


class SimNPOTrainer(BaselineTrainer):
    """SimNPO (Fan et al. 2024), reference-free and length-normalised:
    ``forget_weight * L_SimNPO + retain_weight * retain`` (:func:`~hf_unlearn.methods.baselines.loss.simnpo_loss`). Defaults ([`SimNPOConfig`])
    follow open-unlearning's TOFU setting: ``beta=4.5``, ``delta=0``, ``forget_weight=0.125``, ``retain_weight=1``."""

    _name = "SimNPO"
    _method = "simnpo"
    _title = "SimNPO"
    _paper: ClassVar[dict[str, str]] = {
        "title": "Simplicity Prevails: Rethinking Negative Preference Optimization for LLM Unlearning",
        "id": "2410.07163"}
    _cli_help = "reference-free NPO with length normalisation"
    _tag_names = [*UnlearningTrainer._tag_names, "simnpo"]
    config_class = SimNPOConfig
    preset: ClassVar[dict[str, Any]] = {"forget_loss": "simnpo"}
