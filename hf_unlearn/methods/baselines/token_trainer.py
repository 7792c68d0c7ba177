"""The token-level baselines WGA, SatImp, CE-U and UNDIAL: ``forget_weight * forget_term + retain_weight *
retain_term`` (:class:`ForgetRetainTrainer`), the forget term a pure function of
:mod:`hf_unlearn.methods.baselines.token_loss`, the retain term the base trainer's.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ..base.losses import LossDenominators
from ..base.trainer import UnlearningTrainer
from .config import CEUConfig, ForgetRetainConfig, SatImpConfig, UNDIALConfig, WGAConfig
from .token_loss import ceu_loss, satimp_loss, undial_loss, wga_loss

__all__ = ["CEUTrainer", "ForgetRetainTrainer", "SatImpTrainer", "UNDIALTrainer", "WGATrainer"]


class ForgetRetainTrainer(UnlearningTrainer):
    """An objective ``forget_weight * forget_term + retain_weight * retain_term`` with a config of
    :class:`~hf_unlearn.methods.baselines.config.ForgetRetainConfig`; a subclass implements :meth:`forget_term`.
    Logs ``forget_nll`` and ``forget_loss`` (the unweighted forget term), and the retain term's ``retain_nll`` /
    ``retain_loss``."""

    config_class: ClassVar[type[ForgetRetainConfig]] = ForgetRetainConfig

    def forget_term(self, model: Any, inputs: dict[str, Any], denominators: LossDenominators) -> torch.Tensor:
        """The unweighted forget term of this micro-batch."""
        raise NotImplementedError(f"{type(self).__name__} must implement `forget_term`.")

    def compute_unlearning_loss(
        self, model: Any, inputs: dict[str, Any], denominators: LossDenominators
    ) -> torch.Tensor:
        forget = self.forget_term(model, inputs, denominators)
        self.log_metric("forget_loss", forget)
        loss = self.args.forget_weight * forget
        if self.needs_retain(self.args):
            loss = loss + self.args.retain_weight * self.retain_term(model, inputs, denominators)
        return loss


class WGATrainer(ForgetRetainTrainer):
    """Weighted Gradient Ascent (Wang et al. 2025): the forget term is
    :func:`~hf_unlearn.methods.baselines.token_loss.wga_loss` (each forget token's ascent weighted by its detached
    probability to the power ``beta``). Defaults ([`WGAConfig`]): ``beta=1``, retain NLL at weight 1."""

    _name = "WGA"
    _method = "wga"
    _title = "WGA (Weighted Gradient Ascent)"
    _paper: ClassVar[dict[str, str]] = {
        "title": "Rethinking LLM Unlearning Objectives: A Gradient Perspective and Go Beyond", "id": "2502.19301"}
    _cli_help = "gradient ascent weighted by each token's probability (with retain NLL)"
    _tag_names = [*UnlearningTrainer._tag_names, "wga"]
    config_class = WGAConfig

    def forget_term(self, model, inputs, denominators):
        forget = self.score(model, inputs)
        self.log_metric("forget_nll", forget.mean_nll)
        return wga_loss(forget.token_log_probs, forget.mask, self.args.beta, denominators.forget_tokens)


class SatImpTrainer(ForgetRetainTrainer):
    """SatImp (Yang et al. 2025): the forget term is :func:`~hf_unlearn.methods.baselines.token_loss.satimp_loss`
    (ascent weighted by ``p^beta1 * (1 - p)^beta2`` of each token's detached probability ``p``). Defaults
    ([`SatImpConfig`]): ``beta1=5``, ``beta2=1``, ``forget_weight=1``, retain NLL at weight ``0.1``."""

    _name = "SatImp"
    _method = "satimp"
    _title = "SatImp"
    _paper: ClassVar[dict[str, str]] = {
        "title": "Exploring Criteria of Loss Reweighting to Enhance LLM Unlearning", "id": "2505.11953"}
    _cli_help = "gradient ascent reweighted by saturation and importance (with retain NLL)"
    _tag_names = [*UnlearningTrainer._tag_names, "satimp"]
    config_class = SatImpConfig

    def forget_term(self, model, inputs, denominators):
        forget = self.score(model, inputs)
        self.log_metric("forget_nll", forget.mean_nll)
        return satimp_loss(forget.token_log_probs, forget.mask, self.args.beta1, self.args.beta2,
                           denominators.forget_tokens)


class CEUTrainer(ForgetRetainTrainer):
    """Cross-Entropy Unlearning (Yang 2025): the forget term is
    :func:`~hf_unlearn.methods.baselines.token_loss.ceu_loss` (cross-entropy against the model's own detached
    distribution without the true token), the first ``skip_first_answer_tokens`` answer tokens left out. Defaults
    ([`CEUConfig`]): forget term only (``retain_weight=0``), one token skipped.

    Its token count for an exact loss under gradient accumulation is the step's answer tokens minus
    ``skip_first_answer_tokens`` per answer (exact when every answer has at least that many tokens)."""

    _name = "CEU"
    _method = "ceu"
    _title = "CE-U (Cross-Entropy Unlearning)"
    _paper: ClassVar[dict[str, str]] = {"title": "CE-U: Cross Entropy Unlearning", "id": "2503.01224"}
    _cli_help = "cross-entropy towards the model's own distribution without the true token"
    _tag_names = [*UnlearningTrainer._tag_names, "ce-u"]
    config_class = CEUConfig

    def forget_term(self, model, inputs, denominators):
        forget = self.score(model, inputs)
        self.log_metric("forget_nll", forget.mean_nll)
        skip = self.args.skip_first_answer_tokens
        num_tokens = denominators.forget_tokens - skip * denominators.forget_sequences
        return ceu_loss(forget.logits, forget.labels, skip, num_tokens)


class UNDIALTrainer(ForgetRetainTrainer):
    """UNDIAL (Dong et al. 2025): the forget term is :func:`~hf_unlearn.methods.baselines.token_loss.undial_loss`,
    self-distillation towards the frozen initial model's distribution with the true token's logit lowered by
    ``beta``. The frozen model is the trainers' reference (the initial model, or with a PEFT adapter the model with
    the adapter disabled), under the multi-process rules of the reference model. Defaults ([`UNDIALConfig`]):
    ``beta=10``, learning rate ``1e-4``, forget term only."""

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

    def forget_term(self, model, inputs, denominators):
        forget = self.score(model, inputs)
        self.log_metric("forget_nll", forget.mean_nll)
        ref = self.reference_scores(inputs)
        return undial_loss(forget.logits, ref.logits, forget.labels, self.args.beta, denominators.forget_tokens)
