"""The token-level baselines WGA, SatImp, CE-U and UNDIAL (:class:`ForgetRetainTrainer`)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ..base.losses import LossDenominators, ScoredBatch
from ..base.trainer import UnlearningTrainer
from .config import CEUConfig, ForgetRetainConfig, SatImpConfig, UNDIALConfig, WGAConfig
from .token_loss import ceu_loss, satimp_loss, undial_loss, wga_loss


class ForgetRetainTrainer(UnlearningTrainer):
    """The objective ``forget_weight * forget_term + retain_weight * retain_term``; a subclass implements
    :meth:`forget_term`. Logs ``forget_loss`` (unweighted)."""

    config_class: ClassVar[type[ForgetRetainConfig]] = ForgetRetainConfig

    def forget_term(
        self, model: Any, forget: ScoredBatch, inputs: dict[str, Any], denominators: LossDenominators
    ) -> torch.Tensor:
        """The unweighted forget term of this micro-batch (``forget``: its scored forget half)."""
        raise NotImplementedError(f"{type(self).__name__} must implement `forget_term`.")

    def compute_unlearning_loss(
        self, model: Any, inputs: dict[str, Any], denominators: LossDenominators
    ) -> torch.Tensor:
        scored = self.score(model, inputs)
        self.log_metric("forget_nll", scored.mean_nll)
        forget = self.forget_term(model, scored, inputs, denominators)
        self.log_metric("forget_loss", forget)
        loss = self.args.forget_weight * forget
        if self.needs_retain(self.args):
            loss = loss + self.args.retain_weight * self.retain_term(model, inputs, denominators)
        return loss


class WGATrainer(ForgetRetainTrainer):
    """Weighted Gradient Ascent: the forget term is :func:`~hf_unlearn.methods.baselines.token_loss.wga_loss`."""

    _name = "WGA"
    _method = "wga"
    _title = "WGA (Weighted Gradient Ascent)"
    _paper: ClassVar[dict[str, str]] = {
        "title": "Rethinking LLM Unlearning Objectives: A Gradient Perspective and Go Beyond", "id": "2502.19301"}
    _cli_help = "gradient ascent weighted by each token's probability (with retain NLL)"
    _tag_names = [*UnlearningTrainer._tag_names, "wga"]
    config_class = WGAConfig

    def forget_term(self, model, forget, inputs, denominators):
        return wga_loss(forget.token_log_probs, forget.mask, self.args.beta, denominators.forget_tokens)


class SatImpTrainer(ForgetRetainTrainer):
    """SatImp: the forget term is :func:`~hf_unlearn.methods.baselines.token_loss.satimp_loss`."""

    _name = "SatImp"
    _method = "satimp"
    _title = "SatImp"
    _paper: ClassVar[dict[str, str]] = {
        "title": "Exploring Criteria of Loss Reweighting to Enhance LLM Unlearning", "id": "2505.11953"}
    _cli_help = "gradient ascent reweighted by saturation and importance (with retain NLL)"
    _tag_names = [*UnlearningTrainer._tag_names, "satimp"]
    config_class = SatImpConfig

    def forget_term(self, model, forget, inputs, denominators):
        return satimp_loss(forget.token_log_probs, forget.mask, self.args.beta1, self.args.beta2,
                           denominators.forget_tokens)


class CEUTrainer(ForgetRetainTrainer):
    """Cross-Entropy Unlearning: the forget term is :func:`~hf_unlearn.methods.baselines.token_loss.ceu_loss`,
    divided by the step's answer tokens minus ``skip_first_answer_tokens`` per answer."""

    _name = "CEU"
    _method = "ceu"
    _title = "CE-U (Cross-Entropy Unlearning)"
    _paper: ClassVar[dict[str, str]] = {"title": "CE-U: Cross Entropy Unlearning", "id": "2503.01224"}
    _cli_help = "cross-entropy towards the model's own distribution without the true token"
    _tag_names = [*UnlearningTrainer._tag_names, "ce-u"]
    config_class = CEUConfig

    def forget_term(self, model, forget, inputs, denominators):
        skip = self.args.skip_first_answer_tokens
        num_tokens = denominators.forget_tokens - skip * denominators.forget_sequences
        return ceu_loss(forget.logits, forget.labels, skip, num_tokens)


class UNDIALTrainer(ForgetRetainTrainer):
    """UNDIAL: the forget term is :func:`~hf_unlearn.methods.baselines.token_loss.undial_loss`, against the
    frozen reference."""

    _name = "UNDIAL"
    _method = "undial"
    _title = "UNDIAL (Self-Distillation with Adjusted Logits)"
    _paper: ClassVar[dict[str, str]] = {
        "title": "UNDIAL: Self-Distillation with Adjusted Logits for Robust Unlearning in Large Language Models",
        "id": "2402.10052"}
    _cli_help = "self-distillation towards the frozen model with the true token's logit lowered"
    _tag_names = [*UnlearningTrainer._tag_names, "undial"]
    config_class = UNDIALConfig

    @classmethod
    def needs_reference_model(cls, args) -> bool:
        return True

    def forget_term(self, model, forget, inputs, denominators):
        ref = self.reference_scores(inputs)
        return undial_loss(forget.logits, ref.logits, forget.labels, self.args.beta, denominators.forget_tokens)
