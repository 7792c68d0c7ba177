"""Baseline unlearning trainers: :class:`BaselineTrainer` and its presets GradAscent, GradDiff, NPO and SimNPO."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ..base.config import FORGET_LOSSES, UnlearningConfig
from ..base.losses import LossDenominators
from ..base.trainer import UnlearningTrainer
from .config import GradAscentConfig, GradDiffConfig, NPOConfig, SimNPOConfig
from .loss import baseline_loss


class BaselineTrainer(UnlearningTrainer):
    """The baseline objective ``forget_weight * forget_term + retain_weight * retain_term``
    (:func:`~hf_unlearn.methods.baselines.loss.baseline_loss`), the terms chosen by ``forget_loss`` and
    ``retain_loss``; the presets below fix ``forget_loss`` and their defaults. Logs ``forget_nll`` (and
    ``log_ratio`` for NPO)."""

    config_class = UnlearningConfig
    preset: ClassVar[dict[str, Any]] = {}

    @classmethod
    def needs_reference_model(cls, args: UnlearningConfig) -> bool:
        """NPO's forget term and the KL retain term read the frozen reference."""
        return getattr(args, "forget_loss", None) == "npo" or super().needs_reference_model(args)

    def compute_unlearning_loss(
        self, model: Any, inputs: dict[str, Any], denominators: LossDenominators
    ) -> torch.Tensor:
        args = self.args
        kind = getattr(args, "forget_loss", None)
        if kind not in FORGET_LOSSES:
            raise NotImplementedError(
                f"{type(self).__name__} must implement `compute_unlearning_loss` (forget_loss={kind!r} is not a "
                "baseline objective)."
            )
        forget = self.score(model, inputs)
        self.log_metric("forget_nll", forget.mean_nll)
        ref_log_probs = None
        if kind == "npo":
            ref_log_probs = self.reference_scores(inputs).sequence_log_probs
            self.log_metric("log_ratio", (forget.sequence_log_probs - ref_log_probs).mean())
        retain = self.retain_term(model, inputs, denominators) if self.needs_retain(args) else None
        return baseline_loss(
            kind, forget.token_log_probs, forget.mask, retain, ref_log_probs=ref_log_probs, beta=args.beta,
            delta=args.delta, forget_weight=args.forget_weight, retain_weight=args.retain_weight,
            num_forget_tokens=denominators.forget_tokens, num_forget_sequences=denominators.forget_sequences,
        )


class GradAscentTrainer(BaselineTrainer):
    """Gradient ascent on the forget set: ``forget_weight * (-NLL_forget)``, no retain set by default."""

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
    """Gradient difference: ``forget_weight * (-NLL_forget) + retain_weight * retain`` (retain NLL or KL)."""

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
    """Negative Preference Optimization: ``forget_weight * L_NPO + retain_weight * retain``, against the frozen
    initial model."""

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
    """SimNPO, reference-free and length-normalised: ``forget_weight * L_SimNPO + retain_weight * retain``."""

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
