"""PDU (Primal-Dual Unlearning): flatten the forget answers' logits under a constraint on the retain loss, with the
retain weight as a dual variable (:class:`DualVariableCallback`, saved in every checkpoint).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import ExportableState

from ..base.losses import LossDenominators, answer_mask
from ..base.pairing import RETAIN_PREFIX
from ..base.trainer import UnlearningTrainer
from .config import PDUConfig
from .loss import dual_update, pdu_forget_loss, pdu_loss


class DualVariableCallback(TrainerCallback, ExportableState):
    """PDU's dual variable ``w`` (the retain weight): after each optimizer step that began at or after
    ``warmup_epochs`` epochs, ``w = max(0, w + step_size * (L_retain - eps))``, with ``L_retain`` from
    ``take_step_loss`` (attached by the trainer; ``None`` when the step had none)."""

    def __init__(self, weight: float, eps: float, step_size: float, warmup_epochs: float) -> None:
        self.initial_weight = float(weight)
        self.weight = float(weight)
        self.eps = float(eps)
        self.step_size = float(step_size)
        self.warmup_epochs = float(warmup_epochs)
        self.updates = 0
        self.armed = False
        self.take_step_loss: Callable[[], float | None] | None = None

    def state(self) -> dict:
        return {
            "args": {"weight": self.initial_weight, "eps": self.eps, "step_size": self.step_size,
                     "warmup_epochs": self.warmup_epochs},
            "attributes": {"weight": self.weight, "updates": self.updates},
        }

    def load_state(self, state: dict) -> None:
        for key, value in state.get("attributes", {}).items():
            setattr(self, key, value)

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self.armed = float(state.epoch or 0.0) >= self.warmup_epochs

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        value = self.take_step_loss() if self.take_step_loss is not None else None
        if self.armed and value is not None and self.step_size > 0:
            self.weight = dual_update(self.weight, value, self.eps, self.step_size)
            self.updates += 1


class PDUTrainer(UnlearningTrainer):
    """PDU (Entesari et al. 2025): primal-dual descent on ``forget_weight * L_forget + w * (L_retain - eps)``
    (:func:`~hf_unlearn.methods.pdu.loss.pdu_loss`), the dual variable ``w`` (:attr:`dual_weight`, starting at
    ``retain_weight``) updated after each optimizer step past the warm-up.

    Private ``Trainer`` method overridden, because no public hook does the job: ``_load_callback_state`` (``w`` is
    restored on resume whatever ``restore_callback_states_from_checkpoint`` says)."""

    _name = "PDU"
    _method = "pdu"
    _title = "PDU (Primal-Dual Unlearning)"
    _paper: ClassVar[dict[str, str]] = {
        "title": "Constrained Entropic Unlearning: A Primal-Dual Framework for Large Language Models",
        "id": "2506.05314"}
    _cli_help = "flatten forget logits under a retain-loss bound (dual retain weight)"
    _tag_names = [*UnlearningTrainer._tag_names, "pdu"]
    config_class = PDUConfig

    def _finish_init(self) -> None:
        self._step_retain_loss: torch.Tensor | None = None
        self.dual = DualVariableCallback(self.args.retain_weight, self.args.retain_loss_eps,
                                         self.args.dual_step_size, self.args.dual_warmup_epochs)
        self.dual.take_step_loss = self._take_step_retain_loss
        self.add_callback(self.dual)

    @classmethod
    def needs_retain(cls, args: PDUConfig) -> bool:
        return True

    @classmethod
    def needs_reference_model(cls, args: PDUConfig) -> bool:
        return args.retain_loss == "kl"

    @property
    def dual_weight(self) -> float:
        """The current dual variable ``w`` (the retain weight of the next step)."""
        return self.dual.weight

    def _take_step_retain_loss(self) -> float | None:
        value, self._step_retain_loss = self._step_retain_loss, None
        return None if value is None else self._mean_over_processes(value)

    def _load_callback_state(self) -> None:
        super()._load_callback_state()
        self.dual = self._restore_callback(self.dual)
        self.dual.take_step_loss = self._take_step_retain_loss

    def compute_unlearning_loss(
        self, model: Any, inputs: dict[str, Any], denominators: LossDenominators
    ) -> torch.Tensor:
        """:func:`~hf_unlearn.methods.pdu.loss.pdu_loss` of one micro-batch, ``eps`` weighted by the micro-batch's
        share of the step's retain tokens so that the micro-batches add up to the step's Lagrangian."""
        forget = self.score(model, inputs)
        self.log_metric("forget_nll", forget.mean_nll)
        forget_term = pdu_forget_loss(forget.logits, forget.labels, denominators.forget_tokens)
        self.log_metric("forget_loss", forget_term)
        retain_term = self.retain_term(model, inputs, denominators)
        share = 0.0
        if RETAIN_PREFIX + "labels" in inputs:
            local = answer_mask(inputs[RETAIN_PREFIX + "labels"]).sum().float()
            share = float(local / denominators.retain_tokens.clamp(min=1e-12))
            if self.in_training_step:
                done = retain_term.detach().float()
                self._step_retain_loss = done if self._step_retain_loss is None else self._step_retain_loss + done
        self.log_metric("dual_weight", self.dual.weight)
        return pdu_loss(forget_term, retain_term, self.dual.weight, self.args.retain_loss_eps * share,
                        self.args.forget_weight)
