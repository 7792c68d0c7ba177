"""Baseline unlearning trainers: GradAscent, GradDiff, NPO and SimNPO, thin presets of :class:`UnlearningTrainer`.

Each preset is the shared trainer with one objective of :class:`~hf_unlearn.trainers.UnlearningConfig`:
``gamma * forget_term + alpha * retain_term`` (open-unlearning's convention), where the forget term is chosen by
``forget_loss`` and the retain term (retain NLL or ``KL(pi_ref || pi_theta)``) by ``retain_loss``. A preset sets

* ``config_class``: its config preset (:mod:`hf_unlearn.trainers.unlearning_config`), the one place where its
  defaults differ from :class:`~hf_unlearn.trainers.UnlearningConfig` (SimNPO: ``beta=4.5``, ``gamma=0.125``);
* ``preset``: the config values that define the method (its ``forget_loss``; GradAscent also ``retain_loss="none"``),
  applied when a config of another class is converted and required of a config of its own class.

The loss itself is :meth:`UnlearningTrainer.compute_unlearning_loss` on the pure functions of
:mod:`hf_unlearn.losses`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from .unlearning_config import GradAscentConfig, GradDiffConfig, NPOConfig, SimNPOConfig, UnlearningConfig
from .unlearning_trainer import UnlearningTrainer


class GradAscentTrainer(UnlearningTrainer):
    """Gradient ascent on the forget set: ``gamma * (-NLL_forget)`` (:func:`~hf_unlearn.losses.grad_ascent_loss`).
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


class GradDiffTrainer(UnlearningTrainer):
    """Gradient difference: ``gamma * (-NLL_forget) + alpha * retain`` (Liu et al. 2022; TOFU's ``grad_diff``),
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


class NPOTrainer(UnlearningTrainer):
    """Negative Preference Optimization (Zhang et al. 2024) with a retain term:
    ``gamma * L_NPO + alpha * retain`` (:func:`~hf_unlearn.losses.npo_loss`), against the frozen initial model
    (or, with a PEFT adapter, the model with the adapter disabled). Defaults ([`NPOConfig`]): ``beta=0.1``,
    ``gamma=alpha=1``; ``alpha=0`` gives plain NPO without a retain set."""

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


class SimNPOTrainer(UnlearningTrainer):
    """SimNPO (Fan et al. 2024), reference-free and length-normalised:
    ``gamma * L_SimNPO + alpha * retain`` (:func:`~hf_unlearn.losses.simnpo_loss`). Defaults ([`SimNPOConfig`])
    follow open-unlearning's TOFU setting: ``beta=4.5``, ``delta=0``, ``gamma=0.125``, ``alpha=1``."""

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
