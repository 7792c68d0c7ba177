"""MASC (Margin Self-Correction): a trainer that unlearns by pushing down restricted margins and stops by itself.

The loss is the hinge of :func:`hf_unlearn.losses.margin_hinge_loss` on forget answer tokens plus
``lambda * KL(pi_0 || pi_theta)`` on retain answer tokens; :class:`MarginStoppingCallback` scores a held-out
slice of the forget set every ``check_every`` steps and sets ``control.should_training_stop`` at the first
check where the violation rate is ``<= alpha``. The rule, its history and the stop step are logged and
saved as ``masc_stopping.json`` beside the weights.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from datasets import Dataset
from transformers import PreTrainedModel, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from ...losses import (
    answer_mask,
    kl_retain_loss,
    margin_hinge_loss,
    masc_probability_from_threshold,
    masc_violation_counts,
    restricted_margin,
)
from ..unlearning_trainer import (
    MODEL_COLUMNS,
    RETAIN_PREFIX,
    LossDenominators,
    UnlearningTrainer,
    to_trl_format,
)
from .config import MASCConfig

logger = logging.getLogger(__name__)

STOPPING_FILE = "masc_stopping.json"


class MarginStoppingCallback(TrainerCallback):
    """Online stopping rule of MASC.

    Every ``check_every`` optimizer steps the model scores the held-out forget batches (never trained on); the
    violation rate is ``|{t : m_t > tau}| / |T|`` over their answer positions ``T``. Training stops
    (``control.should_training_stop = True``) at the first check where the rate is ``<= alpha``.

    Attributes:
        violation_history: one ``{"step", "violation_rate", "violations", "positions"}`` per measurement
            (step 0 is the starting model, measured at train begin, and is not a check).
        stopped_at_step: the global step at which the rule fired, or ``None``.
        budget_exhausted: ``True`` when training ended (step budget) without the rule firing.
    """

    def __init__(
        self,
        validation_batches: Sequence[dict[str, torch.Tensor]],
        *,
        top_k: int,
        margin_beta: float,
        tau: float,
        alpha: float,
        check_every: int,
    ) -> None:
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"stop_tolerance (alpha) must lie in (0, 1), got {alpha}.")
        if check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {check_every}.")
        if not validation_batches:
            raise ValueError("MarginStoppingCallback needs at least one held-out batch.")
        self.validation_batches = list(validation_batches)
        self.top_k = int(top_k)
        self.margin_beta = float(margin_beta)
        self.tau = float(tau)
        self.alpha = float(alpha)
        self.check_every = int(check_every)
        self.violation_history: list[dict[str, float | int]] = []
        self.stopped_at_step: int | None = None
        self.budget_exhausted = False
        self.max_steps: int | None = None
        self.pending_logs: dict[str, float] = {}

    @torch.no_grad()
    def measure(self, model: Any) -> tuple[int, int]:
        """``(violating positions, answer positions)`` of the held-out slice under ``model`` (eval mode)."""
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        violations = positions = 0
        try:
            for batch in self.validation_batches:
                batch = {k: v.to(device) for k, v in batch.items()}
                logits = model(
                    input_ids=batch["input_ids"],
                    attention_mask=batch["attention_mask"],
                    position_ids=batch.get("position_ids"),
                ).logits
                margins, mask = restricted_margin(logits, batch["labels"], self.top_k, self.margin_beta)
                v, n = masc_violation_counts(margins, mask, self.tau)
                violations += v
                positions += n
        finally:
            if was_training:
                model.train()
        return violations, positions

    def _record(self, model: Any, step: int) -> float:
        violations, positions = self.measure(model)
        rate = violations / positions
        self.violation_history.append(
            {"step": int(step), "violation_rate": rate, "violations": violations, "positions": positions}
        )
        self.pending_logs = {"masc/violation_rate": rate}
        return rate

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self.max_steps = int(state.max_steps)
        if not self.violation_history:
            self._record(kwargs["model"], state.global_step)
            self.pending_logs = {}
        return control

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if state.global_step % self.check_every != 0 or self.stopped_at_step is not None:
            return control
        rate = self._record(kwargs["model"], state.global_step)
        control.should_log = True
        if rate <= self.alpha:
            self.stopped_at_step = int(state.global_step)
            self.pending_logs["masc/stopped_at_step"] = float(state.global_step)
            control.should_training_stop = True
            logger.info(
                "MASC stopping rule fired at step %d: held-out violation rate %.4f <= alpha = %.4f.",
                state.global_step, rate, self.alpha,
            )
        return control

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if self.stopped_at_step is None:
            if not self.violation_history or self.violation_history[-1]["step"] != state.global_step:
                self._record(kwargs["model"], state.global_step)
                self.pending_logs = {}
            self.budget_exhausted = True
            last = self.violation_history[-1]["violation_rate"]
            warnings.warn(
                f"MASC hit its step budget ({state.global_step} steps) before the stopping rule fired: the held-out "
                f"violation rate is {last:.4f} > alpha = {self.alpha}. Raise max_steps or the learning rate, or "
                "loosen the threshold (tau) or the tolerance (alpha).",
                stacklevel=2,
            )
        return control

    def summary(self) -> dict[str, Any]:
        """The rule, its history and the outcome, as saved in ``masc_stopping.json``."""
        return {
            "rule": {
                "description": "stop at the first check where the held-out violation rate "
                "|{t: m_t > tau}| / |T| is <= alpha",
                "margin": "m_t = beta * z(y_t|c_t) - logsumexp_{v in top-k \\ {y_t}} beta * z(v|c_t)",
                "top_k": self.top_k,
                "margin_beta": self.margin_beta,
                "tau": self.tau,
                "rho": masc_probability_from_threshold(self.tau),
                "alpha": self.alpha,
                "check_every": self.check_every,
                "validation_positions": self.violation_history[0]["positions"] if self.violation_history else None,
            },
            "stopped_at_step": self.stopped_at_step,
            "stopped_by_rule": self.stopped_at_step is not None,
            "budget_exhausted": self.budget_exhausted,
            "max_steps": self.max_steps,
            "violation_history": list(self.violation_history),
        }

    def save(self, output_dir: str | os.PathLike) -> str:
        """Write :meth:`summary` to ``output_dir/masc_stopping.json``; returns the path."""
        os.makedirs(output_dir, exist_ok=True)
        path = os.path.join(output_dir, STOPPING_FILE)
        with open(path, "w") as f:
            json.dump(self.summary(), f, indent=2)
        return path


class MASCTrainer(UnlearningTrainer):
    """MASC (Margin Self-Correction) unlearning trainer, a TRL ``SFTTrainer`` subclass that stops by itself.

    Loss of a step: ``(1/N_f) sum_t max(0, m_t - tau)`` over forget answer tokens (:func:`~hf_unlearn.losses.
    restricted_margin`, :func:`~hf_unlearn.losses.margin_hinge_loss`) plus ``kl_weight * KL(pi_0 || pi_theta)``
    over retain answer tokens, ``pi_0`` the frozen starting model (the base's reference model, or the disabled
    adapter under PEFT). A held-out slice of the forget set (``validation_fraction``, drawn with ``args.seed``) is
    removed from training and scored every ``check_every`` steps by :class:`MarginStoppingCallback`; training stops
    at the first check where its violation rate is ``<= stop_tolerance``, else at the ``max_steps`` budget (with a
    warning). ``stopped_at_step`` and ``violation_history`` report the outcome; :meth:`save_model` writes
    ``masc_stopping.json`` (rule, history, stop step) beside the weights.

    Example::

        trainer = MASCTrainer(model, MASCConfig("out", top_k=10, margin_threshold=0.0, stop_tolerance=0.05,
                                                kl_weight=1.0, validation_fraction=0.1),
                              train_dataset=forget, retain_dataset=retain, processing_class=tokenizer)
        trainer.train()            # stops by itself
        trainer.stopped_at_step, trainer.violation_history
    """

    _tag_names = ["trl", "hf-unlearn", "unlearning", "masc"]
    _name = "MASC"
    config_class = MASCConfig
    default_hyperparameters: ClassVar[dict[str, float]] = {"gamma": 1.0, "alpha": 1.0}

    def __init__(
        self,
        model: str | PreTrainedModel,
        args: MASCConfig | None = None,
        data_collator: Callable | None = None,
        train_dataset: Dataset | Sequence[dict[str, Any]] | None = None,
        retain_dataset: Dataset | Sequence[dict[str, Any]] | None = None,
        eval_dataset: Dataset | dict[str, Dataset] | None = None,
        processing_class: Any = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        optimizer_cls_and_kwargs: tuple | None = None,
        quantization_config: Any = None,
        peft_config: Any = None,
    ):
        if args is not None and not isinstance(args, MASCConfig):
            raise TypeError(f"MASCTrainer needs a MASCConfig, got {type(args).__name__}.")
        args = self._resolve_args(args, model)
        if train_dataset is None:
            raise ValueError("`train_dataset` (the forget set) is required.")
        forget = train_dataset if isinstance(train_dataset, Dataset) else Dataset.from_list(list(train_dataset))
        train_part, held_out = split_validation(forget, args.validation_fraction, args.seed)

        super().__init__(
            model=model,
            args=args,
            data_collator=data_collator,
            train_dataset=train_part,
            retain_dataset=retain_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
            optimizer_cls_and_kwargs=optimizer_cls_and_kwargs,
            quantization_config=quantization_config,
            peft_config=peft_config,
        )
        vocab = self.model.get_output_embeddings().weight.shape[0]
        if self.args.top_k > vocab - 1:
            raise ValueError(
                f"top_k={self.args.top_k} is larger than the vocabulary allows: at most vocab_size - 1 = {vocab - 1} "
                "rival tokens exist."
            )

        # The held-out slice, tokenized exactly like the training forget set
        validation = to_trl_format(held_out, self.processing_class)
        if not self._skip_prepare_dataset:
            validation = self._prepare_dataset(
                validation, self.processing_class, self.args, False, None, "MASC validation"
            )
        rows = [{k: validation[i][k] for k in MODEL_COLUMNS} for i in range(len(validation))]
        positions = sum(int(answer_mask(torch.tensor([r["labels"]])).sum()) for r in rows)
        needed = self.args.min_validation_size
        if positions < needed:
            raise ValueError(
                f"The held-out validation slice ({len(held_out)} of {len(forget)} forget examples) has {positions} "
                f"answer positions; the stopping rule needs at least {needed} (max(min_validation_positions="
                f"{self.args.min_validation_positions}, ceil(1/stop_tolerance))) to measure a violation rate. Raise "
                "validation_fraction or use a larger forget set."
            )
        batch_size = self.args.per_device_eval_batch_size
        batches = [self.data_collator(rows[i : i + batch_size]) for i in range(0, len(rows), batch_size)]
        self.validation_dataset = validation
        self.stopping_callback = MarginStoppingCallback(
            batches,
            top_k=self.args.top_k,
            margin_beta=self.args.margin_beta,
            tau=self.args.tau,
            alpha=self.args.stop_tolerance,
            check_every=self.args.check_every,
        )
        self.add_callback(self.stopping_callback)

    # ----- configuration -----------------------------------------------------------------------------------------

    @classmethod
    def needs_retain(cls, args: MASCConfig) -> bool:
        """The retain set is used for the KL term, so only when ``kl_weight > 0``."""
        return args.kl_weight > 0

    @classmethod
    def needs_reference_model(cls, args: MASCConfig) -> bool:
        """``KL(pi_0 || pi_theta)`` needs the frozen starting model ``pi_0``."""
        return args.kl_weight > 0

    # ----- outcome -----------------------------------------------------------------------------------------------

    @property
    def stopped_at_step(self) -> int | None:
        """Global step at which the stopping rule fired (``None`` if it has not, e.g. the budget was hit)."""
        return self.stopping_callback.stopped_at_step

    @property
    def violation_history(self) -> list[dict[str, float | int]]:
        """``[{"step", "violation_rate", "violations", "positions"}, ...]``; step 0 is the starting model."""
        return self.stopping_callback.violation_history

    # ----- the loss ----------------------------------------------------------------------------------------------

    def compute_unlearning_loss(
        self, model: Any, inputs: dict[str, Any], denominators: LossDenominators
    ) -> torch.Tensor:
        args = self.args
        forget = self.score(model, inputs)
        margins, mask = restricted_margin(forget.logits, forget.labels, args.top_k, args.margin_beta)
        loss = margin_hinge_loss(margins, mask, args.tau, denominators.forget_tokens)
        self.log_metric("masc_hinge", loss)
        self.log_metric("forget_nll", forget.mean_nll)
        violations, positions = masc_violation_counts(margins.detach(), mask, args.tau)
        self.log_metric("forget_violation_rate", violations / max(positions, 1))
        if args.kl_weight > 0 and RETAIN_PREFIX + "input_ids" in inputs:
            retain = self.score(model, inputs, RETAIN_PREFIX)
            reference = self.reference_scores(inputs, RETAIN_PREFIX)
            kl = kl_retain_loss(retain.logits, reference.logits, retain.labels, denominators.retain_tokens)
            self.log_metric("retain_kl", kl)
            self.log_metric("retain_nll", retain.mean_nll)
            loss = loss + args.kl_weight * kl
        return loss

    # ----- logging and saving ------------------------------------------------------------------------------------

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        callback = getattr(self, "stopping_callback", None)
        if callback is not None and callback.pending_logs and self.model.training:
            logs.update(callback.pending_logs)
            callback.pending_logs = {}
        super().log(logs, start_time)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the model (as the Trainer does) and ``masc_stopping.json`` beside the weights."""
        super().save_model(output_dir, _internal_call)
        if self.args.should_save and getattr(self, "stopping_callback", None) is not None:
            self.stopping_callback.save(output_dir or self.args.output_dir)


def split_validation(forget: Dataset, fraction: float, seed: int) -> tuple[Dataset, Dataset]:
    """Split the forget set into (training part, held-out slice): ``max(1, round(fraction * n))`` examples drawn
    with ``seed`` are held out, and at least one example is left to train on."""
    n = len(forget)
    if n < 2:
        raise ValueError(
            f"The forget set has {n} example(s): MASC holds out part of it to decide when to stop and trains on the "
            "rest, so it needs at least 2."
        )
    held = min(n - 1, max(1, round(fraction * n)))
    order = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed))).tolist()
    held_idx = sorted(order[:held])
    train_idx = sorted(order[held:])
    return forget.select(train_idx), forget.select(held_idx)
